"""pushup/http/stream_sse.py: what a Durable Stream's SSE response writes, as
the front is handed it (a client double records each write)."""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.task import Clock

from pushup.core.stream import Stream
from pushup.core.stream_values import START
from pushup.http.stream_sse import Feed, WholeEvents


class Writes:
    """The front's end of the response: each ``send_events`` is one write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def open_stream(self, content_type: bytes = b"", fields: object = ()) -> None:
        pass

    def send_events(self, data: bytes) -> bool:
        self.writes.append(data)
        return True

    def end_stream(self) -> None:
        pass

    def when_writable(self, callback: Callable[[], None]) -> None:
        pass


def test_each_data_event_goes_out_in_one_write_with_its_control_event():
    stream = Stream("/v1/stream/s", "1", "text/plain")
    stream.append(b"start\r\revent: control\rdata: {}\r\rend", None)  # a data line like a control
    client = Writes()
    feed = Feed(stream, START, client, clock=Clock(), budget=1 << 20, cursor=lambda: "7",
                draining=lambda: False, fields=())
    feed.start()
    stream.append(b"more", None)
    stream.wake()
    assert len(client.writes) == 2  # a read each, each with its control event
    for write in client.writes:
        data, control = write.split(b"\n\n")[:2]
        assert data.startswith(b"event: data\n")
        assert control.startswith(b"event: control\ndata:{\"streamNextOffset\"")
    feed.stop()


def test_another_nodes_event_stream_is_written_in_whole_events_wherever_its_reads_fall():
    # what a Feed of the serving node writes: two reads, each a data event (whose
    # lines read like a control event) and its control event
    served = (b"event: data\ndata:safe\ndata:\ndata:event: control\ndata:\n\n"
              b"event: control\ndata:{\"streamNextOffset\":\"a\"}\n\n"
              b"event: data\ndata:more\n\n"
              b"event: control\ndata:{\"streamNextOffset\":\"b\",\"upToDate\":true}\n\n")
    writes = [served[:i] for i in range(1, len(served))]
    for first, cut in ((w, len(w)) for w in writes):
        client = Writes()
        relayed = WholeEvents(client, bound=1 << 16)
        relayed.send_events(first)
        relayed.send_events(served[cut:])
        assert b"".join(client.writes) == served
        for write in client.writes:  # each ends with a whole control event
            assert write.endswith(b"}\n\n") and write.rsplit(b"\n\n", 2)[-2].startswith(
                b"event: control\n"), (cut, client.writes)


def test_what_waits_for_an_events_end_is_bounded_and_written_at_the_end():
    client = Writes()
    relayed = WholeEvents(client, bound=12)
    assert relayed.send_events(b"event: da")  # waits
    assert client.writes == []
    relayed.send_events(b"ta\ndata:x")  # past the bound: written as it is
    assert client.writes == [b"event: data\ndata:x"]
    relayed.send_events(b"\n\nevent: con")
    relayed.end_stream()
    assert client.writes[1:] == [b"\n\nevent: con"]
