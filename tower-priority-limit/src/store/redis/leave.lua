-- A gateway's last waiter of a flow gave up without being admitted (its deadline, its client
-- went away, a full queue displaced it): the gateway's registration of the flow in the fleet's
-- order (admit.lua, its flow section) ends, if it still counts; at none left the flow leaves the
-- order, and if it was the head (the pool's order moved) or the last flow of its pool (the order
-- between priorities moved), the other gateways' waiters look again.
--
-- KEYS[1]  the pool's waiting flows, KEYS[2] its flow state (see admit.lua).
-- ARGV     the flow, the gateway's id, the wake-up channel, the flow state's TTL in ms.
local flow = ARGV[1]
local mine = 'h' .. flow .. ':' .. ARGV[2]
local st = redis.call('HMGET', KEYS[2], mine, 'g' .. flow)
if st[1] == false or st[1] ~= (st[2] or '0') then
  redis.call('HDEL', KEYS[2], mine)
  return 0
end
redis.call('HDEL', KEYS[2], mine)
local n = redis.call('HINCRBY', KEYS[2], 'n' .. flow, -1)
if n <= 0 then
  local head = redis.call('ZRANGE', KEYS[1], 0, 0)
  redis.call('ZREM', KEYS[1], flow)
  redis.call('HDEL', KEYS[2], 'n' .. flow, 'e' .. flow)
  if head[1] == flow or redis.call('ZCARD', KEYS[1]) == 0 then
    redis.call('PUBLISH', ARGV[3], flow)
  end
end
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[4]))
return 1
