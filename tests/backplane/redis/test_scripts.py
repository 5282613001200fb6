"""The Redis engine's Lua scripts, run on a real redis-server of the test's own."""
from __future__ import annotations

import json

import hiredis
import pytest

from pushup.backplane.redis.partitions import CHECK, PUBLISH, READ_CHANNELS, PartitionKeys

P = PartitionKeys(0, "p0")  # one partition's keys: each script runs on one
LOG, META, CHANNELS, KEY = P.log, P.meta, P.channels, P.key


def publish(redis, held_epoch, held, *entries, salt=7, maxlen=1000, key=None,
            fingerprint="f1", window_ms=60_000, stream_ttl_ms=60_000):
    flat = [x for entry in entries for x in entry]
    keys = [LOG, META, CHANNELS, P.foreign] + ([KEY + key] if key is not None else [])
    keyed = [fingerprint, window_ms] if key is not None else ["", 0]
    return redis.cli("EVAL", PUBLISH, len(keys), *keys, salt, maxlen, held_epoch, held,
                     *keyed, stream_ttl_ms, *flat)


def read(redis, held_epoch, held, *afters, most=1000, salt=7, maxlen=1000):
    """READ_CHANNELS of (name, after) pairs."""
    flat = [x for pair in afters for x in pair]
    keys = [LOG, META, CHANNELS, P.foreign]
    return redis.cli("EVAL", READ_CHANNELS, len(keys), *keys, salt, maxlen, held_epoch, held,
                     most, *flat)


def msg(data, *channels):
    return ("m", json.dumps(list(channels or ("a",))), json.dumps(data))


def op(kind, name, ttl=60, expires_at=100):
    return ("o", name, json.dumps({"op": kind, "ttl": ttl, "expires_at": expires_at}))


def test_a_batch_gets_contiguous_sequence_numbers_and_rising_timestamps(redis_server):
    first = publish(redis_server, "", 0, msg(1), msg(2), msg(3))
    e1 = first[0].decode()  # a log with no epoch starts one
    assert redis_server.cli("HGET", META, "e") == first[0]
    seqs, stamps = first[1::2], [int(t) for t in first[2::2]]
    assert seqs == [1, 2, 3] and stamps == sorted(set(stamps))
    second = publish(redis_server, e1, 3, msg(4))
    assert second[1] == 4 and int(second[2]) > stamps[-1]
    log = redis_server.cli("XRANGE", LOG, "-", "+")
    assert [e[0] for e in log] == [b"1-0", b"2-0", b"3-0", b"4-0"]
    fields = dict(zip(log[3][1][::2], log[3][1][1::2], strict=True))
    assert fields[b"k"] == b"m" and fields[b"d"] == b"4" and fields[b"c"] == b'["a"]'


def test_a_create_of_an_existing_channel_writes_nothing(redis_server):
    e1 = publish(redis_server, "", 0, op("create", "room"))[0].decode()
    with pytest.raises(hiredis.ReplyError, match="EXISTS room"):
        publish(redis_server, e1, 1, msg("x"), op("create", "room"))
    assert redis_server.cli("XLEN", LOG) == 1  # the batch is all or nothing
    assert redis_server.cli("HGET", META, "s") == b"1"
    publish(redis_server, e1, 1, op("delete", "room"))
    assert redis_server.cli("HEXISTS", CHANNELS, "room") == 0
    assert publish(redis_server, e1, 2, op("create", "room"))[1] == 3


def test_a_log_shorter_than_a_node_read_starts_a_new_epoch_before_appending(redis_server):
    e1 = publish(redis_server, "", 0, msg(1), msg(2))[0].decode()
    # This node read five entries of e1: Redis lost three it had acknowledged.
    reply = publish(redis_server, e1, 5, msg(6))
    assert reply[0] != e1.encode() and reply[1] == 1  # never seq 3 of e1 again
    assert int(reply[0], 36) > int(e1, 36)  # a later epoch is a greater number
    assert [e[0] for e in redis_server.cli("XRANGE", LOG, "-", "+")] == [b"1-0"]


def test_the_check_keeps_a_log_that_holds_what_the_node_read(redis_server):
    e1 = publish(redis_server, "", 0, msg(1), msg(2))[0]
    check = [LOG, META, 9, 1000]
    assert redis_server.cli("EVAL", CHECK, 2, *check, e1, 2) == [e1, 2]
    assert redis_server.cli("EVAL", CHECK, 2, *check, "e0", 7) == [e1, 2]  # another epoch
    e2, seq = redis_server.cli("EVAL", CHECK, 2, *check, e1, 3)
    assert seq == 0 and int(e2, 36) > int(e1, 36)
    redis_server.cli("FLUSHALL")
    e3, seq = redis_server.cli("EVAL", CHECK, 2, LOG, META, 10, 1000, e2, 0)
    assert seq == 0 and int(e3, 36) > int(e2, 36) and int(e3, 36) % 1296 == 10


def test_a_retry_with_the_key_appends_nothing_and_gets_the_first_reply(redis_server):
    first = publish(redis_server, "", 0, msg(1), msg(2), key="k1")
    e1 = first[0].decode()
    again = publish(redis_server, e1, 2, msg(1), msg(2), key="k1")
    assert again == [*first, b"again"]
    assert redis_server.cli("XLEN", LOG) == 2 and redis_server.cli("HGET", META, "s") == b"2"
    ttl = redis_server.cli("PTTL", KEY + "k1")
    assert 0 < ttl <= 60_000  # the window
    other = publish(redis_server, e1, 2, msg(3), key="k2")
    assert other[1] == 3 and other[-1] != b"again"


def test_the_key_with_another_body_is_refused_and_writes_nothing(redis_server):
    e1 = publish(redis_server, "", 0, msg(1), key="k1", fingerprint="f1")[0].decode()
    with pytest.raises(hiredis.ReplyError, match="REUSED"):
        publish(redis_server, e1, 1, msg(2), key="k1", fingerprint="f2")
    assert redis_server.cli("XLEN", LOG) == 1


def test_a_key_of_a_lost_log_is_no_retry(redis_server):
    e1 = publish(redis_server, "", 0, msg(1), msg(2), key="k1")[0].decode()
    # The node read five entries of e1: the log lost some; e2 starts, and the
    # key's publish (gone with e1) is stored again.
    reply = publish(redis_server, e1, 5, msg(1), msg(2), key="k1")
    e2 = reply[0].decode()
    assert e2 != e1 and reply[1:3:1][0] == 1 and reply[-1] != b"again"
    assert publish(redis_server, e2, 2, msg(1), msg(2), key="k1")[-1] == b"again"


def test_the_record_of_a_20000_message_keyed_batch_is_small_and_replays_exactly(redis_server):
    batch = [msg(i) for i in range(20_000)]
    fingerprint = "0123456789abcdef" * 2  # as long as a real one (idempotency.fingerprint)
    first = publish(redis_server, "", 0, *batch, maxlen=100_000, key="big",
                    fingerprint=fingerprint)
    assert len(first) == 1 + 2 * 20_000
    # Its size does not grow with the batch (every (seq, ts) was 520 KB of JSON).
    assert redis_server.cli("STRLEN", KEY + "big") < 200
    assert redis_server.cli("MEMORY", "USAGE", KEY + "big") < 300
    again = publish(redis_server, first[0], 20_000, *batch, maxlen=100_000, key="big",
                    fingerprint=fingerprint)
    assert again == [*first, b"again"]  # the first reply, element for element
    assert redis_server.cli("XLEN", LOG) == 20_000


def test_a_record_an_earlier_version_wrote_still_answers_its_retry(redis_server):
    first = publish(redis_server, "", 0, msg(1), msg(2))
    e1 = first[0].decode()
    redis_server.cli("SET", KEY + "old", json.dumps(
        {"e": e1, "f": "f1", "r": [first[1], first[2].decode(), first[3], first[4].decode()]}))
    again = publish(redis_server, e1, 2, msg(1), msg(2), key="old")
    assert again == [*first, b"again"]
    assert redis_server.cli("XLEN", LOG) == 2


def test_an_append_notifies_each_channel_on_its_own_in_log_order_and_a_retry_does_not(
        redis_server):
    import socket

    import msgspec

    from deploy.redis_server import encode

    with socket.create_connection(("127.0.0.1", redis_server.port), timeout=5) as sub:
        names = [P.notify_of(name) for name in ("a", "b", "room")]
        sub.sendall(b"".join(encode(("SSUBSCRIBE", name)) for name in names))
        reader = hiredis.Reader()

        def next_reply():
            while (reply := reader.gets()) is False:
                reader.feed(sub.recv(65536))
            return reply

        for i, name in enumerate(names):
            assert next_reply() == [b"ssubscribe", name.encode(), i + 1]
        first = publish(redis_server, "", 0, msg(1, "a", "b"), op("create", "room"), msg(2),
                        key="k")
        e1 = first[0].decode()
        publish(redis_server, e1, 3, msg(1, "a", "b"), op("create", "room"), msg(2), key="k")
        publish(redis_server, e1, 3, msg(3, "b"))
        told = [next_reply() for _ in range(5)]
    (m_seq, m_ts), (o_seq, o_ts), (n_seq, n_ts) = zip(first[1::2], first[2::2], strict=True)
    # one notification a channel's run, in the log's order, each entry with the
    # channel's previous one (0: none); the message of two channels to each
    assert [t[1].decode() for t in told] == [names[0], names[1], names[2], names[0], names[1]]
    decoded = [msgspec.msgpack.decode(t[2]) for t in told]
    assert decoded[0] == [e1, m_seq, m_ts.decode(), "m", '["a", "b"]', "1", 0]
    assert decoded[1] == [e1, m_seq, m_ts.decode(), "m", '["a", "b"]', "1", 0]
    assert decoded[2] == [e1, o_seq, o_ts.decode(), "o", "room", op("create", "room")[2], 0]
    assert decoded[3] == [e1, n_seq, n_ts.decode(), "m", '["a"]', "2", m_seq]
    assert decoded[4][:2] == [e1, 4] and decoded[4][-1] == m_seq  # the retry told no one


def test_a_channels_own_stream_holds_its_entries_with_the_previous_and_expires(redis_server):
    first = publish(redis_server, "", 0, msg(1, "a", "b"), msg(2, "b"), op("create", "a"),
                    stream_ttl_ms=50_000)
    e1 = first[0].decode()
    own = redis_server.cli("XRANGE", P.stream_of(e1, "b"), "-", "+")
    assert [e[0] for e in own] == [b"1-0", b"2-0"]
    fields = [dict(zip(f[::2], f[1::2], strict=True)) for _, f in own]
    assert [f[b"p"] for f in fields] == [b"0", b"1"] and fields[1][b"d"] == b"2"
    assert [e[0] for e in redis_server.cli("XRANGE", P.stream_of(e1, "a"), "-", "+")] == [
        b"1-0", b"3-0"]
    assert 0 < redis_server.cli("PTTL", P.stream_of(e1, "b")) <= 50_000


def test_a_read_of_channels_gives_each_its_newest_entries_past_a_seq_of_one_moment(
        redis_server):
    first = publish(redis_server, "", 0, msg(1, "a"), msg(2, "b"), msg(3, "a", "b"),
                    op("create", "b"), ("f", "a", "9"))
    e1 = first[0].decode()
    reply = read(redis_server, e1, 5, ("a", 1), ("b", 0), ("z", 0), most=2)
    assert reply[:2] == [first[0], 5]  # the epoch, the log's end
    a, b, z = reply[2:]
    assert a[0] is None and json.loads(a[1]) == ["9"]  # a's note abroad
    assert [e[0] for e in a[2]] == [b"5-0", b"3-0"]  # past 1, newest first
    assert json.loads(b[0])["ttl"] == 60  # b is an explicit channel
    assert [e[0] for e in b[2]] == [b"4-0", b"3-0"]  # the newest two
    assert z == [None, None, []]
    # at another epoch than the node holds, each channel is read whole
    assert [e[0] for e in read(redis_server, "zz", 0, ("a", 4))[2][2]] == [
        b"5-0", b"3-0", b"1-0"]


def test_a_foreign_note_is_appended_once_per_channel_and_partition(redis_server):
    first = publish(redis_server, "", 0, ("f", "b", "7"), ("f", "c", "7"))
    e1 = first[0].decode()
    assert first[1::2] == [1, 2]  # two notes, two entries
    again = publish(redis_server, e1, 2, ("f", "b", "7"), ("f", "b", "9"))
    assert again[1::2] == [3]  # b's note of 7 is known: only 9 is new
    assert json.loads(redis_server.cli("HGET", P.foreign, "b")) == ["7", "9"]
    assert publish(redis_server, e1, 3, ("f", "c", "7")) == [first[0]]  # nothing appended
    kinds = [dict(zip(f[::2], f[1::2], strict=True))[b"k"]
             for _, f in redis_server.cli("XRANGE", LOG, "-", "+")]
    assert kinds == [b"f", b"f", b"f"]
