-- Every change of one request, or none: ARGV[1] is a JSON list of changes,
-- one per stream of one family (KEYS[1]: a key of its home, for routing),
-- ARGV[2...] their appends in order (each append's head names its write's
-- mark c.w, which the stream's w is set to). A change names the version it
-- was decided on; any other version (or, when it maps its path's at key c.k
-- in this slot, another stream at the path; or, dropping an expired stream,
-- a deadline a read has renewed since) refuses them all: {0, i}. GONE is
-- what a dropping write's notice starts with (pushup.backplane.redis.stream_keys
-- puts its value in before the script is sent). c.t: the appends before that
-- index were let go of by the stream's retention; each keeps its head only
-- (index and mark as before), b in the meta hash saying how many are so.
local changes = cjson.decode(ARGV[1])
for i, c in ipairs(changes) do
  local m = c.p .. c.u .. ':m'
  if tonumber(redis.call('HGET', m, 'v') or '0') ~= c.v then return {0, i} end
  if c.map == 1 and (redis.call('GET', c.k) or '') ~= c.at then return {0, i} end
  if c.drop == 1 and c.now ~= '' then
    local deadline = redis.call('HGET', m, 'deadline')
    if deadline and tonumber(deadline) > tonumber(c.now) then return {0, i} end
  end
end
local arg = 2
for i, c in ipairs(changes) do
  local m = c.p .. c.u
  if c.drop == 1 then
    redis.call('DEL', m .. ':m', m .. ':l')
  else
    redis.call('HSET', m .. ':m', 'v', c.v + 1, 'state', c.s, 'w', c.w)
    if c.d ~= '' then
      local deadline = redis.call('HGET', m .. ':m', 'deadline')
      if not deadline or tonumber(deadline) < tonumber(c.d) then
        redis.call('HSET', m .. ':m', 'deadline', c.d)
      end
    end
    if c.t > 0 then  -- appends before index c.t were let go of: keep their heads only
      local blanked = tonumber(redis.call('HGET', m .. ':m', 'b') or '0')
      for i = blanked, c.t - 1 do
        local item = redis.call('LINDEX', m .. ':l', i)
        local ends = item and string.find(item, '\n', 1, true)
        if ends and ends < #item then redis.call('LSET', m .. ':l', i, string.sub(item, 1, ends)) end
      end
      if c.t > blanked then redis.call('HSET', m .. ':m', 'b', c.t) end
    end
    local last = arg + c.n - 1
    while arg <= last do
      local upto = math.min(last, arg + 999)
      redis.call('RPUSH', m .. ':l', unpack(ARGV, arg, upto))
      arg = upto + 1
    end
  end
  if c.map == 1 then
    redis.call('SET', c.k, c.u)
  elseif c.map == 0 and c.k ~= '' and redis.call('GET', c.k) == c.u then
    redis.call('DEL', c.k)
  end
  if c.drop == 0 then  -- Redis drops what nobody asks for a while after its deadline
    local mapped = c.k ~= '' and redis.call('GET', c.k) == c.u
    if c.x ~= '' then
      redis.call('PEXPIREAT', m .. ':m', c.x)
      redis.call('PEXPIREAT', m .. ':l', c.x)
      if mapped then redis.call('PEXPIREAT', c.k, c.x) end
    else
      redis.call('PERSIST', m .. ':m')
      redis.call('PERSIST', m .. ':l')
      if mapped then redis.call('PERSIST', c.k) end
    end
  end
  if c.drop == 1 then  -- told apart: a node holding it forgets it
    redis.call('SPUBLISH', c.ch, GONE .. c.u)
  else
    redis.call('SPUBLISH', c.ch, c.u)
  end
end
return {1}
