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


def test_done_looks_items_up_in_the_busy_set_by_member(django_redis):
    queue = RedisFIFO("commands")
    queue.enqueue(*range(5))
    items = queue.claim(5)
    assert django_redis.type(queue.keys[1]) == b"zset"
    assert queue.done(items[3]) == 1
    assert [int(pk) for pk in django_redis.zrange(queue.keys[1], 0, -1)] == [
        items[i].id for i in (0, 1, 2, 4)
    ]
