-- Replace a request's token reservation with the tokens it used and free its concurrency slot.
-- KEYS: 1 token amounts, 2 token sum, 3 in flight, 4 month counter. ARGV: request id, used, reserved.
redis.call('ZREM', KEYS[3], ARGV[1])
local used, reserved = tonumber(ARGV[2]), tonumber(ARGV[3])
local held = redis.call('HGET', KEYS[1], ARGV[1])
if held and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[1], ARGV[1], used)
  redis.call('INCRBY', KEYS[2], used - tonumber(held))
end
if redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('INCRBY', KEYS[4], used - reserved)
end
return 1
