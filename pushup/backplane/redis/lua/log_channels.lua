-- After log_checked.lua: some channels of the partition, read from their own
-- streams. KEYS: log, meta, channels, the foreign hash. ARGV after the four
-- log_checked.lua reads: the most entries read per channel; then per channel
-- its name and the sequence number after which to read (ignored, 0, when the
-- log is not at the epoch the node holds: everything of the new epoch is read).
-- Returns {epoch, seq, then per channel {explicit, foreign, entries}}: the
-- channels hash's entry (false if none), the foreign hash's (false if none),
-- and the newest entries after the given seq, at most the given count,
-- newest first, each {id, {t, ., k, ., c, ., d, ., p, .}} as XREVRANGE gives.
-- All of one moment: every entry the partition appended up to seq is there.
local fresh = epoch ~= ARGV[3]
local streams = string.sub(KEYS[1], 1, -4) .. 'c:' .. epoch .. ':'
local out = {epoch, seq}
for i = 6, #ARGV, 2 do
  local name = ARGV[i]
  local after = fresh and '0' or ARGV[i + 1]
  out[#out + 1] = {
    redis.call('HGET', KEYS[3], name),
    redis.call('HGET', KEYS[4], name),
    redis.call('XREVRANGE', streams .. name, '+', '(' .. after .. '-0', 'COUNT', ARGV[5]),
  }
end
return out
