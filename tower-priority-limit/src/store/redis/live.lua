-- A gateway says it is alive: its stores' ids in the registry of gateways alive, each scored
-- with when it lapses unless said again (on Redis's clock, as admit.lua reads it), and each
-- id's label (the gateway's config, as it names it) beside them. Entries already lapsed are
-- dropped, with their labels; both keys go when the last gateway stops saying it.
--
-- KEYS[1]  the registry (a sorted set: id -> lapse time, ms).
-- KEYS[2]  the labels (a hash: id -> label).
-- ARGV     how long an entry lives (ms), the label ('' for none), then the ids (16 hex digits
--          each).
-- Returns  the labels of the ids alive, each once (what configs the fleet runs).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lapse = tonumber(ARGV[1])
local label = ARGV[2]
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  redis.call('HDEL', KEYS[2], unpack(gone))
end
for i = 3, #ARGV do
  redis.call('ZADD', KEYS[1], now + lapse, ARGV[i])
  if label ~= '' then redis.call('HSET', KEYS[2], ARGV[i], label) end
end
redis.call('PEXPIRE', KEYS[1], lapse)
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PEXPIRE', KEYS[2], lapse) end
local labels, seen = {}, {}
for _, l in ipairs(redis.call('HVALS', KEYS[2])) do
  if not seen[l] then
    seen[l] = true
    labels[#labels + 1] = l
  end
end
return labels
