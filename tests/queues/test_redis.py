"""What only the Redis backend promises: one Cluster slot per queue, and a registry of names."""

from __future__ import annotations

from django.conf import settings
from redis.crc import key_slot

from queues.backends import redis as backend
from queues.backends.redis import REGISTRY_KEY, RedisFIFO, is_known_queue, known_queues


def test_every_key_of_a_queue_shares_one_cluster_slot(django_redis):
    queue = RedisFIFO("commands")
    assert all(key.startswith("ankusa:queue:{commands}:") for key in queue.keys)
    assert len({key_slot(key.encode()) for key in queue.keys}) == 1


def test_enqueue_registers_the_queue_name(django_redis):
    RedisFIFO("mail").enqueue("m")
    RedisFIFO("commands").enqueue("c")
    assert known_queues() == ["commands", "mail"]
    assert is_known_queue("mail") and not is_known_queue("jobs")


def test_a_process_records_a_queue_name_once_a_while_not_at_each_enqueue(django_redis, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(backend, "_clock", lambda: now[0])
    monkeypatch.setattr(backend, "_registered", {})
    queue = RedisFIFO("mail")
    queue.enqueue("first")
    django_redis.srem(REGISTRY_KEY, "mail")  # by hand: the next enqueues do not look
    now[0] += backend.REGISTER_EVERY_S - 1
    queue.enqueue("within the interval")
    assert not is_known_queue("mail")
    now[0] += 1
    queue.enqueue("after it")
    assert is_known_queue("mail")
    assert [item.payload for item in queue.claim(3)] == ["first", "within the interval", "after it"]


def test_an_emptied_redis_has_the_queue_name_again_at_the_next_enqueue(django_redis, monkeypatch):
    monkeypatch.setattr(backend, "_clock", lambda: 1000.0)
    monkeypatch.setattr(backend, "_registered", {})
    RedisFIFO("mail").enqueue("before")
    django_redis.flushdb()  # a Redis restarted without persistence: the registry went with it
    assert RedisFIFO("mail").enqueue("after") == [1]
    assert known_queues() == ["mail"]


def test_an_enqueue_after_a_script_flush_loads_the_script_and_enqueues_once(private_redis, monkeypatch):
    """A restarted Redis forgets its scripts: NOSCRIPT on either way (with the registry or not).
    On a Redis of the test's own: the shared one's scripts serve other runs."""
    now = [1000.0]
    monkeypatch.setattr(backend, "_clock", lambda: now[0])
    monkeypatch.setattr(backend, "_registered", {})
    client = private_redis.client()
    queue = RedisFIFO("mail", client=client)
    client.script_flush()
    queue.enqueue("registered with it")  # the pipeline's way: the registry is due
    client.script_flush()
    queue.enqueue("alone")  # the script alone
    assert [item.payload for item in queue.claim(3)] == ["registered with it", "alone"]
    assert client.smembers(REGISTRY_KEY) == {b"mail"}


def test_an_enqueue_leaves_one_wake_token_whatever_its_items(django_redis):
    queue = RedisFIFO("mail")
    queue.enqueue("x", "y")
    assert django_redis.lrange(queue.wake_key, 0, -1) == [b"1"]  # one token, whatever the items
    assert queue.wait_for_work(0) and not queue.wait_for_work(0)


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


def test_a_dropped_waiting_item_stays_in_main_as_a_counted_tombstone_until_claimed(django_redis):
    """Dropping from main costs no LREM: the id stays, counted in ``dropped``, and claims pop it;
    a drop at the head pops its tombstones at once."""
    queue = RedisFIFO("commands")
    ids = queue.enqueue(*range(5))
    main, dropped = queue.keys[0], queue.keys[5]
    assert queue.drop_ids([ids[2], ids[3]]) == 2
    assert (django_redis.llen(main), int(django_redis.get(dropped)), queue.length("main")) == (5, 2, 3)
    assert queue.drop_ids([ids[0]]) == 1
    assert (django_redis.llen(main), int(django_redis.get(dropped))) == (4, 2)
    assert [item.payload for item in queue.claim(2)] == [1, 4]
    assert (django_redis.llen(main), int(django_redis.get(dropped)), queue.length("main")) == (0, 0, 0)
    assert queue.drop_ids([queue.enqueue("x")[0]]) == 1
    assert (django_redis.llen(main), int(django_redis.get(dropped))) == (0, 0)


def test_a_record_that_vanished_another_way_never_makes_the_tombstone_count_negative(django_redis):
    """A waiting id whose record is gone without a drop (a key evicted or deleted by hand) is popped
    like a tombstone by the next claim, but was never counted: ``dropped`` stays at zero instead of
    going below it, which would make main look longer than it is."""
    queue = RedisFIFO("commands")
    ids = queue.enqueue(*range(4))
    main, items, dropped = queue.keys[0], queue.keys[3], queue.keys[5]
    django_redis.hdel(items, str(ids[0]))
    assert [item.payload for item in queue.claim(1)] == [1]
    assert int(django_redis.get(dropped) or 0) == 0
    assert (django_redis.llen(main), queue.length("main")) == (2, 2)
    django_redis.hdel(items, str(ids[2]))
    assert queue.drop_ids([ids[3]]) == 1  # the head's tombstones are popped at once
    assert int(django_redis.get(dropped) or 0) == 0
    assert (django_redis.llen(main), queue.length("main")) == (0, 0)


def test_peek_reads_past_a_long_run_of_tombstones(django_redis):
    queue = RedisFIFO("commands")
    ids = queue.enqueue(*range(300))
    assert queue.drop_ids(ids[1:299]) == 298
    assert [item.payload for item in queue.peek("main", 1)] == [0]
    assert [item.payload for item in queue.peek("main", 5)] == [0, 299]
    assert queue.length("main") == 2


def lranges(client, queue: RedisFIFO, action) -> list[list[str]]:
    """The LRANGE calls ``action()`` makes on ``queue``'s keys, seen through Redis's MONITOR."""
    end = f"test:end-of:{queue.name}"
    seen = []
    with client.monitor() as monitor:
        action()
        client.set(end, 1)
        while True:
            command = monitor.next_command()
            if command["db"] != settings.TEST_REDIS_DB:
                continue  # another checkout's tests on the same Redis
            words = command["command"].split()
            if end in words:
                return seen
            if words[0] == "LRANGE" and words[1] == queue.keys[0]:
                seen.append(words[2:])


def test_peek_reads_what_it_wants_and_widens_only_past_tombstones(django_redis, redis_client):
    queue = RedisFIFO("peeked")
    ids = queue.enqueue(*range(300))
    assert lranges(redis_client, queue, lambda: queue.peek("main", 1)) == [["0", "0"]]
    assert lranges(redis_client, queue, lambda: queue.peek("main", 3)) == [["0", "2"]]
    queue.drop_ids(ids[2:150])
    assert [item.payload for item in queue.peek("main", 3)] == [0, 1, 150]
    assert lranges(redis_client, queue, lambda: queue.peek("main", 3)) == [
        ["0", "2"],
        ["3", "102"],
        ["103", "202"],
    ]
