"""The Redis engine's partitions: where a channel lives, the keys of each
partition, and the Lua scripts that append to its log.

The rule: a channel lives in one of K partitions (its name hashed, or the
part of it in ``{…}``, as Redis Cluster hashes keys), every key of partition
T carries the hash tag ``{T}`` (one Cluster slot), and every write to a
partition is one script call that appends to its log and notifies its
followers. Values and text only: no connection (``publishing.py`` and
``reader.py`` run them).

Keys of partition T (see ``PartitionKeys``):

- ``pushup:{T}:log``: a stream; entry id ``<seq>-0``; fields ``t`` (µs),
  ``k`` (``m`` a message, ``o`` a channel operation, ``f`` a note that a
  channel of T has messages in another partition), ``c`` (channels JSON, or
  the channel's name), ``d`` (the message's data JSON exactly as accepted,
  the operation as JSON, or the other partition's number);
- ``pushup:{T}:meta``: a hash: ``e`` the log's epoch, ``s`` its last
  sequence number, ``t`` its last timestamp;
- ``pushup:{T}:channels``: the partition's explicit channels, name → JSON
  ``{"ttl", "expires_at"}``, so they outlive the log's trimming;
- ``pushup:{T}:foreign``: channel → JSON list of the other partitions that
  hold messages of it (a message published to several channels goes to
  its first channel's partition: a follower of another of its channels
  must follow that partition too);
- ``pushup:{T}:key:<Idempotency-Key>``: a keyed publish's part in T, JSON
  ``{"e", "f", "s", "t", "n"}`` (epoch, the whole body's fingerprint, first
  sequence number and timestamp, count), expiring after the window;
- ``pushup:{T}:n``: the sharded channel the script notifies on, MessagePack
  ``[epoch, seq, t, k, c, d, seq, t, k, c, d, …]``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import msgspec

from pushup.backplane.redis.client import script_sha
from pushup.backplane.redis.slots import SLOTS, hash_tag, key_slot
from pushup.config import Config

BALANCED_UP_TO = 256  # up to this many partitions, tags are chosen for even slots

# Both scripts begin by checking the log against the calling node: KEYS log,
# meta; ARGV the calling node's salt (0 to 1295), MAXLEN, the epoch the node
# holds ("" if none) and its horizon in it. A log with no meta (Redis
# restarted empty), or with fewer entries than the node already read (a
# restart with appendfsync everysec, a failover to a replica that lagged),
# starts again under a new epoch, so no sequence number is ever reused for
# another message. The epoch is Redis's own milliseconds (TIME) times 1296
# plus the salt, in base 36 (past the calling node's epoch if that is not
# less): one clock makes every epoch of a partition, so a newer epoch is a
# greater number (pushup.core.origins tells a cursor naming an older one that
# its log is gone), whichever node's clock is behind.
_CHECKED = """
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
"""

# Returns {epoch, seq}.
CHECK = _CHECKED + "return {epoch, seq}"

# KEYS: log, meta, channels, the notification channel, the foreign hash, and
# for a keyed publish its key's entry. ARGV after the four above: the body's
# fingerprint ("" for no key), the window in ms; then per entry: kind ("m"
# message, "o" operation, "f" foreign note), c, d. An operation's d is
# {"op": "create"|"renew"|"delete", "ttl", "expires_at"}; a foreign note's d
# the other partition's number, appended only if the channel's list lacks it.
# Appends every entry or none, then notifies; returns
# {epoch, seq1, ts1, seq2, ts2, ...}, or an error before writing anything if
# a create names an explicit channel that exists. A key already used in this
# epoch appends nothing: it returns the first attempt's reply with "again" at
# its end, or the error REUSED if that attempt had another body.
PUBLISH = _CHECKED + """
if ARGV[5] ~= '' then
  local prior = redis.call('GET', KEYS[6])
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
for i = 7, #ARGV, 3 do
  if ARGV[i] == 'o' and cjson.decode(ARGV[i + 2])['op'] == 'create'
      and redis.call('HEXISTS', KEYS[3], ARGV[i + 1]) == 1 then
    return redis.error_reply('EXISTS ' .. ARGV[i + 1])
  end
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local last = tonumber(redis.call('HGET', KEYS[2], 't'))
local out = {epoch}
local told = {epoch}
for i = 7, #ARGV, 3 do
  local append = true
  if ARGV[i] == 'f' then
    local known = redis.call('HGET', KEYS[5], ARGV[i + 1])
    local list = known and cjson.decode(known) or {}
    for _, x in ipairs(list) do
      if x == ARGV[i + 2] then append = false end
    end
    if append then
      list[#list + 1] = ARGV[i + 2]
      redis.call('HSET', KEYS[5], ARGV[i + 1], cjson.encode(list))
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
  told[#told + 1] = seq
  told[#told + 1] = t
  told[#told + 1] = ARGV[i]
  told[#told + 1] = ARGV[i + 1]
  told[#told + 1] = ARGV[i + 2]
  end
end
if #told == 1 then return out end  -- only notes already known: nothing appended
redis.call('HSET', KEYS[2], 's', seq, 't', string.format('%d', last))
if ARGV[5] ~= '' then
  -- the batch's seqs and times are consecutive: its first of each and its count
  -- (as strings: cjson writes numbers with 14 digits, a timestamp has 16)
  redis.call('SET', KEYS[6], cjson.encode({e = epoch, f = ARGV[5],
                                           s = string.format('%d', out[2]), t = out[3],
                                           n = string.format('%d', (#out - 1) / 2)}),
             'PX', ARGV[6])
end
redis.call('SPUBLISH', KEYS[4], cmsgpack.pack(told))
return out
"""
PUBLISH_SHA = script_sha(PUBLISH)
CHECK_SHA = script_sha(CHECK)

decode_told = msgspec.msgpack.Decoder(list[Any])


def partition_tags(count: int) -> list[str]:
    """The hash tag of each of ``count`` partitions: ``p<i>``, or ``p<i>-<j>``
    for the first ``j`` whose slot falls in the ``i``-th of ``count`` even
    slices of the slot space, so that partitions spread evenly over the
    primaries of any cluster whose slots are split in even ranges."""
    if count > BALANCED_UP_TO:  # many partitions spread over the slots by themselves
        return [f"p{i}" for i in range(count)]
    tags = []
    for i in range(count):
        j = 0
        while True:
            tag = f"p{i}" if j == 0 else f"p{i}-{j}"
            if key_slot(tag) * count // SLOTS == i:
                break
            j += 1
        tags.append(tag)
    return tags


def partition_of(channel: str, count: int) -> int:
    """The partition a channel lives in: its hash tag's CRC-32, modulo ``count``."""
    return zlib.crc32(hash_tag(channel).encode()) % count


@dataclass(frozen=True, slots=True)
class PartitionKeys:
    """One partition's number, hash tag and Redis keys (see the module's rule):
    what names it, never how far a node follows it (``following.Partition``)."""

    index: int
    tag: str
    log: str = field(init=False)
    meta: str = field(init=False)
    channels: str = field(init=False)
    foreign: str = field(init=False)
    key: str = field(init=False)  # + the Idempotency-Key
    notify: str = field(init=False)

    def __post_init__(self) -> None:
        prefix = f"pushup:{{{self.tag}}}:"
        for name, suffix in (("log", "log"), ("meta", "meta"), ("channels", "channels"),
                             ("foreign", "foreign"), ("key", "key:"), ("notify", "n")):
            object.__setattr__(self, name, prefix + suffix)


def epoch_of(reply: list[Any]) -> str:
    """A script's epoch (its reply's first value)."""
    epoch: str = reply[0].decode()
    return epoch


def keys_of(channel: str, partitions: int | None = None) -> PartitionKeys:
    """The keys of the partition ``channel`` lives in, with ``partitions`` of them
    (default: ``--redis-partitions``'s), to look at a channel's log in Redis."""
    count = Config().redis_partitions if partitions is None else partitions
    index = partition_of(channel, count)
    return PartitionKeys(index, partition_tags(count)[index])
