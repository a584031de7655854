-- Puts spend kept in a durable copy back into a caller's hash after Redis lost it (see spend.rs),
-- once per epoch: a hash already restored for this epoch is left alone, so gateways restoring
-- at once, or one restoring again after a timeout, add it once.
--
-- Within a period spend only grows, so the copy's value is added to what was settled since
-- Redis came back empty; a later period in the hash wins, an earlier one is replaced.
--
-- KEYS[1]  the caller's hash (admit.lua's fields: <prefix>p, <prefix>s, <prefix>r per budget).
-- ARGV     the epoch, the TTL in ms for a hash this creates (-1: none, a budget that never
--          resets), then per budget: its field prefix, its period (Unix ms) and its spend
--          (nano-dollars).
-- Returns  {0} already restored for this epoch; else {1, then per budget its spend after the
--          restore} (what the copy must hold now: the spend settled since Redis came back is
--          in it, and the copy has not heard of it).
local key = KEYS[1]
if redis.call('HGET', key, 'g') == ARGV[1] then
  return {0}
end
local after = {1}
local existed = redis.call('EXISTS', key) == 1
local MAX = 9007199254740991
for i = 3, #ARGV, 3 do
  local p, period, spent = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local f = redis.call('HMGET', key, p .. 'p', p .. 's')
  local held = tonumber(f[1])
  if held == nil or held < period then
    redis.call('HSET', key, p .. 'p', period, p .. 's', spent, p .. 'r', 0)
    after[#after + 1] = spent
  elseif held == period then
    local s = math.min((tonumber(f[2]) or 0) + spent, MAX)
    redis.call('HSET', key, p .. 's', s)
    after[#after + 1] = s
  else
    -- A later period in the hash: the copy's row is over.
    after[#after + 1] = -1
  end
end
redis.call('HSET', key, 'g', ARGV[1])
local ttl = tonumber(ARGV[2])
if not existed and ttl >= 0 then
  redis.call('PEXPIRE', key, ttl)
end
return after
