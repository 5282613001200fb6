// A long-polling client on Node's own fetch, as the contract asks one to be written:
// fix the position first (since=now, timeout=0), then always pass back the cursor,
// retrying a failed poll with the same cursor. Usage: node longpoll-fetch.mjs BASE CHANNEL.
// Prints one JSON line per message or gap.
const [base, channel] = process.argv.slice(2);
const print = (line) => process.stdout.write(JSON.stringify(line) + "\n");
const url = (since, timeout) =>
  `${base}/subscribe?channels=${encodeURIComponent(channel)}` +
  `&since=${encodeURIComponent(since)}&timeout=${timeout}`;

let cursor = "now";
let timeout = 0;
for (;;) {
  try {
    const response = await fetch(url(cursor, timeout));
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const body = await response.json();
    if (body.gap) print({ kind: "gap" });
    for (const message of body.messages) print({ kind: "message", data: message.data });
    cursor = body.cursor;
    timeout = 30;
  } catch (error) {
    print({ kind: "error", message: String(error) });
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
