-- Replace a request's token and cost reservations with what it used and free its concurrency slot,
-- in each of its scopes.
-- KEYS: 5 per scope: token amounts, token sum, in flight, month tokens, budget spend.
-- ARGV: request id, used tokens, reserved tokens, used cost, reserved cost.
local id = ARGV[1]
local used, reserved = tonumber(ARGV[2]), tonumber(ARGV[3])
local cost, reserved_cost = tonumber(ARGV[4]), tonumber(ARGV[5])
for k = 0, #KEYS - 1, 5 do
  redis.call('ZREM', KEYS[k + 3], id)
  local held = redis.call('HGET', KEYS[k + 1], id)
  if held and redis.call('EXISTS', KEYS[k + 2]) == 1 then
    redis.call('HSET', KEYS[k + 1], id, used)
    redis.call('INCRBY', KEYS[k + 2], used - tonumber(held))
  end
  if redis.call('EXISTS', KEYS[k + 4]) == 1 then
    redis.call('INCRBY', KEYS[k + 4], used - reserved)
  end
  if redis.call('EXISTS', KEYS[k + 5]) == 1 then
    redis.call('INCRBY', KEYS[k + 5], cost - reserved_cost)
  end
end
return 1
