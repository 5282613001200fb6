-- After log_checked.lua. KEYS: log, meta, channels, the foreign hash, and for
-- a keyed publish its key's entry. ARGV after the four log_checked.lua reads:
-- the body's fingerprint ("" for no key), the window in ms, how long (ms) a
-- channel's own stream outlives its last entry; then per entry: kind ("m"
-- message, "o" operation, "f" foreign note), c, d. An operation's d is {"op":
-- "create"|"renew"|"delete", "ttl", "expires_at"}; a foreign note's d the
-- other partition's number, appended only if the channel's list lacks it.
-- Appends every entry or none to the log and to the stream of each channel it
-- concerns (<prefix>c:<epoch>:<name>: the same id and fields, and p, that
-- channel's previous entry in the log, 0 for none), then notifies each
-- channel on its own sharded channel (<prefix>n:<name>: MessagePack [epoch,
-- seq, t, k, c, d, p, ...], the entries in log order, a run of one channel's
-- in one notification); returns {epoch, seq1, ts1, seq2, ts2, ...}, or an
-- error before writing anything if a create names an explicit channel that
-- exists. A key already used in this epoch appends nothing: it returns the
-- first attempt's reply with "again" at its end, or the error REUSED if that
-- attempt had another body.
if ARGV[5] ~= '' then
  local prior = redis.call('GET', KEYS[5])
  if prior then
    local first = cjson.decode(prior)
    if first['e'] == epoch then
      if first['f'] ~= ARGV[5] then
        return redis.error_reply('REUSED the key was used for another body')
      end
      local out = {epoch}
      if first['r'] then  -- written by an earlier version: every (seq, ts)
        for _, v in ipairs(first['r']) do out[#out + 1] = v end
      else
        local s, t = tonumber(first['s']), tonumber(first['t'])
        for j = 0, tonumber(first['n']) - 1 do
          out[#out + 1] = s + j
          out[#out + 1] = string.format('%d', t + j)
        end
      end
      out[#out + 1] = 'again'
      return out
    end
  end
end
for i = 8, #ARGV, 3 do
  if ARGV[i] == 'o' and cjson.decode(ARGV[i + 2])['op'] == 'create'
      and redis.call('HEXISTS', KEYS[3], ARGV[i + 1]) == 1 then
    return redis.error_reply('EXISTS ' .. ARGV[i + 1])
  end
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local last = tonumber(redis.call('HGET', KEYS[2], 't'))
local out = {epoch}
local prefix = string.sub(KEYS[1], 1, -4)  -- "pushup:{T}:" of "pushup:{T}:log"
local streams = prefix .. 'c:' .. epoch .. ':'
local told_to, told = nil, nil  -- the channel notified next, and its entries
local appended = false
local function tell()
  if told_to then redis.call('SPUBLISH', prefix .. 'n:' .. told_to, cmsgpack.pack(told)) end
end
for i = 8, #ARGV, 3 do
  local append = true
  if ARGV[i] == 'f' then
    local known = redis.call('HGET', KEYS[4], ARGV[i + 1])
    local list = known and cjson.decode(known) or {}
    for _, x in ipairs(list) do
      if x == ARGV[i + 2] then append = false end
    end
    if append then
      list[#list + 1] = ARGV[i + 2]
      redis.call('HSET', KEYS[4], ARGV[i + 1], cjson.encode(list))
    end
  end
  if append then
  seq = seq + 1
  if now <= last then now = last + 1 end
  last = now
  local t = string.format('%d', now)
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], string.format('%d-0', seq),
             't', t, 'k', ARGV[i], 'c', ARGV[i + 1], 'd', ARGV[i + 2])
  if ARGV[i] == 'o' then
    local op = cjson.decode(ARGV[i + 2])
    if op['op'] == 'delete' then
      redis.call('HDEL', KEYS[3], ARGV[i + 1])
    else
      redis.call('HSET', KEYS[3], ARGV[i + 1], ARGV[i + 2])
    end
  end
  out[#out + 1] = seq
  out[#out + 1] = t
  appended = true
  local names = ARGV[i] == 'm' and cjson.decode(ARGV[i + 1]) or {ARGV[i + 1]}
  for _, name in ipairs(names) do
    local key = streams .. name
    local newest = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)[1]
    local prev = newest and tonumber(string.match(newest[1], '^%d+')) or 0
    redis.call('XADD', key, 'MAXLEN', '~', ARGV[2], string.format('%d-0', seq),
               't', t, 'k', ARGV[i], 'c', ARGV[i + 1], 'd', ARGV[i + 2], 'p', prev)
    redis.call('PEXPIRE', key, ARGV[7])
    if told_to ~= name then
      tell()
      told_to, told = name, {epoch}
    end
    told[#told + 1] = seq
    told[#told + 1] = t
    told[#told + 1] = ARGV[i]
    told[#told + 1] = ARGV[i + 1]
    told[#told + 1] = ARGV[i + 2]
    told[#told + 1] = prev
  end
  end
end
if not appended then return out end  -- only notes already known: nothing appended
redis.call('HSET', KEYS[2], 's', seq, 't', string.format('%d', last))
if ARGV[5] ~= '' then
  -- the batch's seqs and times are consecutive: its first of each and its count
  -- (as strings: cjson writes numbers with 14 digits, a timestamp has 16)
  redis.call('SET', KEYS[5], cjson.encode({e = epoch, f = ARGV[5],
                                           s = string.format('%d', out[2]), t = out[3],
                                           n = string.format('%d', (#out - 1) / 2)}),
             'PX', ARGV[6])
end
tell()
return out
