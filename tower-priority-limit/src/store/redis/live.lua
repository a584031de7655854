-- A gateway says it is alive: its stores' ids in the registry of gateways alive, each scored
-- with when it lapses unless said again (on Redis's clock, as admit.lua reads it). Entries
-- already lapsed are dropped; the registry itself goes when the last gateway stops saying it.
--
-- KEYS[1]  the registry (a sorted set: id -> lapse time, ms).
-- ARGV     how long an entry lives (ms), then the ids (16 hex digits each).
-- Returns  Redis's time (ms).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lapse = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], now + lapse, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], lapse)
return now
