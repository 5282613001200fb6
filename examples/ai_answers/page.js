// The page of a resumable AI answer. It asks the backend for an answer once
// (POST /answers), keeps the answer's id in the URL and what it has shown of it
// (the text, and the stream offset just after it) in sessionStorage, and follows
// the answer's Durable Stream with the protocol's own client over SSE from that
// offset. Reloaded in the middle of an answer, it shows what it had and goes on
// from exactly there: no token lost, none twice. `npm run build` bundles it
// (with @durable-streams/client) into public/page.bundle.js.
import { stream } from "@durable-streams/client"

const shown = document.getElementById("answer")
const status = document.getElementById("status")

async function newAnswer() {
  const res = await fetch("/answers", { method: "POST" })
  if (!res.ok) throw new Error(`the backend answered ${res.status}`)
  const { id, streamUrl } = await res.json()
  sessionStorage.setItem(`answer:${id}`,
    JSON.stringify({ streamUrl, offset: "-1", text: "", seen: [], done: false }))
  history.replaceState(null, "", `?answer=${id}`)
  return id
}

// One SSE read of the answer from the offset kept, each batch kept as it comes;
// settles when the read ends (the answer closed, or the connection was cut).
async function followOnce(kept, key) {
  const res = await stream({ url: kept.streamUrl, offset: kept.offset, live: "sse", json: true })
  res.subscribeJson((batch) => {
    for (const token of batch.items) {
      kept.text += token.text
      kept.seen.push(token.i)
    }
    kept.offset = batch.offset
    kept.done = batch.streamClosed
    // the text and its offset in one write: a reload finds both or neither
    sessionStorage.setItem(key, JSON.stringify(kept))
    shown.textContent = kept.text
    if (kept.done) status.textContent = "done"
  })
  try {
    await res.closed
  } finally {
    res.cancel()
  }
}

async function follow() {
  const id = new URLSearchParams(location.search).get("answer") ?? await newAnswer()
  const key = `answer:${id}`
  const kept = JSON.parse(sessionStorage.getItem(key))
  shown.textContent = kept.text
  status.textContent = kept.done ? "done"
    : kept.offset === "-1" ? "answering" : `resumed at ${kept.offset}`
  // The client reconnects by itself when a response ends; one cut short (the
  // node serving it died) is an error: read again from the offset kept.
  for (let failures = 0; !kept.done;) {
    try {
      await followOnce(kept, key)
      failures = 0
    } catch (e) {
      status.textContent = `reconnecting at ${kept.offset} (${e})`
      failures++
      await new Promise((resolve) => setTimeout(resolve, Math.random() * Math.min(2000, 100 * 2 ** failures)))
    }
  }
}

follow().catch((e) => { status.textContent = `error: ${e}` })
