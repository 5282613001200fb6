-- A fork its family's script created answers at its path now: KEYS[1] (the
-- path's at) is set to the pointer ARGV[2] if it still holds ARGV[1], as
-- read when the creation was decided (1), else nothing changes (0).
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
