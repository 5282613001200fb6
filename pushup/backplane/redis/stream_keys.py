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

from pushup.backplane.redis.scripts import read_script

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


# The scripts, each in its own file (pushup.backplane.redis.scripts), whose head
# says its KEYS, ARGV and reply.
READ = read_script("stream_read")
READ_SHA = sha(READ)
# GONE's value is put in before the script is sent (a dropping write's notice).
WRITE = read_script("stream_write").replace("GONE .. ", repr(GONE) + " .. ")
WRITE_SHA = sha(WRITE)
POINT = read_script("stream_point")
POINT_SHA = sha(POINT)
UNPOINT = read_script("stream_unpoint")
UNPOINT_SHA = sha(UNPOINT)
TOUCH = read_script("stream_touch")
TOUCH_SHA = sha(TOUCH)
