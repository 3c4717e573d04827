"""What only the Redis backend promises: one Cluster slot per queue, and a registry of names."""

from __future__ import annotations

from redis.crc import key_slot

from queues.backends.redis import RedisFIFO, known_queues


def test_every_key_of_a_queue_shares_one_cluster_slot(django_redis):
    queue = RedisFIFO("commands")
    assert all(key.startswith("ankusa:queue:{commands}:") for key in queue.keys)
    assert len({key_slot(key.encode()) for key in queue.keys}) == 1


def test_enqueue_registers_the_queue_name(django_redis):
    RedisFIFO("mail").enqueue("m")
    RedisFIFO("commands").enqueue("c")
    assert known_queues() == ["commands", "mail"]


def test_the_busy_set_is_a_skiplist_from_the_first_claim(django_redis):
    """A small sorted set would be a listpack, searched linearly by ZADD and ZMSCORE."""
    queue = RedisFIFO("commands")
    queue.enqueue(*range(5))
    items = queue.claim(5)
    assert django_redis.object("encoding", queue.keys[1]) == b"skiplist"
    assert queue.done(items[3]) == 1
    busy = django_redis.zrangebyscore(queue.keys[1], "-inf", "(+inf")
    assert [int(pk) for pk in busy] == [items[i].id for i in (0, 1, 2, 4)]
    assert queue.length("busy") == 4
