-- A fork its family's script dropped or unmapped: its pointer goes, unless
-- the path points elsewhere by now.
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
