"""Where the Durable Streams are in Redis, and the scripts that read and write them.

The rule: every stream of one fork family lives in ONE Cluster slot, its
family's *home*, so that each write (a fork's creation or deletion changes the
fork and its sources) is one script on one slot. A path's own hash tag is
``{s:<hash of the path>}``; the home of a stream without a source is its
path's own tag, a fork's home is its source's.

Keys, with ``H`` a home tag and ``P`` a path's own tag:

- ``pushup:{s:P}:at``: the stream answering at the path: its uid when its
  home is the path's own tag, else a *pointer* ``<home hash>/<uid>`` (a fork
  of another path's family). Changed in place by the family's script when it
  is in the family's slot; a pointer is set by ``POINT`` (compare and set)
  only after the family's script created the fork, and removed by ``UNPOINT``
  after the script dropped it, so a pointer never names a stream that was
  not written; one naming a dropped stream reads as no stream.
- ``pushup:{s:H}:<uid>:m``: a hash (``v`` version, ``state`` JSON,
  ``deadline`` microseconds, raised by reads renewing a TTL);
  ``pushup:{s:H}:<uid>:l``: the appends, one list item each.
- the sharded channel told the uid after each write (``-<uid>`` after the
  write that dropped it): ``pushup:{s:H}:n`` for a stream at home,
  ``pushup:{s:H}:n:<path hash>`` for a fork elsewhere.

A stream's ``w`` and each append's head carry the *mark* of the write that
set them, random: a version number alone repeats after Redis lost writes
(restarted from an older snapshot, a lagging replica promoted) and others
followed; a mark does not, so a node tells its cache from what Redis holds.
"""

from __future__ import annotations

import hashlib

HEAD = "pushup:{s:"
GONE = "-"  # what a write's notice starts with when it dropped the stream (then its uid)


def digest(path: str) -> str:
    """The hash of ``path`` its own tag is made of."""
    return hashlib.sha1(path.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def prefix_of(path: str) -> str:
    """The keys' common start for ``path``'s own tag: one slot."""
    return f"{HEAD}{digest(path)}}}:"


def pointer(home: str, uid: str) -> str:
    """What a path's ``at`` holds for ``uid`` living in ``home`` (a prefix)."""
    return f"{home[len(HEAD):-2]}/{uid}"


def home_of_pointer(value: str) -> tuple[str, str] | None:
    """The (home prefix, uid) a path's ``at`` value points to; None when the
    value is a uid living at the path's own tag (or nothing)."""
    tag, slash, uid = value.partition("/")
    return (f"{HEAD}{tag}}}:", uid) if slash else None


def uid_in(value: str) -> str:
    """The uid an ``at`` value names ("" for none)."""
    return value.rpartition("/")[2]


def channel_of(path: str, home: str) -> str:
    """The sharded channel a write to the stream at ``path`` living in
    ``home`` is told on (in ``home``'s slot)."""
    return home + "n" if home == prefix_of(path) else f"{home}n:{digest(path)}"


def sha(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()


# The stream at a path (ARGV[2] "") or a given uid: where the path points,
# the uid, its version, state, deadline, last write's mark (``w``), how many
# appends Redis holds, the head of the append before ARGV[4] (when the state
# is sent: the node checks its cache is what Redis holds), then its appends
# from ARGV[4] on (all of them when ARGV[3] is not the uid the cache holds).
# The state is "" when the cache holds this version and mark (ARGV[5],
# ARGV[6]) already: nothing was written since. A path pointing to another
# slot answers only its pointer: the uid is read there.
READ = """
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
  before = string.sub(item, 1, (string.find(item, '\\n', 1, true) or 1) - 1)
end
local out = {at, uid, meta[1], state, meta[3] or '', meta[4] or '', count, before}
local appends = redis.call('LRANGE', m .. ':l', from, -1)
for i = 1, #appends do out[#out + 1] = appends[i] end
return out
"""
READ_SHA = sha(READ)

# Every change of one request, or none: ARGV[1] is a JSON list of changes,
# one per stream of one family (KEYS[1]: a key of its home, for routing),
# ARGV[2...] their appends in order (each append's head names its write's
# mark ``c.w``, which the stream's ``w`` is set to). A change names the version it was
# decided on; any other version (or, when it maps its path's ``at`` key
# ``c.k`` in this slot, another stream at the path; or, dropping an expired
# stream, a deadline a read has renewed since) refuses them all: {0, i}.
WRITE = """
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
"""
WRITE = WRITE.replace("GONE .. ", repr(GONE) + " .. ")
WRITE_SHA = sha(WRITE)

# A fork its family's script created answers at its path now: KEYS[1] (the
# path's ``at``) is set to the pointer ARGV[2] if it still holds ARGV[1], as
# read when the creation was decided (1), else nothing changes (0).
POINT = """
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""
POINT_SHA = sha(POINT)

# A fork its family's script dropped or unmapped: its pointer goes, unless
# the path points elsewhere by now.
UNPOINT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""
UNPOINT_SHA = sha(UNPOINT)

# A read renewed a sliding TTL: the later deadline, kept (no new version).
TOUCH = """
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
"""
TOUCH_SHA = sha(TOUCH)
