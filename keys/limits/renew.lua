-- Renew a running request's concurrency slot: its lease now ends lease ms from the server's clock.
-- The slot is added again if it was gone (Redis restarted without its data, or a stall outlived the
-- lease): the request still runs, so it still counts.
-- KEYS: 1 in flight (zset id->lease end). ARGV: request id, lease ms. Returns 1.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease)
return 1
