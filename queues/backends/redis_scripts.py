"""The Redis queue's Lua scripts (``queues.backends.redis``): one table of scripts, each built
from a shared header and only the functions it calls, and their SHA-1s for EVALSHA. What each
script guarantees is the backend's contract; the data layout is in ``queues.backends.redis``.
"""

from __future__ import annotations

import hashlib

# A member of every busy set, scored +inf so no time range reaches it, and longer than Redis's
# zset-max-listpack-value (64) so the set is a skiplist from its first claim. A small sorted set is
# otherwise a listpack, searched linearly: ZADD and ZMSCORE of 100 ids into one of 100 cost ten
# times more than into a skiplist of 100,000.
SENTINEL = "~" * 72

# KEYS of every script: main, busy, failed, items, seq, dropped. Multi-item commands go in chunks of 1,000
# items: Lua's unpack() stops near 8,000 values. Each script carries only the functions it calls
# (defining the others on every call costs a few microseconds of a single-item round trip).
HEADER = f"""
local MAIN, BUSY, FAILED, ITEMS, SEQ, DROPPED = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local SENTINEL = '{SENTINEL}'
"""

FUNCTIONS = {
    "chunked": """
local function chunked(command, key, args, step)
  local out, size = {}, 1000 * step
  if #args == 0 then return out end
  if #args <= size then return redis.call(command, key, unpack(args)) end
  for i = 1, #args, size do
    local part = redis.call(command, key, unpack(args, i, math.min(i + size - 1, #args)))
    if type(part) == 'table' then
      for j = 1, #part do out[#out + 1] = part[j] end
    end
  end
  return out
end
""",
    "uncount": """
-- Tombstones popped from main: uncounted from DROPPED, never below zero (a record that vanished
-- another way, evicted or deleted by hand, was never counted).
local function uncount(n)
  if redis.call('DECRBY', DROPPED, n) < 0 then redis.call('SET', DROPPED, 0) end
end
""",
    "parse": """
local function parse(record)
  local enq, ended, rq, fc, failed, errlen, rest =
    string.match(record, '^(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(.*)$')
  errlen = tonumber(errlen)
  return {enq = enq, ended = tonumber(ended), rq = tonumber(rq), fc = tonumber(fc), failed = failed,
          err = string.sub(rest, 1, errlen), payload = string.sub(rest, errlen + 1)}
end
""",
    "pack": """
local function pack(m)
  return m.enq .. ':' .. m.ended .. ':' .. m.rq .. ':' .. m.fc .. ':' .. m.failed .. ':' .. #m.err .. ':' .. m.err .. m.payload
end
""",
    "claim": """
-- Claim the first n ids of main at time now: {ids, records}. An id without a record was dropped
-- while it waited (a tombstone): it is popped, uncounted from DROPPED and replaced by the next.
local function claim(now, n)
  local ids, records = {}, {}
  local want = tonumber(n)
  while #ids < want do
    local popped = redis.call('LPOP', MAIN, want - #ids)
    if not popped then break end
    local found = chunked('HMGET', ITEMS, popped, 1)
    local skipped = 0
    for i, id in ipairs(popped) do
      if found[i] then
        ids[#ids + 1] = id
        records[#records + 1] = found[i]
      else
        skipped = skipped + 1
      end
    end
    if skipped == 0 then break end
    uncount(skipped)
  end
  if #ids == 0 then return {} end
  local scored = {'+inf', SENTINEL}
  for _, id in ipairs(ids) do
    scored[#scored + 1] = now
    scored[#scored + 1] = id
  end
  chunked('ZADD', BUSY, scored, 2)
  return {ids, records}
end
""",
    "held": """
-- The ids in spec ("id:claim_time id:claim_time ...", claim time '' = any claim) that are busy
-- under that claim. One argument rather than two per item: Redis parses a few kilobytes of one
-- string faster than two hundred arguments. Scores are whole microseconds below 2^53, which
-- Redis replies as plain integers, so the claim times compare as strings.
local function held(spec)
  local ids, want = {}, {}
  for id, token in string.gmatch(spec, '(%d+):(%S*)') do
    ids[#ids + 1] = id
    want[#want + 1] = token
  end
  if #ids == 0 then return {} end
  local scores = chunked('ZMSCORE', BUSY, ids, 1)
  local out = {}
  for i, id in ipairs(ids) do
    if scores[i] and (want[i] == '' or scores[i] == want[i]) then
      out[#out + 1] = id
    end
  end
  return out
end
""",
    "chosen": """
-- The distinct ids of ARGV, in id order, with their busy scores and records (false when
-- not busy / gone). The sub-queue of a live item: busy when scored, failed when its record has a
-- failure time (set on the way to failed, cleared on the way back), else main.
local function chosen()
  local seen, ids = {}, {}
  for _, id in ipairs(ARGV) do
    if not seen[id] then
      seen[id] = true
      ids[#ids + 1] = id
    end
  end
  table.sort(ids, function(a, b) return tonumber(a) < tonumber(b) end)
  return ids, chunked('ZMSCORE', BUSY, ids, 1), chunked('HMGET', ITEMS, ids, 1)
end

local function failed_at(record)
  return string.match(record, '^%d+:%d+:%d+:%d+:(%d+):')
end
""",
    "unfail": """
-- Take ids out of the failed list: LREM each (stops at the id) for a few, else one rewrite of
-- the list, so a large selection costs O(failed) once rather than once per id.
local function unfail(ids)
  if #ids == 0 then return end
  if #ids <= 32 then
    for _, id in ipairs(ids) do redis.call('LREM', FAILED, 1, id) end
    return
  end
  local gone = {}
  for _, id in ipairs(ids) do gone[id] = true end
  local kept = {}
  for _, id in ipairs(redis.call('LRANGE', FAILED, 0, -1)) do
    if not gone[id] then kept[#kept + 1] = id end
  end
  redis.call('DEL', FAILED)
  chunked('RPUSH', FAILED, kept, 1)
end
""",
    "finish": """
local function finish(ids)
  if #ids > 0 then
    chunked('ZREM', BUSY, ids, 1)
    chunked('HDEL', ITEMS, ids, 1)
  end
  return ids
end
""",
    "move": """
-- Move busy items out of busy: 'drop' deletes them; 'requeue' (within the limit) and 'unclaim'
-- put them back in main, at the head when front is '1' (in the given order); 'fail' and
-- 'requeue' past the limit append them to failed with the error.
local function move(ids, mode, now, front, limit, err)
  if mode == 'drop' then return finish(ids) end
  local back = {}
  for _, id in ipairs(ids) do
    redis.call('ZREM', BUSY, id)
    local m = parse(redis.call('HGET', ITEMS, id))
    m.ended = m.ended + 1
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
    redis.call('HSET', ITEMS, id, pack(m))
  end
  if front == '1' then
    for i = #back, 1, -1 do redis.call('LPUSH', MAIN, back[i]) end
  else
    chunked('RPUSH', MAIN, back, 1)
  end
  return ids
end
""",
}

# ARGV: now_us, payload...  ->  the first new id. KEYS[7]: the queue's wake list (queues.wake),
# pushed once the items are in main, so the consumer it wakes finds them.
ENQUEUE = """
local n = #ARGV - 1
local first = redis.call('INCRBY', SEQ, n) - n + 1
local head = ARGV[1] .. ':0:0:0:0:0:'
local ids, records = {}, {}
for i = 1, n do
  local id = first + i - 1
  ids[i] = id
  records[#records + 1] = id
  records[#records + 1] = head .. ARGV[i + 1]
end
chunked('HSET', ITEMS, records, 2)
chunked('RPUSH', MAIN, ids, 1)
redis.call('LPUSH', KEYS[7], 1)
redis.call('LTRIM', KEYS[7], 0, 0)
return first
"""

# ARGV: now_us, n  ->  {ids, records} (empty when main is)
CLAIM = "return claim(ARGV[1], ARGV[2])"

# ARGV: spec (see held)  ->  the ids that were still held, now finished
DONE = "return finish(held(ARGV[1]))"

# ARGV: now_us, n, spec  ->  {ids finished, {ids, records} of the new claims}
DONE_AND_CLAIM = "return {finish(held(ARGV[3])), claim(ARGV[1], ARGV[2])}"

# ARGV: now_us, mode, front, requeue limit, error, spec  ->  the ids that were still held, and so moved
RELEASE = "return move(held(ARGV[6]), ARGV[2], ARGV[1], ARGV[3], tonumber(ARGV[4]), ARGV[5])"

# ARGV: now_us, action, cutoff_us, requeue limit, error, batch
# ->  flat list of id, record, claim time of the items touched, as they were while busy
EXPIRE = """
local found = redis.call('ZRANGEBYSCORE', BUSY, '-inf', '(' .. ARGV[3], 'WITHSCORES', 'LIMIT', 0, ARGV[6])
local ids, out = {}, {}
for i = 1, #found, 2 do
  local id = found[i]
  ids[#ids + 1] = id
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', ITEMS, id)
  out[#out + 1] = found[i + 1]
end
move(ids, ARGV[2], ARGV[1], '0', tonumber(ARGV[4]), ARGV[5])
return out
"""

# ARGV: max fail count ('' = any), cutoff_us ('' = any), limit (0 = all)  ->  how many moved
REQUEUE_FAILED = """
local max_fc, cutoff, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local kept, moved = {}, {}
for _, id in ipairs(redis.call('LRANGE', FAILED, 0, -1)) do
  local m = parse(redis.call('HGET', ITEMS, id))
  if (limit == 0 or #moved < limit) and (not max_fc or m.fc <= max_fc)
      and (not cutoff or tonumber(m.failed) <= cutoff) then
    m.rq = 0
    m.failed = '0'
    redis.call('HSET', ITEMS, id, pack(m))
    moved[#moved + 1] = id
  else
    kept[#kept + 1] = id
  end
end
if #moved > 0 then
  redis.call('DEL', FAILED)
  chunked('RPUSH', FAILED, kept, 1)
  chunked('RPUSH', MAIN, moved, 1)
end
return #moved
"""

# ARGV: cutoff_us ('' = all), limit  ->  how many removed (from the head, oldest failure first)
REMOVE_FAILED = """
local cutoff, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local removed = 0
while removed < limit do
  local id = redis.call('LINDEX', FAILED, 0)
  if not id or (cutoff and tonumber(parse(redis.call('HGET', ITEMS, id)).failed) > cutoff) then break end
  redis.call('LPOP', FAILED)
  redis.call('HDEL', ITEMS, id)
  removed = removed + 1
end
return removed
"""

# ARGV: kind, n  ->  flat list of id, record, claim time ('' outside busy); main skips tombstones
PEEK = """
local out = {}
local want = tonumber(ARGV[2])
if ARGV[1] == 'busy' then
  local found = redis.call('ZRANGEBYSCORE', BUSY, '-inf', '(+inf', 'WITHSCORES', 'LIMIT', 0, want)
  for i = 1, #found, 2 do
    out[#out + 1] = found[i]
    out[#out + 1] = redis.call('HGET', ITEMS, found[i])
    out[#out + 1] = found[i + 1]
  end
  return out
end
-- The first page is the want ids (age() peeks one item on every dispatch sweep). A page that
-- leaves found short of want met tombstones (or the end): later pages read at least 100 ids, so a
-- run of tombstones costs few LRANGE calls.
local key = ARGV[1] == 'main' and MAIN or FAILED
local start, found, page = 0, 0, want
while found < want do
  local ids = redis.call('LRANGE', key, start, start + page - 1)
  start = start + #ids
  local records = chunked('HMGET', ITEMS, ids, 1)
  for i, id in ipairs(ids) do
    if records[i] and found < want then
      found = found + 1
      out[#out + 1] = id
      out[#out + 1] = records[i]
      out[#out + 1] = ''
    end
  end
  if #ids < page then break end  -- the end of the list
  page = math.max(want - found, 100)
end
return out
"""

# ARGV: id...  ->  how many busy or failed items went to the tail of main (in id order)
REQUEUE_IDS = """
local ids, scores, records = chosen()
local moved, unfailed = {}, {}
for i, id in ipairs(ids) do
  local record = records[i]
  if record and (scores[i] or failed_at(record) ~= '0') then
    local m = parse(record)
    if scores[i] then
      m.ended = m.ended + 1
    else
      unfailed[#unfailed + 1] = id
    end
    m.rq = 0
    m.failed = '0'
    redis.call('HSET', ITEMS, id, pack(m))
    moved[#moved + 1] = id
  end
end
chunked('ZREM', BUSY, moved, 1)
unfail(unfailed)
chunked('RPUSH', MAIN, moved, 1)
return #moved
"""

# ARGV: id...  ->  how many items were deleted, whatever their sub-queue
# The record goes, and the id leaves busy (ZREM, O(log busy)) or failed (LREM, O(failed): an
# operator's list, read whole by requeue_failed anyway); an id that waits in main stays there as a
# tombstone, counted in DROPPED, because LREM would cost O(length of main) per id and main is the
# list that grows to millions. Claims pop tombstones and skip them (one HMGET that claims do anyway;
# a tombstone costs its LPOP once), peek skips them, length("main") is LLEN minus DROPPED, and a
# drop pops the tombstones it leaves at the head right away. What remains: tombstones in the middle
# of main cost peek one HMGET slot each until a claim pops them.
DROP_IDS = """
local ids, scores, records = chosen()
local gone, busy, unfailed, waiting = {}, {}, {}, 0
for i, id in ipairs(ids) do
  local record = records[i]
  if record then
    gone[#gone + 1] = id
    if scores[i] then
      busy[#busy + 1] = id
    elseif failed_at(record) ~= '0' then
      unfailed[#unfailed + 1] = id
    else
      waiting = waiting + 1
    end
  end
end
chunked('HDEL', ITEMS, gone, 1)
chunked('ZREM', BUSY, busy, 1)
unfail(unfailed)
if waiting > 0 then
  redis.call('INCRBY', DROPPED, waiting)
  while true do
    local head = redis.call('LINDEX', MAIN, 0)
    if not head or redis.call('HEXISTS', ITEMS, head) == 1 then break end
    redis.call('LPOP', MAIN)
    uncount(1)
  end
end
return #gone
"""

# ARGV: none  ->  LLEN main and the tombstones in it
MAIN_LENGTH = "return {redis.call('LLEN', MAIN), tonumber(redis.call('GET', DROPPED) or '0')}"

# ->  how many items there were
FLUSH = """
local n = redis.call('HLEN', ITEMS)
redis.call('UNLINK', MAIN, BUSY, FAILED, ITEMS, DROPPED)
return n
"""

SCRIPTS = {  # name: (body, the functions it calls, in definition order)
    "enqueue": (ENQUEUE, ["chunked"]),
    "claim": (CLAIM, ["chunked", "uncount", "claim"]),
    "done": (DONE, ["chunked", "held", "finish"]),
    "done_and_claim": (DONE_AND_CLAIM, ["chunked", "uncount", "claim", "held", "finish"]),
    "release": (RELEASE, ["chunked", "parse", "pack", "held", "finish", "move"]),
    "expire": (EXPIRE, ["chunked", "parse", "pack", "finish", "move"]),
    "requeue_failed": (REQUEUE_FAILED, ["chunked", "parse", "pack"]),
    "remove_failed": (REMOVE_FAILED, ["parse"]),
    "requeue_ids": (REQUEUE_IDS, ["chunked", "parse", "pack", "chosen", "unfail"]),
    "drop_ids": (DROP_IDS, ["chunked", "uncount", "chosen", "unfail"]),
    "peek": (PEEK, ["chunked"]),
    "main_length": (MAIN_LENGTH, []),
    "flush": (FLUSH, []),
}
SOURCES = {
    name: HEADER + "".join(FUNCTIONS[function] for function in functions) + body
    for name, (body, functions) in SCRIPTS.items()
}
SHAS = {name: hashlib.sha1(source.encode()).hexdigest() for name, source in SOURCES.items()}
