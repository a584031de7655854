-- Records a finished request's tokens (mirrors Counter::settle in decision.rs): into the window
-- current now (a new one if it ended), refunding the reservation if it was made in that window.
-- A cancelled admission (ARGV[8] = 1) mirrors Counter::cancel instead: the request and its
-- reservation are taken back if the window it was admitted in is still open; nothing else moves.
--
-- Idempotent: a settlement sent again (its first send timed out but still ran, e.g. after Redis
-- was paused) is applied once. Its id is recorded in KEYS[2] for the key TTL (window + margin);
-- a settlement whose id is there is skipped.
--
-- KEYS[1]  the model's hash (see admit.lua).
-- KEYS[2]  the settlement's id key, PREFIX{model}:settled:ID (same hash tag: same cluster slot).
-- ARGV     window_ms, pool prefix ("" = no pools), tokens, reserved, model window start,
--          pool window start, key TTL in ms, cancel (1 or 0).
-- Returns  1 applied, 0 skipped (already applied).
if not redis.call('SET', KEYS[2], 1, 'NX', 'PX', tonumber(ARGV[7])) then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key = KEYS[1]
local window = tonumber(ARGV[1])
local tokens, reserved = tonumber(ARGV[3]), tonumber(ARGV[4])
local cancel = ARGV[8] == '1'

local function settle(p, admitted_in)
  local f = redis.call('HMGET', key, p .. 's', p .. 't')
  local s, k = tonumber(f[1]), tonumber(f[2]) or 0
  if not (s ~= nil and now < s + window) then
    s, k = now, 0
    redis.call('HSET', key, p .. 's', now, p .. 'r', 0)
  end
  if reserved > 0 and admitted_in == s then k = math.max(0, k - reserved) end
  -- Clamped to what a Lua number holds exactly (the Rust side clamps each count the same way).
  redis.call('HSET', key, p .. 't', math.min(k + tokens, 9007199254740991))
end

local function take_back(p, admitted_in)
  local f = redis.call('HMGET', key, p .. 's', p .. 'r', p .. 't')
  local s = tonumber(f[1])
  if s ~= nil and now < s + window and admitted_in == s then
    local r, k = tonumber(f[2]) or 0, tonumber(f[3]) or 0
    redis.call('HSET', key, p .. 'r', math.max(0, r - 1), p .. 't', math.max(0, k - reserved))
  end
end

local apply = settle
if cancel then apply = take_back end
apply('m', tonumber(ARGV[5]))
if ARGV[2] ~= '' then apply(ARGV[2], tonumber(ARGV[6])) end
redis.call('PEXPIRE', key, tonumber(ARGV[7]))
return 1
