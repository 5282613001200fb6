-- The start of log_check.lua and log_publish.lua (pushup.backplane.redis.partitions
-- joins it to each): the log is checked against the calling node. KEYS log,
-- meta; ARGV the calling node's salt (0 to 1295), MAXLEN, the epoch the node
-- holds ("" if none) and its horizon in it. A log with no meta (Redis
-- restarted empty), or with fewer entries than the node already read (a
-- restart with appendfsync everysec, a failover to a replica that lagged),
-- starts again under a new epoch, so no sequence number is ever reused for
-- another message. The epoch is Redis's own milliseconds (TIME) times 1296
-- plus the salt, in base 36 (past the calling node's epoch if that is not
-- less): one clock makes every epoch of a partition, so a newer epoch is a
-- greater number (pushup.core.origins tells a cursor naming an older one that
-- its log is gone), whichever node's clock is behind.
local epoch = redis.call('HGET', KEYS[2], 'e')
local seq = tonumber(redis.call('HGET', KEYS[2], 's') or '0')
if (not epoch) or (epoch == ARGV[3] and seq < tonumber(ARGV[4])) then
  local clock = redis.call('TIME')
  local n = (tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)) * 1296
            + tonumber(ARGV[1])
  local held = tonumber(ARGV[3], 36)  -- never the epoch the node holds, nor one before it
  if held and n <= held then n = held + 1 end
  local digits = '0123456789abcdefghijklmnopqrstuvwxyz'
  epoch = ''
  repeat  -- exact: n < 2^53 for millions of years
    local d = n % 36
    epoch = string.sub(digits, d + 1, d + 1) .. epoch
    n = (n - d) / 36
  until n == 0
  seq = 0
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[2], 'e', epoch, 's', 0)
  redis.call('HSETNX', KEYS[2], 't', 0)
end
