"""The Redis backend of the reliable FIFO: Lua scripts (``queues.backends.redis_scripts``) over one
hash-tagged set of keys per queue.

Keys of queue ``q`` (all carry the hash tag ``{q}``, so they live in one Redis Cluster slot and
every script may touch them all)::

    ankusa:queue:{q}:main    list of item ids, head first            claim: LPOP n
    ankusa:queue:{q}:busy    sorted set id -> claim time (µs)        done/expiry: O(log busy)
    ankusa:queue:{q}:failed  list of ids in the order they failed
    ankusa:queue:{q}:items   hash id -> record: "enqueued_us:claims_ended:requeues:fails:
                             failed_us:error_length:" + error + payload JSON
    ankusa:queue:{q}:seq     the last id handed out (ids are never reused, even after a flush)
    ankusa:queue:{q}:dropped how many ids in main have no record any more (dropped by an operator)

    ankusa:queue:{q}:wake    a list of one token at most: pushed when items enter main,
                             popped by a waiting consumer (``wait_for_work``, BLPOP)

plus ``ankusa:queues``, the set of queue names, for the admin and ``manage.py queues stats``: a
process adds a queue's name at its first enqueue to it, then with one enqueue every
``REGISTER_EVERY_S``, and at once when an enqueue finds the sequence new (an emptied Redis). A
name deleted from it by hand comes back within that time.

Every operation that reads and writes is one script, so it is atomic: two consumers can never pop
the same id. A claim is LPOP + HMGET + ZADD, a done ZMSCORE + ZREM + HDEL, whatever the batch size;
``done`` and recovery use the busy sorted set by member and by score range, never a scan of busy
(the seed's list design, ``RPOPLPUSH`` + ``LREM``, slows down linearly with the busy list). A
claim's token is its claim time (the busy score, to the microsecond): done/requeue/fail/unclaim of
an ``Item`` act only while the busy score is still that claim's, so a claim that expired and was
taken over cannot be finished twice. Times come from the caller's clock, passed into the scripts
as microseconds, so tests can move time and every backend reads the same clock. An operator's
``drop_ids`` leaves a dropped id that waits in main as a tombstone (see ``DROP_IDS``).

What it does NOT do: survive a Redis that loses writes (persistence and replication are the Redis
operator's choice; with ``appendfsync everysec`` a crash loses up to a second of queue changes);
``requeue_failed`` reads the whole failed list in one script (an operator's action);
``claim(wait=...)`` polls.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, transaction
from django_redis import get_redis_connection
from redis.exceptions import NoScriptError

from queues.backends.redis_scripts import SHAS, SOURCES
from queues.fifo import (
    Action,
    Item,
    Kind,
    ReliableFIFO,
    clip_error,
    encode_payload,
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
REGISTRY_KEY = "ankusa:queues"
# How often a process records a queue it enqueues to in the registry, at most: its first enqueue,
# then with one enqueue each this many seconds — and at once after one that starts a new sequence
# (an emptied Redis). By process memory: (queue name, connection pool) -> when it last did.
REGISTER_EVERY_S = 60.0
_registered: dict[tuple[str, int], float] = {}
_clock = time.monotonic  # moved by the tests
# Items moved per script by recovery and failed-list removal, so no script holds Redis for long.
BATCH = 1000
# A claim's token is its claim time in µs. Two claims of one item in the same microsecond would share
# one: a real clock does not produce them, nodes whose clocks disagree only by coincidence.
# The token of an Item that is not under a claim (peeked from main or failed): matches no claim.
NO_CLAIM = -1

# The longest single BLPOP of ``wait_for_work``: below the connection pool's socket timeout.
WAIT_STEP_S = 1.0


def micros(moment: datetime) -> int:
    """A datetime as whole microseconds since the epoch (exact, unlike a float timestamp)."""
    return (moment - EPOCH) // timedelta(microseconds=1)


def from_micros(value: int | bytes | str) -> datetime:
    return EPOCH + timedelta(microseconds=int(float(value)))


class RedisFIFO(ReliableFIFO):
    backend = "redis"

    def __init__(self, name: str, *, client=None, **options: Any):
        super().__init__(name, **options)
        self.redis = client if client is not None else get_redis_connection("redis")
        prefix = f"ankusa:queue:{{{name}}}:"
        self.keys = [prefix + part for part in ("main", "busy", "failed", "items", "seq", "dropped")]
        self.wake_key = prefix + "wake"  # not among the scripts' keys: pushed beside them (queues.wake)

    def _run(self, script: str, *args: Any) -> Any:
        """EVALSHA straight through the client (redis-py's Script wrapper costs a third of a round
        trip in Python); on NOSCRIPT (a restarted or failed-over Redis) load the script and retry."""
        command = ("EVALSHA", SHAS[script], len(self.keys), *self.keys, *args)
        try:
            return self.redis.execute_command(*command)
        except NoScriptError:
            self.redis.script_load(SOURCES[script])
            return self.redis.execute_command(*command)

    # --- producers ----------------------------------------------------------------------------------

    def enqueue(self, *payloads: Any) -> list[int]:
        encoded = [encode_payload(payload) for payload in payloads]
        if not encoded:
            return []
        keys = (*self.keys, self.wake_key)  # the script wakes a waiting consumer itself
        command = ("EVALSHA", SHAS["enqueue"], len(keys), *keys, micros(self.clock()), *encoded)
        try:
            first = self._enqueue(command)
        except NoScriptError:  # nothing was enqueued: the script did not run
            self.redis.script_load(SOURCES["enqueue"])
            first = self._enqueue(command)
        if first == 1:  # a new sequence: a Redis that was emptied, whose registry went with it
            self.redis.sadd(REGISTRY_KEY, self.name)
        return list(range(first, first + len(encoded)))

    def joins_transaction(self, using: str = DEFAULT_DB_ALIAS) -> bool:
        return False  # not the database: written after the caller's commit

    def _enqueue(self, command: tuple) -> Any:
        """Run the enqueue script, with the queue's name recorded in the registry in the same round
        trip when this process has not done so for ``REGISTER_EVERY_S``. (The registry's key is in
        another Cluster slot than the queue's, so it cannot join the script; a pipeline around
        every enqueue cost the client more CPU than the script's own call: ``bench/queues.py``,
        ``redis_enqueue_vs_ping_cpu``.)"""
        due = (self.name, id(self.redis.connection_pool))
        now = _clock()
        if _registered.get(due, -REGISTER_EVERY_S) + REGISTER_EVERY_S > now:
            return self.redis.execute_command(*command)
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.sadd(REGISTRY_KEY, self.name)
            pipe.execute_command(*command)
            first = pipe.execute()[1]
        _registered[due] = now
        return first

    # --- waking consumers (queues.wake) -------------------------------------------------------------

    def _push_wake(self, pipe) -> None:
        # One token at most: a waiter needs one, and a producer nobody waits for costs no memory.
        # The enqueue script pushes the same token itself (redis_scripts.ENQUEUE): keep them alike.
        pipe.lpush(self.wake_key, 1)
        pipe.ltrim(self.wake_key, 0, 0)

    def _wake_now(self) -> None:
        with self.redis.pipeline(transaction=False) as pipe:
            self._push_wake(pipe)
            pipe.execute()

    def wake(self) -> None:
        # After the caller's database transaction, if any, like the enqueues of this backend.
        transaction.on_commit(self._wake_now)

    def wait_for_work(self, timeout: float) -> bool:
        if timeout <= 0:  # a look
            return self.redis.lpop(self.wake_key) is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            # In steps shorter than the pool's socket timeout; Redis takes fractions of seconds.
            step = min(max(left, 0.01), WAIT_STEP_S)
            if self.redis.blpop([self.wake_key], timeout=step) is not None:
                return True
            if left <= step:
                return False

    # --- consumers ----------------------------------------------------------------------------------

    def _claim(self, n: int, now: datetime) -> list[Item]:
        return _claimed(self._run("claim", micros(now), n), now)

    def done(self, *items: Item | int) -> int:
        tokens = _tokens(items)
        if not tokens:
            return 0
        held = self._run("done", _spec(tokens))
        self._report_skipped("done", list(tokens), [int(pk) for pk in held])
        return len(held)

    def done_and_claim(self, *items: Item | int, n: int = 1, wait: float = 0) -> list[Item]:
        """``done(*items)`` and ``claim(n)`` in one round trip (one script)."""
        tokens = _tokens(items)
        if not tokens:
            return self.claim(n, wait)
        now = self.clock()
        held, found = self._run("done_and_claim", micros(now), n, _spec(tokens))
        self._report_skipped("done", list(tokens), [int(pk) for pk in held])
        claimed = _claimed(found, now)
        return claimed if claimed or wait <= 0 else self.claim(n, wait)

    def _release(self, mode: str, items, *, error: str = "", front: bool = False) -> int:
        tokens = _tokens(items)
        if not tokens:
            return 0
        args = (micros(self.clock()), mode, "1" if front else "0", self.requeue_limit, clip_error(error))
        held = [int(pk) for pk in self._run("release", *args, _spec(tokens))]
        self._report_skipped(mode, list(tokens), held)
        if held and mode != "fail":  # back in main (or past the limit, failed: a wake for nothing)
            self._wake_now()
        return len(held)

    # --- recovery and the failed list ---------------------------------------------------------------

    def _handle_expired(
        self, older_than: timedelta | None, action: Action, *, limit: int | None
    ) -> list[Item]:
        now = self.clock()
        older_than = self.visibility_timeout if older_than is None else older_than
        error = f"claim expired (held longer than {older_than.total_seconds():g} s)"
        touched: list[Item] = []
        while limit is None or len(touched) < limit:
            size = BATCH if limit is None else min(BATCH, limit - len(touched))
            args = (micros(now), action, micros(now - older_than), self.requeue_limit, error, size)
            found = self._run("expire", *args)
            touched.extend(_peeked(found))
            if len(found) < 3 * size:
                break
        if touched and action == "requeue":
            self._wake_now()
        return touched

    def requeue_failed(
        self, max_fail_count: int | None = None, delay: timedelta | None = None, *, limit: int | None = None
    ) -> int:
        cutoff = "" if delay is None else micros(self.clock() - delay)
        moved = self._run(
            "requeue_failed", "" if max_fail_count is None else max_fail_count, cutoff, limit or 0
        )
        if moved:
            self._wake_now()
        return moved

    def remove_failed(self, older_than: timedelta | None = None, *, limit: int | None = None) -> int:
        cutoff = "" if older_than is None else micros(self.clock() - older_than)
        removed = 0
        while limit is None or removed < limit:
            size = BATCH if limit is None else min(BATCH, limit - removed)
            count = self._run("remove_failed", cutoff, size)
            removed += count
            if count < size:
                break
        return removed

    # --- operator actions on chosen items (the admin's requeue / drop) -------------------------------

    def requeue_ids(self, ids: Iterable[int]) -> int:
        ids = [int(pk) for pk in ids]
        moved = self._run("requeue_ids", *ids) if ids else 0
        if moved:
            self._wake_now()
        return moved

    def drop_ids(self, ids: Iterable[int]) -> int:
        ids = [int(pk) for pk in ids]
        return self._run("drop_ids", *ids) if ids else 0

    # --- inspection ---------------------------------------------------------------------------------

    def length(self, kind: Kind = "main") -> int:
        if kind == "main":
            listed, dropped = self._run("main_length")  # one script: both numbers of one moment
            return max(listed - dropped, 0)
        busy, failed = self.keys[1:3]
        if kind == "busy":
            return self.redis.zcount(busy, "-inf", "(+inf")  # all but the sentinel
        return self.redis.llen(failed)

    def peek(self, kind: Kind = "main", n: int = 1) -> list[Item]:
        return _peeked(self._run("peek", kind, n))

    def flush(self) -> int:
        return self._run("flush")


def known_queues(client=None) -> list[str]:
    """Names of the queues that ever had an item enqueued on this Redis."""
    client = client if client is not None else get_redis_connection("redis")
    return sorted(name.decode() for name in client.smembers(REGISTRY_KEY))


def is_known_queue(name: str, client=None) -> bool:
    """Whether queue ``name`` ever had an item enqueued on this Redis (one SISMEMBER)."""
    client = client if client is not None else get_redis_connection("redis")
    return bool(client.sismember(REGISTRY_KEY, name))


def _tokens(items) -> dict[int, int | str]:
    """``{id: claim time in µs}`` in the given order, each item once; a bare id checks no claim."""
    tokens: dict[int, int | str] = {}
    stamps: dict[datetime, int] = {}  # the items of one claim share their claim time
    for item in items:
        if not isinstance(item, Item):
            tokens[int(item)] = ""
        elif item.claimed_at is None:
            tokens[item.id] = NO_CLAIM
        else:
            stamp = stamps.get(item.claimed_at)
            if stamp is None:
                stamp = stamps[item.claimed_at] = micros(item.claimed_at)
            tokens[item.id] = stamp
    return tokens


def _spec(tokens: dict[int, int | str]) -> str:
    """Items and their claim tokens as the scripts read them: ``"id:token id:token"``."""
    return " ".join(f"{pk}:{token}" for pk, token in tokens.items())


def _claimed(found: list[list[bytes]], now: datetime) -> list[Item]:
    """Items from a claim's ``[ids, records]``."""
    if not found:
        return []
    ids, records = found
    return _items(ids, records, [now] * len(ids))


def _peeked(found: list[bytes]) -> list[Item]:
    """Items from a flat ``id, record, claim time ('' when not busy)`` list."""
    moments = _Moments()
    claimed = [moments(score) if score else None for score in found[2::3]]
    return _items(found[0::3], found[1::3], claimed)


def _items(ids: list[bytes], records: list[bytes], claimed: list[datetime | None]) -> list[Item]:
    """Items from their records (see the module docstring), all payloads parsed in one call: this
    is most of a batch claim's time in Python."""
    moments = _Moments()
    fields = [record.split(b":", 6) for record in records]
    payloads = json.loads(b"[" + b",".join(_payload(field) for field in fields) + b"]")
    return [
        Item(
            int(pk),
            payload,
            moments(enqueued),
            claimed_at,
            int(requeues),
            int(fails),
            "" if length == b"0" else rest[: int(length)].decode("utf-8", "replace"),
            int(ended) + (claimed_at is not None),  # this claim's number, while it lasts
            None if failed == b"0" else moments(failed),
        )
        for pk, (enqueued, ended, requeues, fails, failed, length, rest), payload, claimed_at in zip(
            ids, fields, payloads, claimed, strict=True
        )
    ]


def _payload(field: list[bytes]) -> bytes:
    """The payload JSON of a split record: what follows the error text."""
    return field[6] if field[5] == b"0" else field[6][int(field[5]) :]


class _Moments(dict):
    """Microsecond timestamps to datetimes, each distinct value converted once (the items of one
    enqueue share theirs)."""

    def __missing__(self, raw: bytes) -> datetime:
        moment = self[raw] = from_micros(raw)
        return moment

    __call__ = dict.__getitem__
