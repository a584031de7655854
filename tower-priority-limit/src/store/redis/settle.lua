-- Records a finished request (mirrors `decision::settle` and the windows' `record`, `replace`
-- and `cancel` in decision/{fixed,sliding}.rs):
--   post_hoc: the tokens go into the window current now (a new one if it ended); a reservation,
--             if one was made, is taken back where it was made if that still counts.
--   reserve:  the tokens replace the reservation where it was made, if that still counts;
--             once that window (or slot) has left, only tokens beyond the reservation count,
--             recorded now.
--   cancel (ARGV[4] = 1): the request and its reservation are taken back where they were made,
--             if that still counts; nothing else moves.
--
-- Idempotent: a settlement sent again (its first send timed out but still ran, e.g. after Redis
-- was paused) is applied once. Its id is recorded in KEYS[2] for the model's window and a margin;
-- a settlement whose id is there is skipped.
--
-- One script settles a model's hash (its model-wide and pool pairs) or a caller's (its window,
-- day and model pairs, and its parallel slot): the pairs are listed, each with its window.
--
-- KEYS[1]  the hash (see admit.lua for its fields).
-- KEYS[2]  the settlement's id key, HASH:settled:ID (same hash tag: same cluster slot).
-- KEYS[3]  a caller's sorted set of parallel slots (absent for a model).
-- ARGV     tokens, reserved, the hash's TTL in ms, cancel (1 or 0), window kind ("f" or "s"),
--          accounting ("p" post_hoc or "r" reserve), the parallel slot to free ("" = none), the
--          id key's TTL in ms (the model's window and a margin), the number of pairs, then per
--          pair: its field prefix, its mark (the fixed window's start,
--          or the sliding window's slot, the admission was counted at), its window and slot
--          length in ms; then the wake-up channel of a model's hash with the queue on ("" for
--          none); then the number of budgets and per budget: its field prefix, the period the
--          admission reserved in, the cost reserved and the real cost (nano-dollars).
--          A hash TTL of -1 keeps the hash for good (a caller's budget that never resets).
-- Returns  {1, then per budget its spent after this settlement (-1 where the period it reserved
--          in has ended)} when applied, {0} when skipped (already applied).
-- Whether the admission still held its slot: once a slot lapsed (admit.lua: its gateway died
-- with the request in flight), the budget reservation it recorded was given back with it.
local held = true
if ARGV[7] ~= '' and KEYS[3] then
  -- Freeing a slot is idempotent: it happens even for a settlement seen before.
  held = redis.call('ZREM', KEYS[3], ARGV[7]) == 1
  redis.call('HDEL', KEYS[1], 'x' .. ARGV[7])
end
if not redis.call('SET', KEYS[2], 1, 'NX', 'PX', tonumber(ARGV[8])) then
  return {0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key = KEYS[1]
local tokens, reserved = tonumber(ARGV[1]), tonumber(ARGV[2])
local cancel = ARGV[4] == '1'
local sliding = ARGV[5] == 's'
local reserve_mode = ARGV[6] == 'r'
local MAX = 9007199254740991
local RING = 31
-- The pair being settled: its window and slot length (set per pair below).
local window, slot_ms, slot

-- Fixed windows -----------------------------------------------------------------------------

-- Changes the window that started at `mark` if it is the one open now.
local function fixed_change(p, mark, dr, take, add)
  local f = redis.call('HMGET', key, p .. 's', p .. 'r', p .. 't')
  local s = tonumber(f[1])
  if s ~= nil and now < s + window and mark == s then
    local r, k = tonumber(f[2]) or 0, tonumber(f[3]) or 0
    redis.call('HSET', key, p .. 'r', math.max(0, r - dr),
      p .. 't', math.min(math.max(0, k - take) + add, MAX))
    return true
  end
  return false
end

local function fixed_record(p, amount)
  local f = redis.call('HMGET', key, p .. 's', p .. 't')
  local s, k = tonumber(f[1]), tonumber(f[2]) or 0
  if not (s ~= nil and now < s + window) then
    k = 0
    -- A pool's window keeps its model's (`Window::open_following`): it opens where the model's
    -- open one started (settled first), else now. Only a model's hash has `ms`.
    local opens = now
    if p ~= 'm' then
      local ms = tonumber(redis.call('HGET', key, 'ms'))
      if ms ~= nil and now < ms + window then opens = ms end
    end
    redis.call('HSET', key, p .. 's', opens, p .. 'r', 0)
  end
  -- Clamped to what a Lua number holds exactly (the Rust side clamps each count the same way).
  redis.call('HSET', key, p .. 't', math.min(k + amount, MAX))
end

-- Sliding windows ---------------------------------------------------------------------------

-- Changes the slot `mark` if it is held and still counts now.
local function sliding_change(p, mark, dr, take, add)
  local place = mark % RING
  local f = redis.call('HMGET', key, p .. 'h', p .. 'R', p .. 'T', p .. 'r' .. place,
    p .. 't' .. place)
  local h = tonumber(f[1])
  if h == nil then return false end
  if not (mark <= h and mark + RING > math.max(h, slot)) then return false end
  local tr, tk = tonumber(f[2]) or 0, tonumber(f[3]) or 0
  local r, k = tonumber(f[4]) or 0, tonumber(f[5]) or 0
  local nr, nk = math.max(0, r - dr), math.min(math.max(0, k - take) + add, MAX)
  redis.call('HSET', key, p .. 'r' .. place, nr, p .. 't' .. place, nk,
    p .. 'R', tr - math.min(r, tr) + nr, p .. 'T', math.min(tk - math.min(k, tk) + nk, MAX))
  return true
end

-- Adds `amount` tokens to the slot current now, first dropping the slots that left the window.
local function sliding_record(p, amount)
  local f = redis.call('HMGET', key, p .. 'h', p .. 'R', p .. 'T')
  local h = tonumber(f[1])
  local tr, tk = tonumber(f[2]) or 0, tonumber(f[3]) or 0
  local head = slot
  if h ~= nil and h > slot then head = h end
  if h ~= nil and slot > h then
    local names = {}
    if slot - h >= RING then
      tr, tk = 0, 0
      for place = 0, RING - 1 do
        names[#names + 1] = p .. 'r' .. place
        names[#names + 1] = p .. 't' .. place
      end
    else
      for s = h + 1, slot do
        names[#names + 1] = p .. 'r' .. (s % RING)
        names[#names + 1] = p .. 't' .. (s % RING)
      end
      local v = redis.call('HMGET', key, unpack(names))
      for i = 1, #v, 2 do
        tr = tr - math.min(tonumber(v[i]) or 0, tr)
        tk = tk - math.min(tonumber(v[i + 1]) or 0, tk)
      end
    end
    redis.call('HDEL', key, unpack(names))
  end
  local place = head % RING
  local k = tonumber(redis.call('HGET', key, p .. 't' .. place)) or 0
  redis.call('HSET', key, p .. 't' .. place, math.min(k + amount, MAX), p .. 'h', head,
    p .. 'R', tr, p .. 'T', math.min(tk + amount, MAX))
end

local change, record = fixed_change, fixed_record
if sliding then change, record = sliding_change, sliding_record end

local function apply(p, mark)
  if cancel then
    change(p, mark, 1, reserved, 0)
  elseif reserve_mode then
    if not change(p, mark, 0, reserved, tokens) and tokens > reserved then
      record(p, tokens - reserved)
    end
  else
    if reserved > 0 then change(p, mark, 0, reserved, 0) end
    record(p, tokens)
  end
end

local npairs = tonumber(ARGV[9])
for i = 0, npairs - 1 do
  local at = 10 + 4 * i
  window, slot_ms = tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  slot = math.floor(now / slot_ms)
  apply(ARGV[at], tonumber(ARGV[at + 1]))
end
-- Budgets (`BudgetCounter::settle`): only in the period the admission reserved in; a period
-- the hash does not hold yet (the request was admitted on a gateway's local fallback, or Redis
-- lost the hash) starts with its cost.
local bat = 11 + 4 * npairs
local result = {1}
for i = 0, (tonumber(ARGV[bat]) or 0) - 1 do
  local at = bat + 1 + 4 * i
  local p, mark = ARGV[at], tonumber(ARGV[at + 1])
  local breserved, cost = tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  local f = redis.call('HMGET', key, p .. 'p', p .. 's', p .. 'r')
  local period = tonumber(f[1])
  -- Admitted before its budget got a period: its reservation was carried into it.
  if period == mark or (mark == 0 and period ~= nil and period > 0) then
    local s, r = tonumber(f[2]) or 0, tonumber(f[3]) or 0
    if not cancel then s = math.min(s + cost, MAX) end
    if not held then breserved = 0 end
    redis.call('HSET', key, p .. 's', s, p .. 'r', math.max(0, r - breserved))
    result[#result + 1] = s
  elseif not cancel and (period == nil or period < mark) then
    local s, r = math.min(cost, MAX), 0
    if period == 0 then
      -- A never-resetting budget's counter carries into the period.
      s, r = math.min((tonumber(f[2]) or 0) + cost, MAX), tonumber(f[3]) or 0
    end
    redis.call('HSET', key, p .. 'p', mark, p .. 's', s, p .. 'r', r)
    result[#result + 1] = s
  else
    result[#result + 1] = -1
  end
end
if tonumber(ARGV[3]) < 0 then
  redis.call('PERSIST', key)
else
  redis.call('PEXPIRE', key, tonumber(ARGV[3]))
end
-- After the pairs, a model's wake-up channel: a settlement that frees room (a cancel, or tokens
-- below the reservation) wakes every gateway's waiters while someone may wait (admit.lua's
-- `wq`), so a waiter on one gateway is served when room frees on another.
local wake = ARGV[10 + 4 * npairs]
if wake and wake ~= '' and (cancel or tokens < reserved)
    and (tonumber(redis.call('HGET', key, 'wq')) or 0) > now then
  redis.call('PUBLISH', wake, '')
end
return result
