-- Check every limit of one key and, unless refused (or a dry run), count the request and
-- reserve its tokens: one round trip, atomic, timed by the Redis server's clock.
-- KEYS: 1 requests (zset id->ms), 2 tokens (zset id->ms), 3 token amounts (hash id->tokens),
-- 4 token sum, 5 in flight (zset id->lease end), 6 month counter.
-- ARGV: request id, rpm, tpm, max concurrent, monthly tokens, tokens, window ms, lease ms, dry run.
-- Returns {refusal (0 none, 1 quota, 2 too large, 3 concurrency, 4 requests, 5 tokens), requests,
-- tokens, in flight, month tokens (-1 unknown), reset requests ms, reset tokens ms, retry ms},
-- or {-1} when the month counter must be seeded first.  keys/limits/local.py is the same in Python.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local id = ARGV[1]
local rpm, tpm, concurrency, monthly = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local tokens, window, lease, dry_run = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9] == '1'
local cutoff = now - window

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff)
local requests = redis.call('ZCARD', KEYS[1])

local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', cutoff)
if #expired > 0 then
  local freed = 0
  for first = 1, #expired, 500 do
    local batch = {unpack(expired, first, math.min(first + 499, #expired))}
    for _, amount in ipairs(redis.call('HMGET', KEYS[3], unpack(batch))) do
      freed = freed + (tonumber(amount) or 0)
    end
    redis.call('HDEL', KEYS[3], unpack(batch))
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', cutoff)
  redis.call('DECRBY', KEYS[4], freed)
end
local used_tokens = tonumber(redis.call('GET', KEYS[4]) or '0')

redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
local in_flight = redis.call('ZCARD', KEYS[5])

local month = redis.call('GET', KEYS[6])
if not month and not dry_run then return {-1} end
month = tonumber(month or '-1')

local refusal, retry = 0, 0
if not dry_run then
  if monthly > 0 and month + tokens > monthly then
    refusal = 1
  elseif tpm > 0 and tokens > tpm then
    refusal = 2
  elseif concurrency > 0 and in_flight >= concurrency then
    refusal, retry = 3, 1000
  elseif rpm > 0 and requests >= rpm then
    local freeing = redis.call('ZRANGE', KEYS[1], requests - rpm, requests - rpm, 'WITHSCORES')
    refusal, retry = 4, math.max(1, tonumber(freeing[2]) + window - now)
  elseif tpm > 0 and used_tokens + tokens > tpm then
    refusal, retry = 5, window
    local needed, offset = used_tokens + tokens - tpm, 0
    while needed > 0 do
      local entries = redis.call('ZRANGE', KEYS[2], offset, offset + 99, 'WITHSCORES')
      if #entries == 0 then break end
      for i = 1, #entries, 2 do
        needed = needed - (tonumber(redis.call('HGET', KEYS[3], entries[i])) or 0)
        if needed <= 0 then
          retry = math.max(1, tonumber(entries[i + 1]) + window - now)
          break
        end
      end
      offset = offset + 100
    end
  end
end

if refusal == 0 and not dry_run then
  if rpm > 0 then
    redis.call('ZADD', KEYS[1], now, id)
    redis.call('PEXPIRE', KEYS[1], window)
    requests = requests + 1
  end
  if tpm > 0 then
    redis.call('ZADD', KEYS[2], now, id)
    redis.call('HSET', KEYS[3], id, tokens)
    redis.call('INCRBY', KEYS[4], tokens)
    for k = 2, 4 do redis.call('PEXPIRE', KEYS[k], window) end
    used_tokens = used_tokens + tokens
  end
  if concurrency > 0 then
    redis.call('ZADD', KEYS[5], now + lease, id)
    redis.call('PEXPIRE', KEYS[5], lease)
    in_flight = in_flight + 1
  end
  month = redis.call('INCRBY', KEYS[6], tokens)
end

local reset_requests, reset_tokens = 0, 0
if requests > 0 then
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  reset_requests = tonumber(newest[2]) + window - now
end
if used_tokens > 0 then
  local newest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  if #newest > 0 then reset_tokens = tonumber(newest[2]) + window - now end
end
return {refusal, requests, used_tokens, in_flight, month, reset_requests, reset_tokens, retry}
