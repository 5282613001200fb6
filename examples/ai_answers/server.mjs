// The backend of a resumable AI answer: POST /answers starts an answer and
// returns its stream's URL at once; the "model" (a scripted token generator,
// at a model's pace) appends each token to that one Durable Stream with the
// protocol's idempotent producer (a retry after a lost reply, or through another
// node, is never a second copy), then closes the stream. The page (page.js)
// reads the stream, not this server: a reload, or the PushUp node it read
// through dying, costs the answer nothing.
//
//   PUSHUP_URL  the PushUp node or cluster front (default http://127.0.0.1:8080);
//               the page's origin must be in its --cors-origin
//   PORT        this server's port (default 3000)
//   TOKENS      tokens per answer (default 400); TOKEN_MS  ms between tokens (30)
import { createServer } from "node:http"
import { readFile } from "node:fs/promises"
import { randomUUID } from "node:crypto"
import { DurableStream, IdempotentProducer } from "@durable-streams/client"

const pushup = process.env.PUSHUP_URL ?? "http://127.0.0.1:8080"
const port = Number(process.env.PORT ?? 3000)
const tokens = Number(process.env.TOKENS ?? 400)
const tokenMs = Number(process.env.TOKEN_MS ?? 30)
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

// Stands in for a model: token i of an answer, as the page shows it.
function* model(prompt, count) {
  const words = `${prompt} is answered here one token at a time`.split(" ")
  for (let i = 0; i < count; i++) yield { i, text: `${words[i % words.length]} ` }
}

// A fetch that tries again when no answer came or a node was down (a cluster
// front's 502/503/504): the producer's headers make a repeat of an append that
// was taken a duplicate, never a second copy.
async function fetchAgain(url, init) {
  for (let attempt = 1; ; attempt++) {
    try {
      const res = await fetch(url, init)
      if (![502, 503, 504].includes(res.status) || attempt === 20) return res
    } catch (e) {
      if (attempt === 20) throw e
    }
    await sleep(Math.min(1000, 50 * attempt))
  }
}

async function answer(url, prompt) {
  const handle = new DurableStream({ url, contentType: "application/json" })
  // one producer per answer: its (id, epoch, seq) make every append exactly-once;
  // one batch in flight at a time keeps the tokens in order
  const producer = new IdempotentProducer(handle, `answer-${randomUUID()}`, {
    autoClaim: true, maxInFlight: 1, fetch: fetchAgain,
    onError: (e) => console.error("append failed:", e) })
  for (const token of model(prompt, tokens)) {
    producer.append(JSON.stringify(token))
    await sleep(tokenMs)
  }
  await producer.close()  // flushes, then closes: readers see streamClosed
}

const files = { "/": ["public/index.html", "text/html"],
  "/page.bundle.js": ["public/page.bundle.js", "text/javascript"] }

createServer(async (req, res) => {
  try {
    if (req.method === "POST" && req.url === "/answers") {
      const id = randomUUID()
      const url = `${pushup}/v1/stream/answers/${id}`
      await DurableStream.create({ url, contentType: "application/json" })
      answer(url, "Your question").catch((e) => console.error(`answer ${id}:`, e))
      res.writeHead(201, { "content-type": "application/json", location: url })
      res.end(JSON.stringify({ id, streamUrl: url, tokens }))
      return
    }
    const file = files[req.url.split("?")[0]]
    if (req.method !== "GET" || !file) {
      res.writeHead(404).end()
      return
    }
    res.writeHead(200, { "content-type": file[1] })
    res.end(await readFile(new URL(file[0], import.meta.url)))
  } catch (e) {
    res.writeHead(502, { "content-type": "application/json" })
    res.end(JSON.stringify({ error: String(e) }))
  }
}).listen(port, "127.0.0.1", () => console.log(`ai answers on http://127.0.0.1:${port}/`))
