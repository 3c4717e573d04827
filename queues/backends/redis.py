"""The Redis backend of the reliable FIFO: Lua scripts over one hash-tagged set of keys per queue.

Keys of queue ``q`` (all carry the hash tag ``{q}``, so they live in one Redis Cluster slot and
every script may touch them all)::

    ankusa:queue:{q}:main     list of item ids, head first            claim: LPOP n
    ankusa:queue:{q}:busy     sorted set id -> claim time (µs)        done/expiry: O(log busy)
    ankusa:queue:{q}:failed   list of ids in the order they failed
    ankusa:queue:{q}:payload  hash id -> payload JSON (never decoded by Redis)
    ankusa:queue:{q}:meta     hash id -> "enqueued_us:claims:requeues:fails:failed_us:last error"
    ankusa:queue:{q}:seq      the last id handed out (ids are never reused, even after a flush)

plus ``ankusa:queues``, the set of queue names, for the admin and ``manage.py queues stats``.

Every operation that reads and writes is one script, so it is atomic: two consumers can never pop
the same id, and done/requeue/recovery check "still busy under this claim" (busy score present,
``claims`` equal) in the same step that acts. ``done`` and recovery use the sorted set by member
and by score range, never a scan of busy: the seed's list design (``RPOPLPUSH`` + ``LREM``) slows
down linearly with the busy list, this does not.

Times (claim, failure, enqueue) come from the caller's clock, passed into the scripts as
microseconds, so tests can move time and every backend reads the same clock.

What it does NOT do: survive a Redis that loses writes (persistence and replication are the Redis
operator's choice; with ``appendfsync everysec`` a crash loses up to a second of queue changes);
``requeue_failed`` reads the whole failed list in one script (an operator's action; 100,000
failed items hold Redis for about a tenth of a second); ``claim(wait=...)`` polls.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from django_redis import get_redis_connection

from queues.fifo import (
    ACTIONS,
    Action,
    Item,
    Kind,
    ReliableFIFO,
    clip_error,
    encode_payload,
    tokens_of,
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
REGISTRY_KEY = "ankusa:queues"
# Items moved per script by recovery and failed-list removal, so no script holds Redis for long.
BATCH = 1000

# KEYS of every script: main, busy, failed, payload, meta, seq.
PRELUDE = """
local MAIN, BUSY, FAILED, PAYLOAD, META, SEQ = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]

local function meta_of(id)
  local raw = redis.call('HGET', META, id)
  local enq, claims, rq, fc, failed, err = string.match(raw, '^(%d+):(%d+):(%d+):(%d+):(%d+):(.*)$')
  return {enq = enq, claims = tonumber(claims), rq = tonumber(rq), fc = tonumber(fc), failed = failed, err = err}
end

local function pack(m)
  return m.enq .. ':' .. m.claims .. ':' .. m.rq .. ':' .. m.fc .. ':' .. m.failed .. ':' .. m.err
end

-- Move busy items out of busy: 'done'/'drop' delete them; 'requeue' (within the limit) and
-- 'unclaim' put them back in main, at the head when front is '1' (in the given order); 'fail'
-- and 'requeue' past the limit append them to failed with the error.
local function move(ids, mode, now, front, limit, err)
  local back = {}
  for _, id in ipairs(ids) do
    redis.call('ZREM', BUSY, id)
    if mode == 'done' or mode == 'drop' then
      redis.call('HDEL', PAYLOAD, id)
      redis.call('HDEL', META, id)
    else
      local m = meta_of(id)
      if mode == 'unclaim' or (mode == 'requeue' and m.rq < limit) then
        if mode == 'requeue' then m.rq = m.rq + 1 end
        if err ~= '' then m.err = err end
        back[#back + 1] = id
      else
        m.fc = m.fc + 1
        m.failed = now
        if err ~= '' then
          m.err = err
        elseif m.err == '' then
          m.err = 'requeue limit of ' .. limit .. ' reached'
        end
        redis.call('RPUSH', FAILED, id)
      end
      redis.call('HSET', META, id, pack(m))
    end
  end
  if front == '1' then
    for i = #back, 1, -1 do redis.call('LPUSH', MAIN, back[i]) end
  else
    for i = 1, #back do redis.call('RPUSH', MAIN, back[i]) end
  end
end
"""

# ARGV: now_us, payload...  ->  the first new id
ENQUEUE = """
local n = #ARGV - 1
local first = redis.call('INCRBY', SEQ, n) - n + 1
local meta = ARGV[1] .. ':0:0:0:0:'
for i = 1, n do
  local id = first + i - 1
  redis.call('HSET', PAYLOAD, id, ARGV[i + 1])
  redis.call('HSET', META, id, meta)
  redis.call('RPUSH', MAIN, id)
end
return first
"""

# ARGV: now_us, n  ->  flat list of id, payload, meta
CLAIM = """
local ids = redis.call('LPOP', MAIN, ARGV[2])
if not ids then return {} end
local out = {}
for _, id in ipairs(ids) do
  local m = meta_of(id)
  m.claims = m.claims + 1
  local packed = pack(m)
  redis.call('HSET', META, id, packed)
  redis.call('ZADD', BUSY, ARGV[1], id)
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', PAYLOAD, id)
  out[#out + 1] = packed
end
return out
"""

# ARGV: now_us, mode, front, requeue limit, error, then pairs of id and claims ('' = no check)
# ->  the ids that were still held, and so moved
RELEASE = """
local held = {}
for i = 6, #ARGV, 2 do
  local id, claims = ARGV[i], ARGV[i + 1]
  if redis.call('ZSCORE', BUSY, id) and (claims == '' or tostring(meta_of(id).claims) == claims) then
    held[#held + 1] = id
  end
end
move(held, ARGV[2], ARGV[1], ARGV[3], tonumber(ARGV[4]), ARGV[5])
return held
"""

# ARGV: now_us, action, cutoff_us, requeue limit, error, batch
# ->  flat list of id, payload, meta, claim time of the items touched, as they were while busy
EXPIRE = """
local found = redis.call('ZRANGEBYSCORE', BUSY, '-inf', '(' .. ARGV[3], 'WITHSCORES', 'LIMIT', 0, ARGV[6])
local ids, out = {}, {}
for i = 1, #found, 2 do
  local id = found[i]
  ids[#ids + 1] = id
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', PAYLOAD, id)
  out[#out + 1] = redis.call('HGET', META, id)
  out[#out + 1] = found[i + 1]
end
move(ids, ARGV[2], ARGV[1], '0', tonumber(ARGV[4]), ARGV[5])
return out
"""

# ARGV: max fail count ('' = any), cutoff_us ('' = any), limit (0 = all)  ->  how many moved
REQUEUE_FAILED = """
local max_fc, cutoff, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local all = redis.call('LRANGE', FAILED, 0, -1)
local kept, moved = {}, {}
for _, id in ipairs(all) do
  local m = meta_of(id)
  if (limit == 0 or #moved < limit) and (not max_fc or m.fc <= max_fc) and (not cutoff or tonumber(m.failed) <= cutoff) then
    m.rq = 0
    m.failed = '0'
    redis.call('HSET', META, id, pack(m))
    moved[#moved + 1] = id
  else
    kept[#kept + 1] = id
  end
end
if #moved > 0 then
  redis.call('DEL', FAILED)
  for i = 1, #kept, 1000 do redis.call('RPUSH', FAILED, unpack(kept, i, math.min(i + 999, #kept))) end
  for i = 1, #moved, 1000 do redis.call('RPUSH', MAIN, unpack(moved, i, math.min(i + 999, #moved))) end
end
return #moved
"""

# ARGV: cutoff_us ('' = all), limit  ->  how many removed (from the head, oldest failure first)
REMOVE_FAILED = """
local cutoff, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local removed = 0
while removed < limit do
  local id = redis.call('LINDEX', FAILED, 0)
  if not id or (cutoff and tonumber(meta_of(id).failed) > cutoff) then break end
  redis.call('LPOP', FAILED)
  redis.call('HDEL', PAYLOAD, id)
  redis.call('HDEL', META, id)
  removed = removed + 1
end
return removed
"""

# ARGV: kind, n  ->  flat list of id, payload, meta, claim time ('' outside busy)
PEEK = """
local out = {}
local function add(id, score)
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', PAYLOAD, id)
  out[#out + 1] = redis.call('HGET', META, id)
  out[#out + 1] = score
end
local last = tonumber(ARGV[2]) - 1
if ARGV[1] == 'busy' then
  local found = redis.call('ZRANGE', BUSY, 0, last, 'WITHSCORES')
  for i = 1, #found, 2 do add(found[i], found[i + 1]) end
else
  local list = ARGV[1] == 'main' and MAIN or FAILED
  for _, id in ipairs(redis.call('LRANGE', list, 0, last)) do add(id, '') end
end
return out
"""

# ->  how many items there were
FLUSH = """
local n = redis.call('HLEN', META)
redis.call('UNLINK', MAIN, BUSY, FAILED, PAYLOAD, META)
return n
"""

SCRIPTS = {
    "enqueue": ENQUEUE,
    "claim": CLAIM,
    "release": RELEASE,
    "expire": EXPIRE,
    "requeue_failed": REQUEUE_FAILED,
    "remove_failed": REMOVE_FAILED,
    "peek": PEEK,
    "flush": FLUSH,
}


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
        self.keys = [prefix + part for part in ("main", "busy", "failed", "payload", "meta", "seq")]
        self._scripts = {name: self.redis.register_script(PRELUDE + body) for name, body in SCRIPTS.items()}

    def _run(self, script: str, *args: Any, client=None) -> Any:
        return self._scripts[script](keys=self.keys, args=args, client=client)

    # --- producers ----------------------------------------------------------------------------------

    def enqueue(self, *payloads: Any) -> list[int]:
        encoded = [encode_payload(payload) for payload in payloads]
        if not encoded:
            return []
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.sadd(REGISTRY_KEY, self.name)
            self._run("enqueue", micros(self.clock()), *encoded, client=pipe)
            _, first = pipe.execute()
        return list(range(first, first + len(encoded)))

    # --- consumers ----------------------------------------------------------------------------------

    def _claim(self, n: int, now: datetime) -> list[Item]:
        found = self._run("claim", micros(now), n)
        return [_item(*found[i : i + 3], claimed_at=now) for i in range(0, len(found), 3)]

    def done(self, *items: Item | int) -> int:
        return self._release("done", items)

    def fail(self, item: Item | int, error: str) -> bool:
        return self._release("fail", [item], error=error) == 1

    def requeue(self, *items: Item | int, front: bool = False, error: str = "") -> int:
        return self._release("requeue", items, error=error, front=front)

    def unclaim(self, *items: Item | int) -> int:
        return self._release("unclaim", items, front=True)

    def _release(self, mode: str, items, *, error: str = "", front: bool = False) -> int:
        tokens = tokens_of(items)
        if not tokens:
            return 0
        pairs = [part for pk, claims in tokens for part in (pk, "" if claims is None else claims)]
        args = (micros(self.clock()), mode, "1" if front else "0", self.requeue_limit, clip_error(error))
        held = [int(pk) for pk in self._run("release", *args, *pairs)]
        self._report_skipped(mode, [pk for pk, _ in tokens], held)
        return len(held)

    # --- recovery and the failed list ---------------------------------------------------------------

    def handle_expired(
        self, older_than: timedelta | None = None, action: Action = "requeue", *, limit: int | None = None
    ) -> list[Item]:
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}.")
        now = self.clock()
        older_than = self.visibility_timeout if older_than is None else older_than
        error = f"claim expired (held longer than {older_than.total_seconds():g} s)"
        touched: list[Item] = []
        while limit is None or len(touched) < limit:
            size = BATCH if limit is None else min(BATCH, limit - len(touched))
            args = (micros(now), action, micros(now - older_than), self.requeue_limit, error, size)
            found = self._run("expire", *args)
            touched.extend(
                _item(*found[i : i + 3], claimed_at=from_micros(found[i + 3]))
                for i in range(0, len(found), 4)
            )
            if len(found) < 4 * size:
                break
        return touched

    def requeue_failed(
        self, max_fail_count: int | None = None, delay: timedelta | None = None, *, limit: int | None = None
    ) -> int:
        cutoff = "" if delay is None else micros(self.clock() - delay)
        return self._run(
            "requeue_failed", "" if max_fail_count is None else max_fail_count, cutoff, limit or 0
        )

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

    # --- inspection ---------------------------------------------------------------------------------

    def length(self, kind: Kind = "main") -> int:
        main, busy, failed = self.keys[:3]
        return {
            "main": lambda: self.redis.llen(main),
            "busy": lambda: self.redis.zcard(busy),
            "failed": lambda: self.redis.llen(failed),
        }[kind]()

    def peek(self, kind: Kind = "main", n: int = 1) -> list[Item]:
        found = self._run("peek", kind, n)
        return [
            _item(*found[i : i + 3], claimed_at=from_micros(found[i + 3]) if found[i + 3] else None)
            for i in range(0, len(found), 4)
        ]

    def flush(self) -> int:
        return self._run("flush")


def known_queues(client=None) -> list[str]:
    """Names of the queues that ever had an item enqueued on this Redis."""
    client = client if client is not None else get_redis_connection("redis")
    return sorted(name.decode() for name in client.smembers(REGISTRY_KEY))


def _item(pk: bytes, payload: bytes, meta: bytes, *, claimed_at: datetime | None) -> Item:
    enqueued, claims, requeues, fails, failed, error = meta.split(b":", 5)
    return Item(
        id=int(pk),
        payload=json.loads(payload),
        enqueued_at=from_micros(enqueued),
        claimed_at=claimed_at,
        requeue_count=int(requeues),
        fail_count=int(fails),
        last_error=error.decode("utf-8", "replace"),
        claims=int(claims),
        failed_at=None if failed == b"0" else from_micros(failed),
    )
