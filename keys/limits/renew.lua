-- Renew a running request's concurrency slots: their leases now end lease ms from the server's clock.
-- A slot is added again if it was gone (Redis restarted without its data, or a stall outlived the
-- lease): the request still runs, so it still counts.
-- KEYS: in flight (zset id->lease end), one per scope with a concurrency limit. ARGV: request id, lease ms.
-- Returns 1.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local lease = tonumber(ARGV[2])
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, now + lease, ARGV[1])
  redis.call('PEXPIRE', key, lease)
end
return 1
