"""``RedisStore``: the store in Redis, shared by every node of a fleet. One Lua script per ``hit``.

Each call is one round trip: ``EVALSHA`` of a script that reads Redis ``TIME`` (µs) as the clock,
checks every charge (GCRA, integers only, the same arithmetic as ``limits.gcra``), then the claim,
and only then writes — each key with its TTL in the same ``SET ... PX`` command. A bucket's TTL is
the time until it is full again (then it is the same as no key); a claim's is its pending or
committed lifetime. After a Redis restart or ``SCRIPT FLUSH`` the first call gets ``NOSCRIPT`` and
sends the script once with ``EVAL``.

Keys: ``<prefix>:{<tenant>}:hooks``, ``...:bytes`` and ``...:claim:<source>:<sha256(key)>``. The
``{tenant}`` hash tag puts all of one tenant's keys in one Redis Cluster slot, which a script that
touches several keys requires. A claim's value is ``state|expires_us|token|command_id``: the
deadline is stored, not only the TTL, so an injected clock (tests) and Redis' own expiry agree.

**The timeout is a hard per-call limit.** redis-py's socket timeout applies per socket operation
(connect, then each handshake read, then each reply read), so a slow server can cost several
timeouts in one call. This module therefore speaks RESP itself over its own small connection
pool: one deadline per call; connect, send and every ``recv`` get only what is left of it; the
handshake (``AUTH``/``SELECT``) rides in the same write as the first command; a connection that
timed out or failed is closed, never reused (a late reply would answer the next call). A call
returns ``Error`` no later than ``timeout_ms`` after it started, give or take the scheduler: it
aims 1 ms early to absorb the wake-up (tests/limits/test_outage.py measures every call against a
stopped Redis and a socket that never answers).
Host names are resolved by the system resolver, which no timeout covers: use an IP address or a
name in /etc/hosts for the fleet store.

Not guaranteed: a call that timed out may still have been applied by Redis (its charges spent, its
claim pending until ``pending_ttl_ms``); the caller has already moved on with its local answer.
"""

from __future__ import annotations

import hashlib
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable

import hiredis
from redis.connection import SSLConnection, UnixDomainSocketConnection, parse_url

from limits.store.base import (
    KINDS,
    Charge,
    Claim,
    Duplicate,
    Error,
    Exceeds,
    Ok,
    Pending,
    RateLimited,
    Result,
    Settle,
    Store,
    check_distinct,
)

_NOW = """
local function now_us(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
"""

# KEYS[1..n]: the buckets; KEYS[n+1]: the claim, when there is one.
# ARGV[1]: now in µs ('' = Redis TIME); ARGV[2]: n; ARGV[1+2i], ARGV[2+2i]: cost and capacity of
# charge i; then the claim's token, command id and pending ttl (ms).
# Returns {0, '', debt_1..n} ok | {1, command_id} duplicate | {2, ms} pending |
# {3, ms, debt_1..n} rate limited | {4, i} charge i exceeds its capacity.
HIT_SCRIPT = (
    _NOW
    + """
local now = now_us(ARGV[1])
local n = tonumber(ARGV[2])
for i = 1, n do
  if tonumber(ARGV[1 + 2 * i]) > tonumber(ARGV[2 + 2 * i]) then return {4, i} end
end
local tats, debts, wait = {}, {}, 0
for i = 1, n do
  local tat = tonumber(redis.call('GET', KEYS[i]) or now)
  if tat < now then tat = now end
  local new = tat + tonumber(ARGV[1 + 2 * i])
  local over = new - tonumber(ARGV[2 + 2 * i]) - now
  if over > wait then wait = over end
  tats[i] = new
  debts[i] = tat - now
end
if wait > 0 then return {3, math.ceil(wait / 1000), unpack(debts)} end
if #KEYS > n then
  local held = redis.call('GET', KEYS[n + 1])
  if held then
    local state, expires, id = string.match(held, '^(%a)|(%d+)|[^|]*|(.*)$')
    expires = tonumber(expires)
    if expires > now then
      if state == 'c' then return {1, id} end
      return {2, math.ceil((expires - now) / 1000)}
    end
  end
  local base = 2 + 2 * n
  local pending_ms = tonumber(ARGV[base + 3])
  redis.call('SET', KEYS[n + 1],
    'p|' .. string.format('%d', now + pending_ms * 1000) .. '|' .. ARGV[base + 1] .. '|' .. ARGV[base + 2],
    'PX', pending_ms)
end
for i = 1, n do
  redis.call('SET', KEYS[i], string.format('%d', tats[i]), 'PX', math.ceil((tats[i] - now) / 1000) + 1)
  debts[i] = tats[i] - now
end
return {0, '', unpack(debts)}
"""
)

# KEYS[1]: the claim. ARGV: now ('' = TIME), token, '1' commit / '0' release, ttl (ms), the command
# id to keep ('' = the one given at claim time).
SETTLE_SCRIPT = (
    _NOW
    + """
local now = now_us(ARGV[1])
local held = redis.call('GET', KEYS[1])
if not held then return 0 end
local expires, token, id = string.match(held, '^%a|(%d+)|([^|]*)|(.*)$')
if token ~= ARGV[2] or tonumber(expires) <= now then return 0 end
if ARGV[3] == '1' then
  local ttl = tonumber(ARGV[4])
  if ARGV[5] ~= '' then id = ARGV[5] end
  redis.call('SET', KEYS[1], 'c|' .. string.format('%d', now + ttl * 1000) .. '|' .. token .. '|' .. id, 'PX', ttl)
else
  redis.call('DEL', KEYS[1])
end
return 1
"""
)


WAKE_UP_MARGIN_MS = 1


class StoreTimeout(Exception):
    pass


def pack(*args) -> bytes:
    """One command in RESP (hiredis' C packer: 4× faster than building it in Python)."""
    return hiredis.pack_command(args)


class _Connection:
    """One socket to Redis, opened within a deadline; its handshake goes out with the first command."""

    def __init__(self, target: dict, deadline: float):
        self.sock = _open_socket(target, _remaining(deadline))
        self.reader = hiredis.Reader(encoding="utf-8", errors="replace")
        self.buffer = bytearray(65536)
        self.handshake = []
        if target.get("password"):
            auth = [target["username"]] if target.get("username") else []
            self.handshake.append(pack("AUTH", *auth, target["password"]))
        if target.get("db"):
            self.handshake.append(pack("SELECT", target["db"]))

    def call(self, commands: list[bytes], deadline: float) -> list:
        setup, self.handshake = self.handshake, []
        self.sock.settimeout(_remaining(deadline))
        self.sock.sendall(b"".join(setup + commands))
        replies = [self._read(deadline) for _ in range(len(setup) + len(commands))]
        for reply in replies[: len(setup)]:
            if isinstance(reply, hiredis.ReplyError):
                raise ConnectionError(f"handshake refused: {reply}")
        return replies[len(setup) :]

    def _read(self, deadline: float):
        while True:
            reply = self.reader.gets()
            if reply is not False:
                return reply
            self.sock.settimeout(_remaining(deadline))
            size = self.sock.recv_into(self.buffer)
            if size == 0:
                raise ConnectionError("Redis closed the connection")
            self.reader.feed(self.buffer, 0, size)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _remaining(deadline: float) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise StoreTimeout()
    return remaining


def _open_socket(target: dict, timeout: float) -> socket.socket:
    kind = target.get("connection_class")
    if kind is UnixDomainSocketConnection:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(target["path"])
        except BaseException:
            sock.close()
            raise
        return sock
    sock = socket.create_connection((target.get("host", "127.0.0.1"), target.get("port", 6379)), timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if kind is SSLConnection:
        sock = ssl.create_default_context().wrap_socket(sock, server_hostname=target.get("host"))
    return sock


class _Pool:
    """Idle connections, taken last-in first-out; a connection is in one thread's hands at a time."""

    def __init__(self, target: dict, max_idle: int = 64):
        self.target = target
        self.max_idle = max_idle
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def run(self, commands: list[bytes], deadline: float) -> list:
        connection = self._take() or _Connection(self.target, deadline)
        try:
            replies = connection.call(commands, deadline)
        except BaseException:
            connection.close()
            raise
        self._give(connection)
        return replies

    def _take(self) -> _Connection | None:
        with self._lock:
            if self._pid != os.getpid():  # a forked child must not share its parent's sockets
                self._idle, self._pid = [], os.getpid()
            return self._idle.pop() if self._idle else None

    def _give(self, connection: _Connection) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle and self._pid == os.getpid():
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


def _hit_result(reply: list, charges: list[Charge]) -> Result:
    code, value, *debts = reply
    if code == 0:
        return Ok(tuple(debts))
    if code == 1:
        return Duplicate(value)
    if code == 2:
        return Pending(value)
    if code == 3:
        return RateLimited(value, tuple(debts))
    return Exceeds(charges[value - 1].kind)


def _noscript(reply) -> bool:
    return isinstance(reply, hiredis.ReplyError) and str(reply).startswith("NOSCRIPT")


class _Script:
    def __init__(self, source: str):
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


_HIT = _Script(HIT_SCRIPT)
_SETTLE = _Script(SETTLE_SCRIPT)


class RedisStore(Store):
    """The fleet's store. Constructing it connects to nothing: an outage never blocks start-up."""

    settles_after_answer = True  # a settle is a round trip; many go in one (settle_many)

    def __init__(
        self,
        url: str,
        *,
        timeout_ms: int,
        prefix: str = "ankusa",
        clock: Callable[[], int] | None = None,
    ):
        self.url = url
        self.timeout_ms = timeout_ms
        self.prefix = prefix
        # Tests inject the clock (µs); in production Redis TIME is the one clock of the fleet.
        self.clock = clock
        self._pool = _Pool(parse_url(url))

    def hit(self, charges: list[Charge], claim: Claim | None = None, timeout_ms: int | None = None) -> Result:
        keys, args = self._hit_call(charges, claim)
        reply = self._eval(_HIT, keys, args, timeout_ms)
        return reply if isinstance(reply, Error) else _hit_result(reply, charges)

    def settle(
        self, claim: Claim, committed: bool, timeout_ms: int | None = None, *, command_id: str | None = None
    ) -> bool | Error:
        args = self._settle_args(claim, committed, command_id)
        reply = self._eval(_SETTLE, [self.claim_key(claim)], args, timeout_ms)
        return reply if isinstance(reply, Error) else reply == 1

    def settle_many(self, settles: list[Settle], timeout_ms: int | None = None) -> list[bool | Error]:
        """Every settle's ``EVALSHA`` in one write, their replies read within one deadline: one
        round trip for any number (each script still runs atomically by itself)."""
        if not settles:
            return []
        replies = self._eval_many(self._settle_calls(settles), timeout_ms)
        return [reply if isinstance(reply, Error) else reply == 1 for reply in replies]

    def hit_and_settle(
        self, charges: list[Charge], claim: Claim | None, settles: list[Settle], timeout_ms: int | None = None
    ) -> tuple[Result, list[bool | Error]]:
        """The settles, then the hit, in one write and one round trip (settles first: a duplicate
        of a claim settled here is then answered as one)."""
        keys, args = self._hit_call(charges, claim)
        replies = self._eval_many([*self._settle_calls(settles), (_HIT, keys, args)], timeout_ms)
        hit = replies[-1]
        result = hit if isinstance(hit, Error) else _hit_result(hit, charges)
        return result, [reply if isinstance(reply, Error) else reply == 1 for reply in replies[:-1]]

    def _hit_call(self, charges: list[Charge], claim: Claim | None) -> tuple[list, list]:
        check_distinct(charges)
        keys = [self.bucket_key(charge.tenant, charge.kind) for charge in charges]
        args = [self._now_arg(), len(charges)]
        for charge in charges:
            args += [charge.cost_us, charge.capacity_us]
        if claim is not None:
            keys.append(self.claim_key(claim))
            args += [claim.token, claim.command_id, claim.pending_ttl_ms]
        return keys, args

    def _settle_calls(self, settles: list[Settle]) -> list[tuple]:
        return [
            (
                _SETTLE,
                [self.claim_key(one.claim)],
                self._settle_args(one.claim, one.committed, one.command_id),
            )
            for one in settles
        ]

    def _eval_many(self, calls: list[tuple], timeout_ms: int | None) -> list:
        """``(script, keys, args)`` each, pipelined in one write within one deadline: each reply, or
        ``Error`` for every one when the round trip failed."""
        deadline = self._deadline(timeout_ms)
        commands = [pack("EVALSHA", script.sha, len(keys), *keys, *args) for script, keys, args in calls]
        replies = self._call_all(commands, deadline)
        if isinstance(replies, Error):
            return [replies] * len(calls)
        missing = [i for i, reply in enumerate(replies) if _noscript(reply)]
        if missing:  # Redis restarted or flushed its scripts: the sources once more, same deadline
            again = self._call_all(
                [
                    pack("EVAL", calls[i][0].source, len(calls[i][1]), *calls[i][1], *calls[i][2])
                    for i in missing
                ],
                deadline,
            )
            for n, i in enumerate(missing):
                replies[i] = again if isinstance(again, Error) else again[n]
        return [
            Error(f"redis: {reply}") if isinstance(reply, hiredis.ReplyError) else reply for reply in replies
        ]

    def reset(self, tenant: str, timeout_ms: int | None = None) -> bool | Error:
        keys = [self.bucket_key(tenant, kind) for kind in KINDS]
        reply = self._call([pack("DEL", *keys)], self._deadline(timeout_ms))
        return reply if isinstance(reply, Error) else True

    def ping(self, timeout_ms: int | None = None) -> bool | Error:
        """One ``PING`` within the budget (a probe, and the benchmark's baseline round trip)."""
        reply = self._call([pack("PING")], self._deadline(timeout_ms))
        return reply if isinstance(reply, Error) else True

    def bucket_key(self, tenant: str, kind: str) -> str:
        return f"{self.prefix}:{{{tenant}}}:{kind}"

    def claim_key(self, claim: Claim) -> str:
        digest = hashlib.sha256(claim.key.encode()).hexdigest()[:40]
        return f"{self.prefix}:{{{claim.tenant}}}:claim:{claim.source_id}:{digest}"

    def close(self) -> None:
        self._pool.close()

    def _now_arg(self) -> str:
        return "" if self.clock is None else str(self.clock())

    def _eval(self, script: _Script, keys: list[str], args: list, timeout_ms: int | None):
        deadline = self._deadline(timeout_ms)
        reply = self._call([pack("EVALSHA", script.sha, len(keys), *keys, *args)], deadline)
        if isinstance(reply, hiredis.ReplyError) and str(reply).startswith("NOSCRIPT"):
            # Redis restarted or its scripts were flushed: send the source once (within the same
            # deadline); Redis caches it again.
            reply = self._call([pack("EVAL", script.source, len(keys), *keys, *args)], deadline)
        if isinstance(reply, hiredis.ReplyError):
            return Error(f"redis: {reply}")
        return reply

    def _deadline(self, timeout_ms: int | None) -> tuple[float, int]:
        budget_ms = self.timeout_ms if timeout_ms is None else timeout_ms
        # Aim a little early: waking up from the last wait (poll rounds up to a whole millisecond,
        # then the scheduler) takes ~0.5 ms, more on a busy machine, and the budget is a hard limit.
        return time.monotonic() + (budget_ms - min(WAKE_UP_MARGIN_MS, budget_ms / 10)) / 1000, budget_ms

    def _settle_args(self, claim: Claim, committed: bool, command_id: str | None) -> list:
        return [self._now_arg(), claim.token, "1" if committed else "0", claim.ttl_ms, command_id or ""]

    def _call(self, commands: list[bytes], deadline: tuple[float, int]):
        replies = self._call_all(commands, deadline)
        return replies if isinstance(replies, Error) else replies[-1]

    def _call_all(self, commands: list[bytes], deadline: tuple[float, int]) -> list | Error:
        at, budget_ms = deadline
        try:
            return self._pool.run(commands, at)
        except (StoreTimeout, TimeoutError):
            return Error(f"timeout: no answer within {budget_ms} ms")
        except (OSError, hiredis.HiredisError) as exc:  # HiredisError: a reply that is not RESP
            return Error(f"unreachable: {type(exc).__name__}: {exc}"[:200])
