"""The Lua scripts behind :class:`~guard.admission._ratelimit.RedisRateLimiter`: one per operation.

Redis runs a script to completion before any other command, so reading both buckets, deciding
and charging is atomic across every replica sharing the server. The formulas are those of
:mod:`guard.admission._buckets`.

Clock: by default the script reads Redis's own ``TIME``, so replicas whose clocks disagree still
refill the same bucket consistently (with client clocks, a replica running ahead would refill
buckets early and one running behind would see time stand still). ``TIME`` is wall-clock time; a
step backwards refills nothing rather than draining. Tests pass an explicit ``now`` instead
(ARGV[1]) to step time without sleeping. Redis >= 5 replicates script effects, so calling
``TIME`` before writing is allowed.

State: one hash per tenant, ``rl``/``tl`` the request/token levels and ``ts`` the time they were
computed at. A missing hash or field is a full bucket, so the key expires once both buckets
would have refilled completely: idle tenants cost nothing.

Numbers cross the script boundary as strings: Redis truncates Lua numbers returned to the
client to integers, and formats those passed to ``redis.call`` with only 14 digits.
"""

from __future__ import annotations

from typing import Final

_PRELUDE: Final = """
local key = KEYS[1]
local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local rcap, rrate, rarg = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tcap, trate, targ = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local state = redis.call('HMGET', key, 'rl', 'tl', 'ts')
local elapsed = 0
if state[3] then
  elapsed = math.max(0, now - tonumber(state[3]))
end
local function level(cap, rate, stored)
  if cap <= 0 then return 0 end
  if not stored then return cap end
  return math.min(cap, tonumber(stored) + elapsed * rate)
end
local rl = level(rcap, rrate, state[1])
local tl = level(tcap, trate, state[2])
local function fmt(x) return string.format('%.17g', x) end
local function store()
  local ttl = 0
  if rcap > 0 then
    redis.call('HSET', key, 'rl', fmt(rl))
    ttl = math.max(ttl, (rcap - rl) / rrate)
  end
  if tcap > 0 then
    redis.call('HSET', key, 'tl', fmt(tl))
    ttl = math.max(ttl, (tcap - tl) / trate)
  end
  redis.call('HSET', key, 'ts', fmt(now))
  -- One second of slack: expiring early would hand out a full bucket too soon.
  redis.call('PEXPIRE', key, math.ceil(ttl * 1000) + 1000)
end
"""

# ARGV: now|'' rcap rrate rcost tcap trate tcost (cap 0 = bucket disabled)
# -> {allowed, request level, token level} with levels after the charge when allowed.
RESERVE: Final = (
    _PRELUDE
    + """
local eps = 1e-9
if (rcap > 0 and rl + eps < rarg) or (tcap > 0 and tl + eps < targ) then
  return {'0', fmt(rl), fmt(tl)}
end
if rcap > 0 then rl = rl - rarg end
if tcap > 0 then tl = tl - targ end
store()
return {'1', fmt(rl), fmt(tl)}
"""
)

# ARGV: now|'' rcap rrate rdelta tcap trate tdelta; a positive delta refunds, a negative one
# charges (an overshoot reported by the upstream) without any check: the usage happened.
ADJUST: Final = (
    _PRELUDE
    + """
if rcap > 0 then rl = math.min(rcap, rl + rarg) end
if tcap > 0 then tl = math.min(tcap, tl + targ) end
store()
return {'1', fmt(rl), fmt(tl)}
"""
)
