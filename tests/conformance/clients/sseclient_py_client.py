"""`sseclient-py` following one PushUp stream (usage: python sseclient_py_client.py URL).

sseclient-py parses a ``requests`` streaming response and leaves reconnecting to
its user: remember the last event id it hands out, reconnect with it as
``Last-Event-ID``. Prints one JSON line per message or gap.
"""

import json
import sys
import time

import requests
import sseclient


def print_line(line: dict[str, object]) -> None:
    print(json.dumps(line), flush=True)


def follow(url: str) -> None:
    last_id = ""
    retry = 0.1
    with requests.Session() as session:
        while True:
            headers = {"Accept": "text/event-stream"}
            if last_id:
                headers["Last-Event-ID"] = last_id
            try:
                with session.get(url, stream=True, headers=headers, timeout=(5, None)) as response:
                    for event in sseclient.SSEClient(response).events():
                        last_id = event.id or last_id
                        retry = int(event.retry) / 1000 if event.retry else retry
                        if event.event == "message":
                            print_line({"kind": "message", "data": json.loads(event.data)["data"]})
                        elif event.event == "gap":
                            print_line({"kind": "gap"})
            except requests.RequestException as error:
                print_line({"kind": "error", "message": repr(error)})
            time.sleep(retry)


if __name__ == "__main__":
    follow(sys.argv[1])
