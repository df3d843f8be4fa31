-- Check every limit of a request's scopes (its key's, its user's) and, unless one refuses (or a dry
-- run), count the request and reserve its tokens and cost in every scope: one round trip, atomic,
-- timed by the Redis server's clock.
-- KEYS: 7 per scope: requests (zset id->ms), tokens (zset id->ms), token amounts (hash id->tokens),
-- token sum, in flight (zset id->lease end), month tokens, budget spend.
-- ARGV: request id, tokens, cost, window ms, lease ms, dry run, then 5 per scope: rpm, tpm,
-- max concurrent, monthly tokens, budget.
-- Returns {refusal (0 none, 1 quota, 2 budget, 3 too large, 4 concurrency, 5 requests, 6 tokens),
-- index of the refusing scope (0-based), retry ms, then 7 per scope: requests, tokens, in flight,
-- month tokens (-1 unknown), spend (-1 unknown), reset requests ms, reset tokens ms},
-- or {-1} when a month or budget counter must be seeded first.  keys/limits/local.py is the same in Python.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local id, tokens, cost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local window, lease, dry_run = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6] == '1'
local cutoff = now - window

local scopes = {}
for s = 0, #KEYS / 7 - 1 do
  local k, a = s * 7, 6 + s * 5
  local scope = {
    requests_key = KEYS[k + 1], tokens_key = KEYS[k + 2], amounts_key = KEYS[k + 3], sum_key = KEYS[k + 4],
    in_flight_key = KEYS[k + 5], month_key = KEYS[k + 6], spend_key = KEYS[k + 7],
    rpm = tonumber(ARGV[a + 1]), tpm = tonumber(ARGV[a + 2]), concurrency = tonumber(ARGV[a + 3]),
    monthly = tonumber(ARGV[a + 4]), budget = tonumber(ARGV[a + 5]),
  }
  redis.call('ZREMRANGEBYSCORE', scope.requests_key, '-inf', cutoff)
  scope.requests = redis.call('ZCARD', scope.requests_key)
  local expired = redis.call('ZRANGEBYSCORE', scope.tokens_key, '-inf', cutoff)
  if #expired > 0 then
    local freed = 0
    for first = 1, #expired, 500 do
      local batch = {unpack(expired, first, math.min(first + 499, #expired))}
      for _, amount in ipairs(redis.call('HMGET', scope.amounts_key, unpack(batch))) do
        freed = freed + (tonumber(amount) or 0)
      end
      redis.call('HDEL', scope.amounts_key, unpack(batch))
    end
    redis.call('ZREMRANGEBYSCORE', scope.tokens_key, '-inf', cutoff)
    redis.call('DECRBY', scope.sum_key, freed)
  end
  scope.used_tokens = tonumber(redis.call('GET', scope.sum_key) or '0')
  redis.call('ZREMRANGEBYSCORE', scope.in_flight_key, '-inf', now)
  scope.in_flight = redis.call('ZCARD', scope.in_flight_key)
  local month, spend = redis.call('GET', scope.month_key), redis.call('GET', scope.spend_key)
  if (not month or not spend) and not dry_run then return {-1} end
  scope.month, scope.spend = tonumber(month or '-1'), tonumber(spend or '-1')
  scopes[#scopes + 1] = scope
end

-- Each check returns {refusal, retry ms} or nil; each runs over every scope before the next.
local function quota(scope)
  if scope.monthly > 0 and scope.month + tokens > scope.monthly then return {1, 0} end
end
local function budget(scope)
  if scope.budget > 0 and scope.spend + cost > scope.budget then return {2, 0} end
end
local function too_large(scope)
  if scope.tpm > 0 and tokens > scope.tpm then return {3, 0} end
end
local function concurrency(scope)
  if scope.concurrency > 0 and scope.in_flight >= scope.concurrency then return {4, 1000} end
end
local function requests(scope)
  if scope.rpm > 0 and scope.requests >= scope.rpm then
    local offset = scope.requests - scope.rpm
    local freeing = redis.call('ZRANGE', scope.requests_key, offset, offset, 'WITHSCORES')
    return {5, math.max(1, tonumber(freeing[2]) + window - now)}
  end
end
local function too_many_tokens(scope)
  if not (scope.tpm > 0 and scope.used_tokens + tokens > scope.tpm) then return nil end
  local needed, offset = scope.used_tokens + tokens - scope.tpm, 0
  while needed > 0 do
    local entries = redis.call('ZRANGE', scope.tokens_key, offset, offset + 99, 'WITHSCORES')
    if #entries == 0 then break end
    for i = 1, #entries, 2 do
      needed = needed - (tonumber(redis.call('HGET', scope.amounts_key, entries[i])) or 0)
      if needed <= 0 then return {6, math.max(1, tonumber(entries[i + 1]) + window - now)} end
    end
    offset = offset + 100
  end
  return {6, window}
end

local refusal, refused_by, retry = 0, 0, 0
if not dry_run then
  for _, check in ipairs({quota, budget, too_large, concurrency, requests, too_many_tokens}) do
    for index, scope in ipairs(scopes) do
      local found = check(scope)
      if found then
        refusal, refused_by, retry = found[1], index - 1, found[2]
        break
      end
    end
    if refusal ~= 0 then break end
  end
end

local reply = {refusal, refused_by, retry}
for _, scope in ipairs(scopes) do
  if refusal == 0 and not dry_run then
    if scope.rpm > 0 then
      redis.call('ZADD', scope.requests_key, now, id)
      redis.call('PEXPIRE', scope.requests_key, window)
      scope.requests = scope.requests + 1
    end
    if scope.tpm > 0 then
      redis.call('ZADD', scope.tokens_key, now, id)
      redis.call('HSET', scope.amounts_key, id, tokens)
      redis.call('INCRBY', scope.sum_key, tokens)
      for _, key in ipairs({scope.tokens_key, scope.amounts_key, scope.sum_key}) do
        redis.call('PEXPIRE', key, window)
      end
      scope.used_tokens = scope.used_tokens + tokens
    end
    if scope.concurrency > 0 then
      redis.call('ZADD', scope.in_flight_key, now + lease, id)
      redis.call('PEXPIRE', scope.in_flight_key, lease)
      scope.in_flight = scope.in_flight + 1
    end
    scope.month = redis.call('INCRBY', scope.month_key, tokens)
    scope.spend = redis.call('INCRBY', scope.spend_key, cost)
  end
  local reset_requests, reset_tokens = 0, 0
  if scope.requests > 0 then
    local newest = redis.call('ZRANGE', scope.requests_key, -1, -1, 'WITHSCORES')
    reset_requests = tonumber(newest[2]) + window - now
  end
  if scope.used_tokens > 0 then
    local newest = redis.call('ZRANGE', scope.tokens_key, -1, -1, 'WITHSCORES')
    if #newest > 0 then reset_tokens = tonumber(newest[2]) + window - now end
  end
  for _, value in ipairs({scope.requests, scope.used_tokens, scope.in_flight, scope.month, scope.spend,
                          reset_requests, reset_tokens}) do
    reply[#reply + 1] = value
  end
end
return reply
