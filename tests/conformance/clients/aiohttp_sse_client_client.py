"""`aiohttp-sse-client` following one PushUp stream (usage: python ... URL).

Reconnecting is the client's own (its reconnection time, doubled per attempt, and
``Last-Event-Id``); only its first wait is shortened. Prints one JSON line per
message or gap.
"""

import asyncio
import json
import sys
from datetime import timedelta

import aiohttp
from aiohttp_sse_client.client import EventSource


def print_line(line: dict[str, object]) -> None:
    print(json.dumps(line), flush=True)


async def follow(url: str) -> None:
    async with EventSource(url, reconnection_time=timedelta(milliseconds=100),
                           timeout=aiohttp.ClientTimeout(total=None)) as source:
        async for event in source:
            if event.type in (None, "message"):
                print_line({"kind": "message", "data": json.loads(event.data)["data"]})
            elif event.type == "gap":
                print_line({"kind": "gap"})


if __name__ == "__main__":
    asyncio.run(follow(sys.argv[1]))
