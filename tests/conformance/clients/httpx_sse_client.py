"""`httpx-sse` following one PushUp stream (usage: python httpx_sse_client.py URL).

httpx-sse parses a stream and leaves reconnecting to its user; its README's recipe
is followed: remember the last event id, reconnect with it as ``Last-Event-ID``,
after the ``retry`` the server set. Prints one JSON line per message or gap.
"""

import json
import sys
import time

import httpx
from httpx_sse import connect_sse


def print_line(line: dict[str, object]) -> None:
    print(json.dumps(line), flush=True)


def follow(url: str) -> None:
    last_id = ""
    retry = 0.1
    with httpx.Client(timeout=httpx.Timeout(5.0, read=None)) as client:
        while True:
            headers = {"Last-Event-ID": last_id} if last_id else {}
            try:
                with connect_sse(client, "GET", url, headers=headers) as source:
                    for event in source.iter_sse():
                        last_id = event.id or last_id
                        retry = event.retry / 1000 if event.retry else retry
                        if event.event == "message" and event.data:
                            print_line({"kind": "message", "data": json.loads(event.data)["data"]})
                        elif event.event == "gap":
                            print_line({"kind": "gap"})
            except httpx.HTTPError as error:
                print_line({"kind": "error", "message": repr(error)})
            time.sleep(retry)


if __name__ == "__main__":
    follow(sys.argv[1])
