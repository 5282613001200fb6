"""pushup/http/stream_sse.py: what a Durable Stream's SSE response writes, as
the front is handed it (a client double records each write)."""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.task import Clock

from pushup.core.stream import Stream
from pushup.core.stream_values import START
from pushup.http.stream_sse import Feed


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
