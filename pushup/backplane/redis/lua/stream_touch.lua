-- A read renewed a sliding TTL: the later deadline, kept (no new version).
local m = ARGV[1] .. ARGV[2] .. ':m'
local deadline = redis.call('HGET', m, 'deadline')
if redis.call('EXISTS', m) == 1 and (not deadline or tonumber(deadline) < tonumber(ARGV[3])) then
  redis.call('HSET', m, 'deadline', ARGV[3])
  if ARGV[4] ~= '' then
    redis.call('PEXPIREAT', m, ARGV[4])
    redis.call('PEXPIREAT', ARGV[1] .. ARGV[2] .. ':l', ARGV[4])
    if redis.call('GET', KEYS[1]) == ARGV[2] then redis.call('PEXPIREAT', KEYS[1], ARGV[4]) end
  end
end
return 1
