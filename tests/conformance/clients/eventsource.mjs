// npm `eventsource` (the WHATWG EventSource for Node) following one PushUp stream.
// Usage: node eventsource.mjs SUBSCRIBE_URL. Prints one JSON line per message
// ({"kind": "message", "data": <the message's data>}) or gap; reconnects are the
// client's own (retry interval, Last-Event-ID), nothing of ours.
import { EventSource } from "eventsource";

const print = (line) => process.stdout.write(JSON.stringify(line) + "\n");
const source = new EventSource(process.argv[2]);
source.onmessage = (event) => print({ kind: "message", data: JSON.parse(event.data).data });
source.addEventListener("gap", () => print({ kind: "gap" }));
source.onerror = (event) => print({ kind: "error", message: String(event.message ?? "") });
