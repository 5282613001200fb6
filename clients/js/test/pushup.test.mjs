// The browser client against real `pushup serve` processes: node --test clients/js/test/
// (The SSE transport needs EventSource, which Node 20 lacks: it is tested in a browser.)
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { createServer } from 'node:net';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { subscribe, backoff } from '../pushup.js';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const PUSHUP = process.env.JS_TEST_PUSHUP_COMMAND || ROOT + '.venv/bin/pushup';
const nodes = new Set();

// Start `pushup serve`; resolves with {url, proc} once it prints where it listens.
function startNode(args = [], port = 0) {
  const proc = spawn(PUSHUP, ['serve', '--port', String(port), ...args], {
    cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'],
  });
  nodes.add(proc);
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  return new Promise((resolve, reject) => {
    const lines = createInterface({ input: proc.stdout });
    lines.once('line', (line) => {
      const m = /listening on (http:\/\/\S+)/.exec(line);
      if (m) resolve({ url: m[1], proc });
      else reject(new Error(`unexpected first line: ${line}`));
    });
    proc.once('exit', (code) => reject(new Error(`pushup exited ${code}: ${stderr}`)));
  });
}

function stopNode(proc, signal = 'SIGTERM') {
  if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve();
  const exited = new Promise((resolve) => proc.once('exit', resolve));
  process.kill(proc.pid, signal);
  const force = setTimeout(() => proc.exitCode === null && process.kill(proc.pid, 'SIGKILL'), 5000);
  return exited.finally(() => clearTimeout(force));
}

after(async () => { await Promise.all([...nodes].map((p) => stopNode(p))); });

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => { const { port } = srv.address(); srv.close(() => resolve(port)); });
  });
}

const pause = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls `check` (bounded) for conditions that no callback announces.
async function until(check, what, ms = 10000) {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await pause(50);
  }
}

async function publish(url, channels, data) {
  const r = await fetch(url + '/publish', {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ channels, data }),
  });
  const text = await r.text();
  assert.equal(r.status, 201, text);
  return JSON.parse(text);
}

async function waiting(url) {
  return (await (await fetch(url + '/stats')).json()).waiting;
}

// Records callbacks; `next(kind, n)` resolves once `n` of that kind have arrived.
function recorder() {
  const seen = { message: [], gap: [], error: [], retry: [] };
  const wanted = [];
  const record = (kind) => (...args) => {
    seen[kind].push(args.length > 1 ? args : args[0]);
    for (const w of wanted) if (w.kind === kind && seen[kind].length >= w.n) w.resolve();
  };
  return {
    seen,
    callbacks: {
      onMessage: record('message'), onGap: record('gap'), onError: record('error'), onRetry: record('retry'),
    },
    next(kind, n) {
      if (seen[kind].length >= n) return Promise.resolve();
      return new Promise((resolve) => wanted.push({ kind, n, resolve }));
    },
    data() { return seen.message.map((m) => m.data); },
  };
}

test('messages arrive once, in order, with the cursor', { timeout: 20000 }, async () => {
  const { url } = await startNode();
  for (const i of [1, 2, 3]) await publish(url, ['a'], i);
  const rec = recorder();
  const sub = subscribe(url, ['a', 'b'], rec.callbacks);
  try {
    await rec.next('message', 3);
    await publish(url, ['b'], 4);
    await publish(url, ['a', 'b'], 5); // on both channels: still once
    await rec.next('message', 5);
    await publish(url, ['a'], 6); // a sentinel: any duplicate would come before it
    await rec.next('message', 6);
    assert.deepEqual(rec.data(), [1, 2, 3, 4, 5, 6]);
    assert.deepEqual(rec.seen.message[4].channels.sort(), ['a', 'b']);
    assert.equal(new Set(rec.seen.message.map((m) => m.id)).size, 6);
    assert.match(sub.cursor, /^c1\./);
    // the cursor is past everything delivered
    await until(async () => (await waiting(url)) === 1, 'the next poll');
    const r = await (await fetch(`${url}/subscribe?channels=a,b&since=${sub.cursor}&timeout=0`)).json();
    assert.deepEqual(r.messages, []);
    assert.deepEqual(rec.seen.error, []);
    assert.deepEqual(rec.seen.gap, []);
  } finally {
    sub.close();
  }
});

test('hopping between two nodes of a cluster delivers every message exactly once', { timeout: 30000 }, async () => {
  const [p1, p2] = [await freePort(), await freePort()];
  const peer = (p) => ['--peer', `http://127.0.0.1:${p}`, '--cluster-secret', 's'];
  const [n1, n2] = await Promise.all([startNode(peer(p2), p1), startNode(peer(p1), p2)]);
  for (const n of [n1, n2]) {
    await until(async () => (await fetch(n.url + '/health')).status === 200, `${n.url}/health`);
  }
  const rec = recorder();
  let sub = subscribe(n1.url, ['room'], rec.callbacks);
  try {
    await publish(n1.url, ['room'], 1);
    await publish(n2.url, ['room'], 2);
    await publish(n1.url, ['room'], 3);
    await rec.next('message', 3);
    sub.close();
    const saved = sub.cursor;
    // published while the client is between nodes, on both nodes
    await publish(n2.url, ['room'], 4);
    await publish(n1.url, ['room'], 5);
    sub = subscribe(n2.url, ['room'], { ...rec.callbacks, since: saved });
    await rec.next('message', 5);
    await publish(n1.url, ['room'], 6);
    await publish(n2.url, ['room'], 7);
    await rec.next('message', 7);
    // and back to node 1
    sub.close();
    sub = subscribe(n1.url, ['room'], { ...rec.callbacks, since: sub.cursor });
    await publish(n2.url, ['room'], 8);
    await rec.next('message', 8);
    await publish(n1.url, ['room'], 9); // sentinel
    await publish(n2.url, ['room'], 10); // sentinel
    await rec.next('message', 10);
    const data = rec.data();
    assert.deepEqual([...data].sort((a, b) => a - b), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], `got ${data}`);
    assert.equal(new Set(rec.seen.message.map((m) => m.id)).size, 10);
    assert.deepEqual(rec.seen.error, []);
    assert.deepEqual(rec.seen.gap, []);
  } finally {
    sub.close();
  }
});

test('a killed node is retried with growing full-jitter backoff, never reported', { timeout: 20000 }, async () => {
  const { url, proc } = await startNode();
  const rec = recorder();
  const sub = subscribe(url, ['k'], rec.callbacks);
  try {
    await publish(url, ['k'], 1);
    await rec.next('message', 1);
    await until(async () => (await waiting(url)) === 1, 'the held poll');
    await stopNode(proc, 'SIGKILL');
    await rec.next('retry', 4);
    const delays = rec.seen.retry.map(([, delay]) => delay);
    delays.forEach((d, i) => assert.ok(d >= 0 && d <= 500 * 2 ** i, `retry ${i} after ${d} ms`));
    for (const [error] of rec.seen.retry) assert.ok(error instanceof Error);
    assert.deepEqual(rec.seen.error, []);
    assert.equal(sub.cursor !== null, true);
  } finally {
    sub.close();
  }
});

test('backoff: full jitter from 0.5 s to 20 s, Retry-After as a floor', () => {
  for (let attempt = 0; attempt < 12; attempt++) {
    const cap = Math.min(20000, 500 * 2 ** attempt);
    for (let i = 0; i < 50; i++) {
      const d = backoff(attempt);
      assert.ok(d >= 0 && d <= cap, `attempt ${attempt}: ${d}`);
    }
  }
  assert.ok(backoff(0, 3000) >= 3000);
});

test('a 4xx is reported once to onError and never retried', { timeout: 20000 }, async () => {
  const { url } = await startNode();
  const realFetch = globalThis.fetch;
  let fetches = 0;
  globalThis.fetch = (...args) => { fetches++; return realFetch(...args); };
  const rec = recorder();
  const sub = subscribe(url, ['bad name'], rec.callbacks);
  const rec2 = recorder();
  const sub2 = subscribe(url, ['ok'], { ...rec2.callbacks, since: 'not-a-cursor' });
  try {
    await rec.next('error', 1);
    await rec2.next('error', 1);
    assert.equal(rec.seen.error[0].status, 400);
    assert.equal(rec.seen.error[0].code, 'bad_channel_name');
    assert.equal(rec2.seen.error[0].status, 400);
    // longer than the first backoff could be: nothing more happens
    await pause(1200);
    assert.equal(fetches, 2);
    assert.equal(rec.seen.error.length, 1);
    assert.equal(rec2.seen.error.length, 1);
    assert.deepEqual([...rec.seen.retry, ...rec2.seen.retry], []);
  } finally {
    globalThis.fetch = realFetch;
    sub.close();
    sub2.close();
  }
});

test('gaps: evicted messages are reported once with onGap, the rest delivered', { timeout: 20000 }, async () => {
  const { url } = await startNode(['--max-messages-per-channel', '2']);
  for (const i of [1, 2, 3, 4, 5]) await publish(url, ['g'], i);
  const rec = recorder();
  const sub = subscribe(url, ['g'], { ...rec.callbacks, since: 0 });
  try {
    await rec.next('message', 2);
    assert.equal(rec.seen.gap.length, 1);
    assert.match(rec.seen.gap[0], /^c1\./);
    await publish(url, ['g'], 6); // sentinel
    await rec.next('message', 3);
    assert.deepEqual(rec.data(), [4, 5, 6]);
    assert.equal(rec.seen.gap.length, 1);
    assert.deepEqual(rec.seen.error, []);
  } finally {
    sub.close();
  }
});

test('since "now" skips cached messages; since a time starts after it', { timeout: 20000 }, async () => {
  const { url } = await startNode();
  await publish(url, ['n'], 1);
  const second = await publish(url, ['n'], 2);
  await publish(url, ['n'], 3);
  const rec = recorder();
  const sub = subscribe(url, ['n'], { ...rec.callbacks, since: 'now' });
  const rec2 = recorder();
  const sub2 = subscribe(url, ['n'], { ...rec2.callbacks, since: second.timestamp });
  try {
    await rec2.next('message', 1);
    await until(async () => (await waiting(url)) === 2, 'both polls held');
    await publish(url, ['n'], 4);
    await rec.next('message', 1);
    await rec2.next('message', 2);
    assert.deepEqual(rec.data(), [4]);
    assert.deepEqual(rec2.data(), [3, 4]);
    assert.deepEqual(rec.seen.gap, []);
  } finally {
    sub.close();
    sub2.close();
  }
});

test('a hidden page pauses the poll and a visible one resumes it, losing nothing', { timeout: 20000 }, async () => {
  const { url } = await startNode();
  const doc = Object.assign(new EventTarget(), { visibilityState: 'visible' });
  globalThis.document = doc;
  const rec = recorder();
  const sub = subscribe(url, ['v'], rec.callbacks);
  const show = (state) => { doc.visibilityState = state; doc.dispatchEvent(new Event('visibilitychange')); };
  try {
    await publish(url, ['v'], 1);
    await rec.next('message', 1);
    await until(async () => (await waiting(url)) === 1, 'the held poll');
    show('hidden');
    await until(async () => (await waiting(url)) === 0, 'the poll to be dropped');
    await publish(url, ['v'], 2);
    await publish(url, ['v'], 3);
    assert.deepEqual(rec.data(), [1]);
    show('visible');
    await rec.next('message', 3);
    await publish(url, ['v'], 4); // sentinel
    await rec.next('message', 4);
    assert.deepEqual(rec.data(), [1, 2, 3, 4]);
    assert.deepEqual(rec.seen.error, []);
  } finally {
    sub.close();
    delete globalThis.document;
  }
});

// An HS256 subscriber token, as a backend would sign it (pushup token makes them too).
function hs256(secret, claims) {
  const part = (v) => Buffer.from(JSON.stringify(v)).toString('base64url');
  const body = `${part({ alg: 'HS256', typ: 'JWT' })}.${part(claims)}`;
  return `${body}.${createHmac('sha256', secret).update(body).digest('base64url')}`;
}

test('presence: each subscription sees who joins and leaves, with their info', { timeout: 20000 }, async () => {
  const secret = 'a-subscribe-secret-of-32-bytes-at-least';
  const { url } = await startNode(['--presence', '--presence-window', '1', '--subscribe-secret', secret]);
  const exp = Math.floor(Date.now() / 1000) + 600;
  const tokenOf = (sub) => hs256(secret, { channels: ['room'], exp, sub, info: { name: sub.toUpperCase() } });
  const events = [];
  const wanted = [];
  const onPresence = (e) => {
    events.push(`${e.event} ${e.user}`);
    for (const w of wanted) if (events.includes(w.what)) w.resolve();
  };
  const seen = (what) => (events.includes(what) ? Promise.resolve()
    : new Promise((resolve) => wanted.push({ what, resolve })));
  const ann = subscribe(url, ['room'], { token: tokenOf('ann'), presence: true, onPresence });
  let bob = null;
  try {
    await seen('member_added ann'); // ann sees herself first
    bob = subscribe(url, ['room'], { token: tokenOf('bob'), presence: true });
    await seen('member_added bob');
    assert.deepEqual([...ann.members.get('room')].sort(),
      [['ann', { name: 'ANN' }], ['bob', { name: 'BOB' }]]);
    bob.close(); // his poll is cut; after the window he leaves
    await seen('member_removed bob');
    assert.deepEqual([...ann.members.get('room').keys()], ['ann']);
    const r = await (await fetch(`${url}/presence?channels=room&token=${tokenOf('ann')}`)).json();
    assert.deepEqual(r, { channels: { room: { occupancy: 1 } } });
  } finally {
    ann.close();
    if (bob) bob.close();
  }
});
