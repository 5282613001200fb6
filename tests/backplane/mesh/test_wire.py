from pushup.backplane.mesh.wire import (
    Batch,
    decode_snapshot,
    export_snapshot,
    pack_batch,
    sign,
    unpack_batch,
    verify,
)
from pushup.core.channels import ChannelOp
from pushup.core.cursor import Cursor
from pushup.core.model import Draft, Message, Origin, Query
from pushup.core.store import Retention, Store

S = 1_000_000
T0 = 1_700_000_000 * S


def store(node="a", per_channel=100):
    return Store(Retention(3600 * S, 3600 * S, per_channel, 10**9), Origin(node, T0))


def test_a_batch_round_trips_with_byte_identical_data():
    m = Message("a.x", 3, T0, ("c", "d"), b'{"f":1.0e5,"s":"\xc3\xa9"}')
    ops = (ChannelOp("delete", "c", 3), ChannelOp("create", "d", 3, 5, T0 + 5))
    back = unpack_batch(pack_batch(Batch("a.x", True, (m,), ops)))
    assert back.first and back.ops == ops
    assert back.messages[0].full == m.full and back.messages[0].data_json == m.data_json


def test_a_packed_batch_round_trips_with_its_keys_and_skip():
    """A MessagePack batch (the stream's, a repair's answer) carries its data
    byte for byte (numbers as written, non-ASCII, U+2028), keys and skip."""
    from pushup.core.idempotency import Remembered

    data = b'{"f":1.0e5,"big":123456789012345678901234567890,"s":"\xc3\xa9\xe2\x80\xa8"}'
    m = Message("a.x", 3, T0, ("c", "d"), data)
    ops = (ChannelOp("delete", "c", 3), ChannelOp("create", "d", 3, 5, T0 + 5))
    keys = (Remembered("k-1", "f" * 64, "a.x", ((3, T0),)),)
    for batch in (Batch("a.x", True, (m,), ops, keys=keys),
                  Batch("a.x", False, (), (), skip=(9, T0 + 9))):
        back = unpack_batch(pack_batch(batch))
        assert (back.origin, back.first, back.ops, back.skip, back.keys) == (
            batch.origin, batch.first, batch.ops, batch.skip, batch.keys)
        assert [x.full for x in back.messages] == [x.full for x in batch.messages]


def test_a_malformed_packed_batch_is_refused_as_a_bad_batch():
    import msgspec
    import pytest

    from pushup.core.errors import PushUpError

    pack = msgspec.msgpack.encode
    good = ["a.x", False, [[1, T0, ["c"], b"1"]], [], None, []]
    assert unpack_batch(pack(good)).messages[0].data_json == b"1"
    for bad in (b"\xc1", pack([]), pack(good[:5]),
                pack(["a.x", False, [[1, T0, ["c"], "1"]], [], None, []]),
                pack(["a.x", False, [[1, T0, ["bad name"], b"1"]], [], None, []]),
                pack(["a.x", False, [[1, T0, [], b"1"]], [], None, []]),
                pack([7, False, [], [], None, []]),
                pack(["a.x", False, [], [["explode", 1, "c"]], None, []])):
        with pytest.raises(PushUpError):
            unpack_batch(bad)


def test_a_batch_that_would_poison_what_a_node_serves_is_refused():
    """An origin no cursor can name, a sequence number past a cursor's 18
    digits (as a message or as a skip), data that is not JSON: refused,
    whether it comes on the stream or in a repair's answer."""
    import pytest

    from pushup.core.errors import BadRequest

    def one(origin, seq=1, data=b"1"):
        return (Message(origin, seq, T0, ("c",), data),)

    for batch in (Batch("bad origin!:x", False, one("bad origin!:x"), ()),
                  Batch("a.x", True, one("a.x", seq=10**18), ()),
                  Batch("a.x", False, (), (), skip=(10**18, T0)),
                  Batch("a.x", False, one("a.x", data=b'{"x":'), ())):
        with pytest.raises(BadRequest):
            unpack_batch(pack_batch(batch))
    with pytest.raises(BadRequest):  # not UTF-8 (JSON text cannot even carry it)
        unpack_batch(pack_batch(Batch("a.x", False, one("a.x", data=b'"\xff"'), ())))


def test_a_snapshot_makes_a_new_node_answer_like_the_old_one():
    old = store(per_channel=3)
    for i in range(5):
        old.publish([Draft(("c",), b"%d" % i)], T0 + i)
    old.apply(Message("p.y", 1, T0 + 10, ("c", "e"), b"9"), T0 + 10)
    old.create("empty", 60 * S, T0)
    new = store("b")
    assert new.load(decode_snapshot(export_snapshot(old)), T0 + 20) == old.message_count
    for since in (0, Cursor(()), Cursor.of({"a." + old.origin_name.split(".")[1]: 2})):
        q = Query(("c", "e"), since, None, 100)
        a, b = old.query(q), new.query(q)
        assert [m.id for m in a.messages] == [m.id for m in b.messages]
        assert a.gap == b.gap and a.cursor == b.cursor
    assert new.get("empty").expires_at == old.get("empty").expires_at
    assert new.horizon_of(old.origin_name) == 5


def test_signatures_need_the_secret_and_a_fresh_time():
    sig = sign("s3cret", "POST", "/peer/repair", 1000, b"body")
    assert verify("s3cret", "POST", "/peer/repair", "1000", b"body", sig, 1010)
    assert not verify("other", "POST", "/peer/repair", "1000", b"body", sig, 1010)
    assert not verify("s3cret", "POST", "/peer/repair", "1000", b"bodx", sig, 1010)
    assert not verify("s3cret", "POST", "/peer/repair", "1000", b"body", sig, 2000)
    assert not verify("s3cret", "POST", "/peer/repair", "soon", b"body", sig, 1010)
