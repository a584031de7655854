-- One admission, all-or-nothing: the check and increment of `decide()` on one model's hash.
-- It mirrors `decide` in decision.rs; the Rust side re-derives the whole decision (headers,
-- retry-after) from the pre-admission counters returned here and counts any disagreement.
--
-- KEYS[1]  the model's hash: fields <p>s (window start, ms), <p>r (requests), <p>t (tokens) for
--          the model-wide pair (p = "m") and each pool pair (p = ARGV[4]).
-- ARGV     window_ms, rpm, tpm, pool prefix ("" = no pools), pool rpm, pool tpm
--          (limits: -1 = none), saturation threshold, tokens to reserve, key TTL in ms,
--          deadline: the caller's deadline on this server's TIME in ms (-1 = none).
-- Returns  {now, model start (-1 = none), model requests, model tokens,
--           pool start (-1 = none), pool requests, pool tokens, verdict}
--          verdict: 0 admitted and counted, 1 refused by the model cap, 2 refused by the pool,
--          3 expired: run after the caller's deadline (it has given up), nothing read or changed.
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
local reserve = tonumber(ARGV[8])

local f
if pp ~= '' then
  f = redis.call('HMGET', key, 'ms', 'mr', 'mt', pp .. 's', pp .. 'r', pp .. 't')
else
  f = redis.call('HMGET', key, 'ms', 'mr', 'mt')
end
local ms, mr, mt = tonumber(f[1]), tonumber(f[2]) or 0, tonumber(f[3]) or 0
local ps, pr, pt = nil, 0, 0
if pp ~= '' then
  ps, pr, pt = tonumber(f[4]), tonumber(f[5]) or 0, tonumber(f[6]) or 0
end

local function current(s)
  return s ~= nil and now < s + window
end
local function usage(s, r, k)
  if current(s) then return r, k end
  return 0, 0
end
-- RPM is exact (refused iff requests + 1 > limit); TPM admits while recorded tokens < limit.
local function over(lr, lt, r, k)
  return (lr >= 0 and r + 1 > lr) or (lt >= 0 and k >= lt)
end

local ur, ut = usage(ms, mr, mt)
local verdict = 0
if over(rpm, tpm, ur, ut) then
  verdict = 1
elseif pp ~= '' then
  local saturation = 0
  if rpm >= 0 then saturation = math.max(saturation, ur / rpm) end
  if tpm >= 0 then saturation = math.max(saturation, ut / tpm) end
  if saturation >= threshold then
    local qr, qt = usage(ps, pr, pt)
    if over(prpm, ptpm, qr, qt) then verdict = 2 end
  end
end

if verdict == 0 then
  local function count(p, s)
    if current(s) then
      redis.call('HINCRBY', key, p .. 'r', 1)
      if reserve > 0 then redis.call('HINCRBY', key, p .. 't', reserve) end
    else
      redis.call('HSET', key, p .. 's', now, p .. 'r', 1, p .. 't', reserve)
    end
  end
  count('m', ms)
  if pp ~= '' then count(pp, ps) end
  -- Every window in this hash ends by now + window, so nothing outlives its use.
  redis.call('PEXPIRE', key, tonumber(ARGV[9]))
end

return {now, ms or -1, mr, mt, ps or -1, pr, pt, verdict}
