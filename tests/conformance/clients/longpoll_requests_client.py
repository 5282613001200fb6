"""A long-polling client on ``requests`` (usage: python ... BASE CHANNEL), written as
the contract asks: fix the position first (``since=now``, ``timeout=0``), then
always pass back the cursor, retrying a failed poll with the same cursor. Prints
one JSON line per message or gap.
"""

import json
import sys
import time

import requests


def print_line(line: dict[str, object]) -> None:
    print(json.dumps(line), flush=True)


def follow(base: str, channel: str) -> None:
    cursor, timeout = "now", 0
    with requests.Session() as session:
        while True:
            try:
                response = session.get(f"{base}/subscribe", timeout=(5, timeout + 15), params={
                    "channels": channel, "since": cursor, "timeout": timeout})
                response.raise_for_status()
                body = response.json()
            except requests.RequestException as error:
                print_line({"kind": "error", "message": repr(error)})
                time.sleep(0.1)
                continue
            if body.get("gap"):
                print_line({"kind": "gap"})
            for message in body["messages"]:
                print_line({"kind": "message", "data": message["data"]})
            cursor, timeout = body["cursor"], 30


if __name__ == "__main__":
    follow(sys.argv[1], sys.argv[2])
