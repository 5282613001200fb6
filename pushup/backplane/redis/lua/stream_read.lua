-- The stream at a path (ARGV[2] "") or a given uid: where the path points,
-- the uid, its version, state, deadline, last write's mark (w), how many
-- appends Redis holds, the head of the append before ARGV[4] (when the state
-- is sent: the node checks its cache is what Redis holds), then its appends
-- from ARGV[4] on (all of them when ARGV[3] is not the uid the cache holds).
-- The state is "" when the cache holds this version and mark (ARGV[5],
-- ARGV[6]) already: nothing was written since. A path pointing to another
-- slot answers only its pointer: the uid is read there.
local at = redis.call('GET', KEYS[1]) or ''
local uid = ARGV[2]
if uid == '' then
  if string.find(at, '/', 1, true) then return {at} end
  uid = at
end
if uid == '' then return {at} end
local m = ARGV[1] .. uid
local meta = redis.call('HMGET', m .. ':m', 'v', 'state', 'deadline', 'w')
if not meta[1] then return {at} end
local from = 0
if uid == ARGV[3] then from = tonumber(ARGV[4]) end
local state = meta[2]
local held = uid == ARGV[3] and meta[1] == ARGV[5] and (meta[4] or '') == ARGV[6]
if held then state = '' end
local count = redis.call('LLEN', m .. ':l')
local before = ''
if not held and from > 0 and from <= count then
  local item = redis.call('LINDEX', m .. ':l', from - 1)
  before = string.sub(item, 1, (string.find(item, '\n', 1, true) or 1) - 1)
end
local out = {at, uid, meta[1], state, meta[3] or '', meta[4] or '', count, before}
local appends = redis.call('LRANGE', m .. ':l', from, -1)
for i = 1, #appends do out[#out + 1] = appends[i] end
return out
