-- One admission, all-or-nothing: the check and increment of `decide()` on one model's hash.
-- It mirrors `decide` in decision/mod.rs and the windows of decision/{fixed,sliding}.rs; the Rust
-- side re-derives the whole decision (headers, retry-after) from the pre-admission counters
-- returned here and counts any disagreement.
--
-- KEYS[1]  the model's hash. Per counter pair (p = "m" model-wide, p = ARGV[4] for the pool):
--          fixed window: <p>s (window start, ms), <p>r (requests), <p>t (tokens);
--          sliding window: <p>h (newest slot written), <p>R, <p>T (totals over the held slots),
--          <p>r<k>, <p>t<k> (requests and tokens of the slot at ring place k = slot % 31).
-- ARGV     window_ms, rpm, tpm, pool prefix ("" = no pools), pool rpm, pool tpm
--          (limits: -1 = none), saturation threshold, tokens to reserve in generous mode (already
--          capped as `reservation()` does), key TTL in ms, deadline: the caller's deadline on
--          this server's TIME in ms (-1 = none), window kind ("f" fixed, "s" sliding), slot
--          length in ms, tokens to reserve in strict mode, enforcement ("s" shadow: a request
--          the limits refuse is counted and admitted all the same; anything else enforces),
--          then the floors rule (queue on; `Floors` in decision/mod.rs): the number of pools n
--          (0 = off), the request's pool index (0-based), and per pool its prefix, floor rpm and
--          floor tpm (-1 = none).
--          With n > 0 the reply has, after the first eight values, each pool's (requests, tokens)
--          at `now` (zeros where the rule did not need them), and only then the rings.
--          Then the callers (`decision/caller.rs`), at b = 17 + 3n: their number c (0..2), the
--          tokens they reserve, the day's length and slot length in ms, their hashes' TTL in ms,
--          this admission's parallel slot id and how long a slot is held at most (ms), the
--          model's field prefix in their hashes, the cost (nano-dollars) they reserve on their
--          budgets; then per caller its max_parallel, rpm, tpm, tpd, model rpm, model tpm,
--          budget, budget period, model budget, model budget period (-1 = none), its hash's
--          TTL in ms (-1: kept for good, for a budget that never resets) and 1 when it is in
--          shadow (its limits are counted, never refuse: the Rust side reports them), else 0. Budgets are fields
--          $p, $s, $r (the period's start, spent, reserved) and <model prefix>$p/$s/$r.
--          KEYS[2 + 2i] is caller i's hash (pairs
--          "win:" window, "day:" day, then the model's prefix; fields as the model's), KEYS[3 + 2i] its sorted set of
--          parallel slots (score: when the slot lapses); KEYS[2 + 2c] (c callers) is the
--          gateways alive (`live.lua`), read only when a caller's slots or reservations held
--          would refuse. A slot's name is its gateway's id, '.', then its number.
--          The callers are checked first, key then team; after everything else the reply has,
--          per caller, its slots in use, the (start/head, requests, tokens) of its three
--          pairs and the (period, spent, reserved) of its two budgets (-1, 0, 0 where none), and on
--          a caller's refusal of sliding windows, their rings (three per caller).
-- Returns  fixed:   {now, model start (-1 = none), model requests, model tokens,
--                    pool start (-1 = none), pool requests, pool tokens, verdict}
--          sliding: {now, model head (-1 = none), model requests, model tokens, pool head, pool
--                    requests, pool tokens, verdict}, the totals after the slots that left the
--                    window at `now` are dropped, then on a refusal the 31 (requests, tokens)
--                    places of the model's ring and then of the pool's (zeros without pools).
--          With 'C' as the last ARGV (a Redis Cluster, where a model's keys and its callers'
--          live in different slots), only the callers are counted: KEYS[1] is the first
--          caller's hash, the model's limits are -1, no pools and no floors, and the model's
--          fields are neither read from it nor written (the model's part comes from a second
--          call, and the callers' counts are taken back if it refuses); nor are the model's
--          rings sent with a refusal (the callers' follow the eight values at once).
--          verdict: 0 admitted and counted, 1 refused by the model cap, 2 refused by the pool,
--          3 expired: run after the caller's deadline (it has given up), nothing read or changed,
--          4 refused by a caller's limit, 5 behind: the capacity allows it, but a flow of its
--          pool with less service waits (the fleet's order, below; nothing counted).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(ARGV[10])
if deadline ~= nil and deadline >= 0 and now > deadline then
  return {now, -1, 0, 0, -1, 0, 0, 3}
end
local key = KEYS[1]
local window = tonumber(ARGV[1])
local rpm, tpm = tonumber(ARGV[2]), tonumber(ARGV[3])
local pp = ARGV[4]
local prpm, ptpm = tonumber(ARGV[5]), tonumber(ARGV[6])
local threshold = tonumber(ARGV[7])
-- The reservation in generous mode, and in strict mode (capped by the pool's limit too).
local reserve_generous = tonumber(ARGV[8])
local reserve_strict = tonumber(ARGV[13]) or reserve_generous
local sliding = ARGV[11] == 's'
local slot_ms = tonumber(ARGV[12])
local RING = 31

-- A counter pair as read: {start/head, requests, tokens} plus, for a sliding window, the places
-- that left the window at `now` (to clear when writing).
-- `hk` is the hash, `win` the window, `sl` the slot length (the model's, or a caller's day).
local function read_fixed(hk, p, f, win)
  local s = tonumber(f[1])
  local r, k = tonumber(f[2]) or 0, tonumber(f[3]) or 0
  local c = {start = s, raw_r = r, raw_k = k, r = r, k = k}
  if not (s ~= nil and now < s + win) then c.r, c.k = 0, 0 end
  return c
end

local slot = math.floor(now / slot_ms)
local place_now = slot % RING
-- f: the pair's head, totals, and the requests and tokens at the current slot's place.
local function read_sliding(hk, p, f, win, sl)
  local slot = math.floor(now / sl)
  local h = tonumber(f[1])
  local r, k = tonumber(f[2]) or 0, tonumber(f[3]) or 0
  -- What the place an admission writes to holds now (the head's place: the current slot's, unless
  -- the clock stepped back).
  local cur_r, cur_k = tonumber(f[4]) or 0, tonumber(f[5]) or 0
  local gone = {}
  if h ~= nil and slot > h then
    -- The current slot's place held an expired slot: it starts empty.
    cur_r, cur_k = 0, 0
    if slot - h >= RING then
      r, k = 0, 0
      for place = 0, RING - 1 do gone[#gone + 1] = place end
    else
      local fields = {}
      for s = h + 1, slot do
        local place = s % RING
        gone[#gone + 1] = place
        fields[#fields + 1] = p .. 'r' .. place
        fields[#fields + 1] = p .. 't' .. place
      end
      local v = redis.call('HMGET', hk, unpack(fields))
      for i = 1, #v, 2 do
        r = r - math.min(tonumber(v[i]) or 0, r)
        k = k - math.min(tonumber(v[i + 1]) or 0, k)
      end
    end
  end
  local head = h
  if head == nil or slot > head then head = slot end
  if head ~= slot then
    -- The clock stepped back: the admission goes to the head's place (rare; one more read).
    local v = redis.call('HMGET', hk, p .. 'r' .. (head % RING), p .. 't' .. (head % RING))
    cur_r, cur_k = tonumber(v[1]) or 0, tonumber(v[2]) or 0
  end
  return {start = h, head = head, r = r, k = k, gone = gone, cur_r = cur_r, cur_k = cur_k}
end

local fields
if sliding then
  fields = {'mh', 'mR', 'mT', 'mr' .. place_now, 'mt' .. place_now}
else
  fields = {'ms', 'mr', 'mt'}
end
if pp ~= '' then
  if sliding then
    for _, name in ipairs({'h', 'R', 'T', 'r' .. place_now, 't' .. place_now}) do
      fields[#fields + 1] = pp .. name
    end
  else
    fields[4], fields[5], fields[6] = pp .. 's', pp .. 'r', pp .. 't'
  end
end
-- With the fleet's order between priorities (below), whether anyone of the model may wait at
-- all (`wq`, the latest deadline of a waiter): read here, so nobody waiting costs nothing more.
local wq_at = nil
if ARGV[#ARGV] == 'F' and (tonumber(ARGV[15]) or 0) > 1 then
  fields[#fields + 1] = 'wq'
  wq_at = #fields
end
local callers_only = ARGV[#ARGV] == 'C'
local f = {}
if not callers_only then f = redis.call('HMGET', key, unpack(fields)) end
local anyone_waits = wq_at ~= nil and (tonumber(f[wq_at]) or 0) > now
local read = read_fixed
local width = 3
if sliding then read, width = read_sliding, 5 end
local m = read(key, 'm', {f[1], f[2], f[3], f[4], f[5]}, window, slot_ms)
local q = {start = nil, head = nil, r = 0, k = 0, raw_r = 0, raw_k = 0, gone = {}}
if pp ~= '' then
  q = read(key, pp, {f[width + 1], f[width + 2], f[width + 3], f[width + 4], f[width + 5]},
    window, slot_ms)
end

-- Saturation, read before this request counts, picks the mode and so the reservation.
local saturation = 0
if rpm >= 0 then saturation = math.max(saturation, m.r / rpm) end
if tpm >= 0 then saturation = math.max(saturation, m.k / tpm) end
local strict = pp ~= '' and saturation >= threshold
local reserve = reserve_generous
if strict then reserve = reserve_strict end

-- RPM is exact (refused iff requests + 1 > limit); TPM refuses iff tokens >= limit or
-- tokens + reserve > limit (reserve is 0 with post_hoc accounting).
local function over_by(lr, lt, c, res)
  return (lr >= 0 and c.r + 1 > lr) or (lt >= 0 and c.k + math.max(res, 1) > lt)
end
local function over(lr, lt, c) return over_by(lr, lt, c, reserve) end

-- The callers (`check_callers` in decision/caller.rs): each one's three pairs and slots in use,
-- read before anything counts; refused iff a limit of the key, then of the team, is broken.
local cb = 17 + 3 * (tonumber(ARGV[15]) or 0)
local nc = tonumber(ARGV[cb]) or 0
-- What slot `slot_id` of hash `hk` recorded of a budget's reservation (`x<slot>`: cost, period,
-- model budget's period and prefix) is given back: its request will never settle it.
local function give_back(hk, slot_id)
  local rec = redis.call('HGET', hk, 'x' .. slot_id)
  if not rec then return end
  local cost, period, mperiod, mprefix = string.match(rec, '^(%d+) (%-?%d+) (%-?%d+) (.*)$')
  for _, b in ipairs({{'$', period}, {mprefix .. '$', mperiod}}) do
    local f = redis.call('HMGET', hk, b[1] .. 'p', b[1] .. 'r')
    local held = tonumber(f[1])
    if b[2] ~= '-1' and (held == tonumber(b[2]) or (b[2] == '0' and held and held > 0)) then
      redis.call('HSET', hk, b[1] .. 'r', math.max(0, (tonumber(f[2]) or 0) - tonumber(cost)))
    end
  end
  redis.call('HDEL', hk, 'x' .. slot_id)
end

-- The gateways alive (`live.lua`: each process's id, scored with when it lapses unless renewed)
-- and this process's id, from its slot's name (`ID.N`). A slot named so by another process that
-- is not alive belongs to a gateway that died (`kill -9`) with its request in flight. Slots
-- named otherwise (`ID-N`, gateways before liveness) only lapse.
local registry = nil
if nc > 0 then registry = KEYS[2 + 2 * nc] end
local me = string.match(ARGV[cb + 5] or '', '^(%x+)%.')
local function sweep_dead(hk, zk)
  if registry == nil then return 0 end
  local alive, dead = {}, {}
  for _, slot_id in ipairs(redis.call('ZRANGE', zk, 0, -1)) do
    local owner = string.match(slot_id, '^(%x+)%.')
    if owner and owner ~= me then
      if alive[owner] == nil then
        local lapses = tonumber(redis.call('ZSCORE', registry, owner))
        alive[owner] = lapses ~= nil and lapses > now
      end
      if not alive[owner] then dead[#dead + 1] = slot_id end
    end
  end
  for _, slot_id in ipairs(dead) do give_back(hk, slot_id) end
  if #dead > 0 then redis.call('ZREM', zk, unpack(dead)) end
  return #dead
end

-- A caller's slots in use and budgets (`check_budget`): spent + reserved in the request's period
-- (0 for an older one).
local function read_slots_and_budgets(c, lim)
  local hk, zk, mp = c.hk, c.zk, ARGV[cb + 7]
  if c.slots and lim[0] >= 0 then c.parallel = redis.call('ZCARD', zk) end
  c.budgets = {}
  for j, b in ipairs({{'$', lim[6], lim[7]}, {mp .. '$', lim[8], lim[9]}}) do
    local e = {p = b[1], max = b[2], period = b[3], raw_p = -1, s = 0, r = 0}
    if b[2] >= 0 then
      local f = redis.call('HMGET', hk, b[1] .. 'p', b[1] .. 's', b[1] .. 'r')
      e.raw_p, e.s, e.r = tonumber(f[1]) or -1, tonumber(f[2]) or 0, tonumber(f[3]) or 0
    end
    -- A never-resetting budget's counter (period 0) carries into the first period of a
    -- `budget_duration` set since (`BudgetCounter::carry_into`), refused or not.
    if e.raw_p == 0 and b[3] > 0 then
      redis.call('HSET', hk, b[1] .. 'p', b[3])
      e.raw_p = b[3]
    end
    e.committed = e.s + e.r
    if b[3] > e.raw_p then e.committed = 0 end
    c.budgets[j] = e
  end
end

-- Whether what the caller's requests in flight hold refuses this one: its slots, or a budget
-- reached with reservations in it.
local function held_refuses(c, lim)
  if lim[0] >= 0 and c.parallel + 1 > lim[0] then return true end
  for _, e in ipairs(c.budgets) do
    if e.max >= 0 and e.committed >= e.max and e.r > 0 then return true end
  end
  return false
end

local callers = {}
local caller_refused = false
if nc > 0 then
  local creserve = tonumber(ARGV[cb + 1])
  local day, day_slot = tonumber(ARGV[cb + 2]), tonumber(ARGV[cb + 3])
  local mp = ARGV[cb + 7]
  for i = 0, nc - 1 do
    local hk, zk = KEYS[2 + 2 * i], KEYS[3 + 2 * i]
    local lim = {}
    for j = 0, 11 do lim[j] = tonumber(ARGV[cb + 9 + 12 * i + j]) end
    local pairs_at = {{'win:', window, slot_ms}, {'day:', day, day_slot}, {mp, window, slot_ms}}
    -- Only the pairs a limit reads are read and counted (`CallerPair::of`).
    local has = {lim[1] >= 0 or lim[2] >= 0, lim[3] >= 0, lim[4] >= 0 or lim[5] >= 0}
    local names = {}
    for j, pr in ipairs(pairs_at) do
      if has[j] then
        local p, sl = pr[1], pr[3]
        if sliding then
          local place = math.floor(now / sl) % RING
          for _, nm in ipairs({'h', 'R', 'T', 'r' .. place, 't' .. place}) do
            names[#names + 1] = p .. nm
          end
        else
          for _, nm in ipairs({'s', 'r', 't'}) do names[#names + 1] = p .. nm end
        end
      end
    end
    local v = {}
    if #names > 0 then v = redis.call('HMGET', hk, unpack(names)) end
    local c = {hk = hk, zk = zk, pairs = {}, has = has}
    local o = 0
    for j, pr in ipairs(pairs_at) do
      if has[j] then
        c.pairs[j] = read(hk, pr[1], {v[o + 1], v[o + 2], v[o + 3], v[o + 4], v[o + 5]}, pr[2], pr[3])
        o = o + width
      else
        c.pairs[j] = {r = 0, k = 0, raw_r = 0, raw_k = 0, gone = {}}
      end
      c.pairs[j].p, c.pairs[j].win, c.pairs[j].sl = pr[1], pr[2], pr[3]
    end
    -- Slots, one per admission in flight, are kept for a caller with a max_parallel and for one
    -- with a budget: a slot held past its lapse, or whose gateway no longer says it is alive
    -- (`sweep_dead`), is dropped with the budget reservation it recorded.
    c.parallel, c.slots = 0, lim[0] >= 0 or lim[6] >= 0 or lim[8] >= 0
    if c.slots then
      local gone = redis.call('ZRANGEBYSCORE', zk, '-inf', now)
      for _, slot_id in ipairs(gone) do give_back(hk, slot_id) end
      if #gone > 0 then redis.call('ZREMRANGEBYSCORE', zk, '-inf', now) end
    end
    c.ttl = lim[10]
    read_slots_and_budgets(c, lim)
    -- A refusal for slots or for reservations held may be a dead gateway's doing: its slots are
    -- looked at then (never on an admission), and freed if it is gone.
    if c.slots and held_refuses(c, lim) and sweep_dead(hk, zk) > 0 then
      read_slots_and_budgets(c, lim)
    end
    callers[i] = c
    if not caller_refused and lim[11] ~= 1 then
      local w, d, mm = c.pairs[1], c.pairs[2], c.pairs[3]
      caller_refused = (lim[0] >= 0 and c.parallel + 1 > lim[0])
        or over_by(lim[1], lim[2], w, creserve) or over_by(-1, lim[3], d, creserve)
        or over_by(lim[4], lim[5], mm, creserve)
      for _, e in ipairs(c.budgets) do
        caller_refused = caller_refused or (e.max >= 0 and e.committed >= e.max)
      end
    end
  end
end

-- Integer ceil(a / b) for a >= 0, b > 0, exact in doubles below 2^53.
local function div_ceil(a, b)
  local r = a % b
  local quotient = (a - r) / b
  if r > 0 then quotient = quotient + 1 end
  return quotient
end

-- The floors rule (queue on, strict mode; `FloorPeriod` in decision/mod.rs): over a period (the
-- model's window when fixed, the current slot when sliding), after this request the period
-- keeps for every other pool what it has not used of its floor, up to its floor x the fraction
-- of the period left (rounded to the nearest, half up). Mirrors `Floors::check`.
local n = tonumber(ARGV[15]) or 0
local me = tonumber(ARGV[16]) or 0
-- On a fixed window the rule holds below the threshold too, for the pools already counted in
-- the window (`generous_floors` in `decide`).
local generous_floors = pp ~= '' and not strict and not sliding
local periods, period, left = 1, window, window
if sliding then
  periods, period = RING - 1, slot_ms
  left = slot_ms - now % slot_ms
elseif m.start ~= nil and now < m.start + window then
  left = m.start + window - now
end
-- Each pool's usage in the period: the open window (fixed) or the current slot (sliding).
local pools_used = {}
local function period_used(c)
  if sliding then return {r = c.cur_r, k = c.cur_k} end
  return {r = c.r, k = c.k}
end
local function floor_of(j, d)
  local v = tonumber(ARGV[17 + 3 * j + (d == 'r' and 1 or 2)])
  if v == nil or v < 0 then return 0 end
  return v
end
-- Whether this request takes more than its own pool's floor in the period in dimension `d`
-- (`cost` of it): it borrows from the others' floors.
local function borrows_in(d, cost)
  local cap = rpm
  if d == 'k' then cap = tpm end
  local own_floor = floor_of(me, d)
  own_floor = (own_floor - own_floor % periods) / periods
  return cap >= 0 and period_used(q)[d] + cost > own_floor
end
-- In either dimension, `cost_k` tokens.
local function borrows(cost_k)
  return borrows_in('r', 1) or borrows_in('k', cost_k)
end
local function floors_refuse()
  -- The other pools' period usage, in one read: a fixed window's start and counts, or a sliding
  -- window's head and the current slot's place (counted iff the head is this slot).
  local names, others = {}, {}
  for j = 0, n - 1 do
    if j ~= me then
      local p = ARGV[17 + 3 * j]
      others[#others + 1] = j
      if sliding then
        names[#names + 1] = p .. 'h'
        names[#names + 1] = p .. 'r' .. place_now
        names[#names + 1] = p .. 't' .. place_now
      else
        names[#names + 1] = p .. 's'
        names[#names + 1] = p .. 'r'
        names[#names + 1] = p .. 't'
      end
    end
  end
  local v = {}
  if #names > 0 then v = redis.call('HMGET', key, unpack(names)) end
  for i, j in ipairs(others) do
    local a = tonumber(v[3 * i - 2])
    local r, k = tonumber(v[3 * i - 1]) or 0, tonumber(v[3 * i]) or 0
    local counts
    if sliding then
      counts = a ~= nil and a >= slot
      if counts and a > slot then
        -- The clock stepped back: the head's own place (rare; one more read).
        local p = ARGV[17 + 3 * j]
        local w = redis.call('HMGET', key, p .. 'r' .. (a % RING), p .. 't' .. (a % RING))
        r, k = tonumber(w[1]) or 0, tonumber(w[2]) or 0
      end
    else
      counts = a ~= nil and now < a + window
    end
    if counts then pools_used[j] = {r = r, k = k} else pools_used[j] = {r = 0, k = 0} end
  end
  local model_used = period_used(m)
  for _, d in ipairs({'r', 'k'}) do
    local cap = rpm
    if d == 'k' then cap = tpm end
    local cost = 1
    if d == 'k' then cost = math.max(reserve, 1) end
    -- A period admits one request at least; a pool within its own floor is not borrowing.
    if model_used[d] > 0 and borrows_in(d, cost) then
      local protected = 0
      for j = 0, n - 1 do
        local u = pools_used[j] or {r = 0, k = 0}
        if j ~= me and not (generous_floors and u.r == 0 and u.k == 0) then
          local f = floor_of(j, d)
          f = (f - f % periods) / periods
          local unused = math.max(f - pools_used[j][d], 0)
          local num, den = 2 * f * left + math.max(period, 1), 2 * math.max(period, 1)
          local share = (num - num % den) / den
          protected = protected + math.min(share, unused)
        end
      end
      if cost > math.max(div_ceil(cap, periods) - model_used[d] - protected, 0) then
        return true
      end
    end
  end
  return false
end

local verdict = 0
if caller_refused then
  verdict = 4
elseif over(rpm, tpm, m) then
  verdict = 1
elseif strict and over(prpm, ptpm, q) then
  verdict = 2
elseif (strict or generous_floors) and n > 0 and floors_refuse() then
  verdict = 2
end
-- The fleet's order between the flows of the request's pool (`order::FlowClock`, kept here so
-- every gateway goes by one order): the last eight ARGV when the last is 'F' (flow id, its
-- service, this gateway's id, '1' when an admission ends this gateway's registration of the
-- flow (no other waiter of the flow here), how long it may wait in ms (0: it does not wait), the
-- flow state's TTL in ms, the wake-up channel, 'F'); the last 2 max(n, 1) KEYS are every pool's
-- pair, in the pools' order: its waiting flows (a sorted set, score: the flow's virtual
-- service) and its flow state (hash:
-- c<flow> virtual service, n<flow> gateways holding a registration of it, h<flow>:<gateway> a
-- gateway's registration (the flow's generation g<flow> when it was made), e<flow> when the
-- last of its waiters gives up, V the virtual time). An admission the capacity allows is
-- refused (verdict 5) unless its flow is the head of the order (the least served waiting
-- flow); a refused request that may wait registers its flow for its gateway (once per
-- gateway, however many of its requests race), so the others go by it too.
-- Whether pool j has a flow waiting anywhere in the fleet (a registration not past its
-- deadline among the first few of its order; a lapsed head is dropped by that pool's next try).
local function pool_waits(fk, j)
  local zk, hk = KEYS[fk + 2 * j], KEYS[fk + 2 * j + 1]
  for _, f in ipairs(redis.call('ZRANGE', zk, 0, 3)) do
    if (tonumber(redis.call('HGET', hk, 'e' .. f)) or 0) > now then return true end
  end
  return false
end
-- Pool j's usage over the window (as the window counts it at `now`).
local function window_used(j)
  local p = ARGV[17 + 3 * j]
  local c
  if sliding then
    c = read_sliding(key, p, redis.call('HMGET', key, p .. 'h', p .. 'R', p .. 'T',
      p .. 'r' .. place_now, p .. 't' .. place_now), window, slot_ms)
  else
    c = read_fixed(key, p, redis.call('HMGET', key, p .. 's', p .. 'r', p .. 't'), window)
  end
  return {r = c.r, k = c.k}
end
-- `order::fill`: pool j's used / floor, the larger over the model's limited dimensions, with
-- `plus_r` requests and `plus_k` tokens more (a floor of 0: 1 while unused, else infinite).
local function fill(j, u, plus_r, plus_k)
  local best = 0
  for _, d in ipairs({{'r', 1, plus_r}, {'k', 2, plus_k}}) do
    local f = tonumber(ARGV[17 + 3 * j + d[2]]) or -1
    local used = u[d[1]] + d[3]
    local x = 0
    if f == 0 and used == 0 then
      x = 1
    elseif f == 0 then
      x = math.huge
    elseif f > 0 then
      x = used / f
    end
    if x > best then best = x end
  end
  return best
end

if ARGV[#ARGV] == 'F' and ARGV[14] ~= 's' and verdict ~= 4 then
  local fa = #ARGV - 7
  local fk = #KEYS - 2 * math.max(n, 1) + 1
  local fz, fh = KEYS[fk + 2 * me], KEYS[fk + 2 * me + 1]
  local flow, service = ARGV[fa], tonumber(ARGV[fa + 1])
  local mine, release = 'h' .. flow .. ':' .. ARGV[fa + 2], ARGV[fa + 3] == '1'
  local may_wait = tonumber(ARGV[fa + 4])
  -- The least served flow still waiting; registrations past their deadline are dropped (a
  -- gateway that died does not hold the order up for longer than its waiters could wait) and
  -- the flow's generation moves on, so the gateways' registrations of it count no more.
  local head, head_c
  while true do
    local h = redis.call('ZRANGE', fz, 0, 0, 'WITHSCORES')
    if #h == 0 then break end
    if (tonumber(redis.call('HGET', fh, 'e' .. h[1])) or 0) > now then
      head, head_c = h[1], tonumber(h[2])
      break
    end
    redis.call('ZREM', fz, h[1])
    redis.call('HDEL', fh, 'n' .. h[1], 'e' .. h[1])
    redis.call('HINCRBY', fh, 'g' .. h[1], 1)
  end
  local st = redis.call('HMGET', fh, 'c' .. flow, 'n' .. flow, 'V', 'g' .. flow, mine)
  local c, waiting, vt = tonumber(st[1]), tonumber(st[2]) or 0, tonumber(st[3]) or 0
  local gen = st[4] or '0'
  local held = st[5] == gen and waiting > 0
  -- A flow that was not waiting starts at the least waiting counter (or the virtual time):
  -- time spent idle is not saved up as credit.
  if waiting <= 0 then c = math.max(c or 0, head_c or vt) end
  c = c or vt
  -- A flow goes while it is less than one request ahead of the head (the least served waiting
  -- flow): flows level with the head go together, each gateway without waiting for the
  -- others' wake-ups, and no flow gets more than a request ahead of another that waits.
  if verdict == 0 and head ~= nil and head ~= flow and c >= head_c + service then verdict = 5 end
  -- The order between priorities (`order::first_pool`), fleet-wide: a request that borrows
  -- (takes more than its own floor in the period) is refused while another priority waiting
  -- anywhere would go first even after one more request of its own (its fill then below this
  -- one's, or level and listed first). Within its floor a priority never waits for the order,
  -- so no floor is held up by it.
  local others_wait = false
  if verdict == 0 and anyone_waits then
    local cost_k = math.max(reserve, 1)
    local own = borrows(cost_k) and fill(me, {r = q.r, k = q.k}, 0, 0)
    for j = 0, n - 1 do
      if j ~= me and pool_waits(fk, j) then
        others_wait = true
        if verdict == 0 and own then
          local theirs = fill(j, window_used(j), 1, cost_k)
          if theirs < own or (theirs == own and j < me) then verdict = 5 end
        end
      end
    end
  end
  if verdict == 0 then
    local after = c + service
    redis.call('HSET', fh, 'c' .. flow, after, 'V', math.max(vt, c))
    if held and release then
      redis.call('HDEL', fh, mine)
      waiting = redis.call('HINCRBY', fh, 'n' .. flow, -1)
      if waiting <= 0 then
        redis.call('ZREM', fz, flow)
        redis.call('HDEL', fh, 'n' .. flow, 'e' .. flow)
      end
    end
    if waiting > 0 then redis.call('ZADD', fz, after, flow) end
    -- The head, or the priorities' fills, may have changed: the other gateways' waiters look
    -- again.
    if others_wait or (head ~= nil and redis.call('ZCARD', fz) > 0) then
      redis.call('PUBLISH', ARGV[fa + 6], flow)
    end
  elseif may_wait > 0 then
    if not held then
      redis.call('HSET', fh, mine, gen)
      redis.call('HINCRBY', fh, 'n' .. flow, 1)
      redis.call('ZADD', fz, c, flow)
    end
    -- Kept at least until this waiter's deadline.
    local e = tonumber(redis.call('HGET', fh, 'e' .. flow)) or 0
    redis.call('HSET', fh, 'c' .. flow, c, 'e' .. flow, math.max(e, now + may_wait))
    -- Settlements of the model publish a wake-up while someone may wait (settle.lua).
    local wq = tonumber(redis.call('HGET', key, 'wq')) or 0
    if now + may_wait > wq then
      redis.call('HSET', key, 'wq', now + may_wait)
      if redis.call('PTTL', key) < 0 then redis.call('PEXPIRE', key, tonumber(ARGV[9])) end
    end
  end
  local ttl = tonumber(ARGV[fa + 5])
  redis.call('PEXPIRE', fh, ttl)
  redis.call('PEXPIRE', fz, ttl)
end

-- Shadow enforcement: the refusal is only reported (the Rust side re-derives it), the request
-- counts like any admission.
if ARGV[14] == 's' then verdict = 0 end

-- What the floors rule read of each pool, for the Rust side to re-derive the decision.
local function add_pools_used(reply)
  for j = 0, n - 1 do
    local u = pools_used[j] or {r = 0, k = 0}
    reply[#reply + 1] = u.r
    reply[#reply + 1] = u.k
  end
end

-- Counts one admission reserving `res` tokens on pair `c` (prefix `p`) of hash `hk`; a window
-- not open starts at `opens` (a pool's: its model's start, `Window::open_following`).
local function count_fixed(hk, p, c, win, res, opens)
  if c.start ~= nil and now < c.start + win then
    redis.call('HINCRBY', hk, p .. 'r', 1)
    if res > 0 then redis.call('HINCRBY', hk, p .. 't', res) end
  else
    redis.call('HSET', hk, p .. 's', opens, p .. 'r', 1, p .. 't', res)
  end
end
local function count_sliding(hk, p, c, res)
  local cleared = {}
  for _, place in ipairs(c.gone) do
    cleared[#cleared + 1] = p .. 'r' .. place
    cleared[#cleared + 1] = p .. 't' .. place
  end
  if #cleared > 0 then redis.call('HDEL', hk, unpack(cleared)) end
  -- The newest slot: the current one, or the head if the clock stepped back. One write.
  local place = c.head % RING
  redis.call('HSET', hk, p .. 'h', c.head, p .. 'R', c.r + 1, p .. 'T', c.k + res,
    p .. 'r' .. place, c.cur_r + 1, p .. 't' .. place, c.cur_k + res)
end

-- Appends to `reply` the 31 (requests, tokens) places of pair `c` (prefix `p`) of hash `hk` as
-- they count at `now` (the places that left the window as zeros); `read` false: zeros only.
local function push_ring(reply, hk, p, c, read)
  local v = {}
  if read then
    local names = {}
    for place = 0, RING - 1 do
      names[#names + 1] = p .. 'r' .. place
      names[#names + 1] = p .. 't' .. place
    end
    v = redis.call('HMGET', hk, unpack(names))
  end
  local dropped = {}
  for _, place in ipairs(c.gone) do dropped[place] = true end
  for place = 0, RING - 1 do
    if dropped[place] then
      reply[#reply + 1] = 0
      reply[#reply + 1] = 0
    else
      reply[#reply + 1] = tonumber(v[2 * place + 1]) or 0
      reply[#reply + 1] = tonumber(v[2 * place + 2]) or 0
    end
  end
end

-- The callers' part of the reply, and on an admission their counts.
local function callers_reply(reply)
  if nc == 0 then return end
  local creserve = tonumber(ARGV[cb + 1])
  for i = 0, nc - 1 do
    local c = callers[i]
    reply[#reply + 1] = c.parallel
    for _, pr in ipairs(c.pairs) do
      if sliding then
        reply[#reply + 1] = pr.head or -1
        reply[#reply + 1] = pr.r
        reply[#reply + 1] = pr.k
      else
        reply[#reply + 1] = pr.start or -1
        reply[#reply + 1] = pr.raw_r
        reply[#reply + 1] = pr.raw_k
      end
    end
    for _, e in ipairs(c.budgets) do
      reply[#reply + 1] = e.raw_p
      reply[#reply + 1] = e.s
      reply[#reply + 1] = e.r
    end
    if verdict == 0 then
      -- Every counted pair of the caller in one HDEL and one HSET (the values are known from
      -- the read): the same writes as count_fixed / count_sliding, in two calls, not six.
      local sets, dels = {}, {}
      for j, pr in ipairs(c.pairs) do
        if c.has[j] then
          local p = pr.p
          if sliding then
            for _, place in ipairs(pr.gone) do
              dels[#dels + 1] = p .. 'r' .. place
              dels[#dels + 1] = p .. 't' .. place
            end
            local place = pr.head % RING
            for _, v in ipairs({p .. 'h', pr.head, p .. 'R', pr.r + 1, p .. 'T', pr.k + creserve,
              p .. 'r' .. place, pr.cur_r + 1, p .. 't' .. place, pr.cur_k + creserve}) do
              sets[#sets + 1] = v
            end
          elseif pr.start ~= nil and now < pr.start + pr.win then
            for _, v in ipairs({p .. 'r', pr.raw_r + 1, p .. 't', pr.raw_k + creserve}) do
              sets[#sets + 1] = v
            end
          else
            for _, v in ipairs({p .. 's', now, p .. 'r', 1, p .. 't', creserve}) do
              sets[#sets + 1] = v
            end
          end
        end
      end
      -- The cost reserved on each budget, in the request's period (a newer one starts empty).
      local cost = tonumber(ARGV[cb + 8])
      for _, e in ipairs(c.budgets) do
        if e.max >= 0 then
          local p, s, r = e.raw_p, e.s, e.r
          if e.period > p then p, s, r = e.period, 0, 0 end
          for _, v in ipairs({e.p .. 'p', p, e.p .. 's', s, e.p .. 'r', r + cost}) do
            sets[#sets + 1] = v
          end
        end
      end
      if #dels > 0 then redis.call('HDEL', c.hk, unpack(dels)) end
      if #sets > 0 then redis.call('HSET', c.hk, unpack(sets)) end
      if c.ttl < 0 then
        redis.call('PERSIST', c.hk)
      else
        redis.call('PEXPIRE', c.hk, c.ttl)
      end
      if c.slots then
        local lease = tonumber(ARGV[cb + 6])
        redis.call('ZADD', c.zk, now + lease, ARGV[cb + 5])
        redis.call('PEXPIRE', c.zk, lease)
        -- What this admission reserved on the budgets, given back if its slot lapses.
        local periods = {-1, -1}
        for j, e in ipairs(c.budgets) do
          if e.max >= 0 then periods[j] = math.max(e.period, e.raw_p) end
        end
        if cost > 0 and (periods[1] >= 0 or periods[2] >= 0) then
          redis.call('HSET', c.hk, 'x' .. ARGV[cb + 5],
            string.format('%d %d %d %s', cost, periods[1], periods[2], ARGV[cb + 7]))
          if c.ttl >= 0 then redis.call('PEXPIRE', c.hk, c.ttl) end
        end
      end
    end
  end
  if verdict == 4 and sliding then
    for i = 0, nc - 1 do
      for j, pr in ipairs(callers[i].pairs) do
        push_ring(reply, callers[i].hk, pr.p, pr, callers[i].has[j])
      end
    end
  end
end

if not sliding then
  if verdict == 0 and not callers_only then
    count_fixed(key, 'm', m, window, reserve, now)
    -- The pool's window keeps the model's (`Window::open_following`): it opens where the model's
    -- did, so the two roll together.
    local mstart = now
    if m.start ~= nil and now < m.start + window then mstart = m.start end
    if pp ~= '' then count_fixed(key, pp, q, window, reserve, mstart) end
    -- Every window in this hash ends by now + window, so nothing outlives its use.
    redis.call('PEXPIRE', key, tonumber(ARGV[9]))
  end
  local reply = {now, m.start or -1, m.raw_r, m.raw_k, q.start or -1, q.raw_r, q.raw_k, verdict}
  add_pools_used(reply)
  callers_reply(reply)
  return reply
end

if verdict == 0 and not callers_only then
  count_sliding(key, 'm', m, reserve)
  if pp ~= '' then count_sliding(key, pp, q, reserve) end
  -- Every slot in this hash leaves the window by now + window + a slot; the TTL (window + a slot
  -- + a margin of at least a slot) is renewed when the model's newest slot changes, which is
  -- often enough.
  if m.start ~= m.head then redis.call('PEXPIRE', key, tonumber(ARGV[9])) end
end
local reply = {now, m.head, m.r, m.k, q.head or -1, q.r, q.k, verdict}
add_pools_used(reply)
-- Refused: the rings too, as they count at `now`, so retry-after can be computed from them.
if verdict ~= 0 and not callers_only then
  push_ring(reply, key, 'm', m, true)
  if pp ~= '' then
    push_ring(reply, key, pp, q, true)
  else
    for _ = 1, 2 * RING do reply[#reply + 1] = 0 end
  end
end
callers_reply(reply)
return reply
