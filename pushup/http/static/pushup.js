// PushUp browser client: an ES module with no dependencies.
//
//   import { subscribe } from './pushup.js';
//   const sub = subscribe('https://push.example.com', ['news', 'chat:42'], {
//     onMessage: (m) => console.log(m.channels, m.data),
//   });
//   ... sub.cursor; sub.close();
//
// Long poll (default): one GET /subscribe for all channels, no custom headers
// (no CORS preflight), the cursor passed back every time, so every message is
// delivered exactly once across reconnects and across the nodes of a cluster.
// Network errors and 5xx are retried with full-jitter backoff (0.5 s growing to
// 20 s, Retry-After as a floor); a 4xx is reported to onError and ends it.
//
// Presence (a node started with --presence): `presence: true` follows who is
// subscribed to the channels, under the same cursor; `onPresence(event)` gets
// each {channel, event: 'member_added' | 'member_removed', user, info}, and
// `sub.members` is a Map of channel -> Map of user -> info kept from them
// (an event may say again what the Map holds: it is idempotent). The
// subscription names itself with a random `client` id, so its polls count as
// one subscriber (a user's two tabs are two subscribers, one member).

const SERVER_TIMEOUT = 50; // seconds the server holds a poll
const ABORT_AFTER = (SERVER_TIMEOUT + 10) * 1000;
const BACKOFF_MIN = 500;
const BACKOFF_MAX = 20000;

const noop = () => {};

// A callback that throws must not stop the subscription: rethrow it on its own.
function safely(fn, ...args) {
  try {
    fn(...args);
  } catch (e) {
    setTimeout(() => { throw e; }, 0);
  }
}

// Full jitter: a random delay up to a cap that doubles per failure (0.5 s ... 20 s).
export function backoff(attempt, retryAfterMs = 0) {
  const cap = Math.min(BACKOFF_MAX, BACKOFF_MIN * 2 ** attempt);
  return Math.max(Math.random() * cap, retryAfterMs);
}

function retryAfter(response) {
  const v = response && response.headers.get('Retry-After');
  if (!v) return 0;
  const s = Number(v);
  if (Number.isFinite(s)) return Math.max(0, s * 1000);
  const t = Date.parse(v);
  return Number.isFinite(t) ? Math.max(0, t - Date.now()) : 0;
}

async function httpError(response) {
  let code = 'http_' + response.status;
  let message = response.statusText || code;
  try {
    const body = await response.json();
    if (body && body.error) ({ code = code, message = message } = body.error);
  } catch { /* not JSON */ }
  const error = new Error(`${response.status} ${code}: ${message}`);
  error.status = response.status;
  error.code = code;
  return error;
}

export function subscribe(baseUrl, channels, options = {}) {
  const {
    onMessage = noop, onGap = noop, onError = noop, onClosed = noop, onRetry = noop,
    onPresence = noop, since, transport = 'long-poll', token, presence = false,
  } = options;
  const base = String(baseUrl).replace(/\/+$/, '');
  const names = (Array.isArray(channels) ? channels : [channels]).join(',');
  let cursor = null; // the latest cursor the server gave us
  let stopped = false;
  let paused = false;
  let failures = 0;
  let controller = null; // the poll in flight
  let timer = null; // a pending retry
  let source = null; // the EventSource, for transport "sse"
  const hasDoc = typeof document !== 'undefined';
  const hasWin = typeof window !== 'undefined' && typeof window.addEventListener === 'function';
  const useSse = transport === 'sse' && typeof EventSource !== 'undefined';
  const members = new Map(); // channel -> Map(user -> info), with `presence`
  const client = presence
    ? Array.from({ length: 16 }, () => Math.floor(Math.random() * 36).toString(36)).join('')
    : null;

  function position() {
    return cursor !== null ? cursor : (since ?? null);
  }

  function url(extra = '') {
    let u = `${base}/subscribe?channels=${encodeURIComponent(names)}`;
    const p = position();
    if (p !== null) u += `&since=${encodeURIComponent(String(p))}`;
    if (token) u += `&token=${encodeURIComponent(token)}`;
    if (client) u += `&presence=1&client=${client}`;
    return u + extra;
  }

  function fail(error) {
    if (stopped) return;
    stop();
    safely(onError, error);
  }

  function retry(error, response) {
    if (stopped) return;
    const delay = backoff(failures++, retryAfter(response));
    safely(onRetry, error, delay);
    timer = setTimeout(() => { timer = null; start(); }, delay);
  }

  function changed(event) {
    let here = members.get(event.channel);
    if (!here) members.set(event.channel, here = new Map());
    if (event.event === 'member_added') here.set(event.user, event.info ?? null);
    else here.delete(event.user);
    safely(onPresence, event);
  }

  function deliver(body) {
    for (const event of body.presence || []) changed(event);
    if (body.gap) safely(onGap, body.cursor);
    for (const m of body.messages || []) safely(onMessage, m);
    if (body.closed && body.closed.length) safely(onClosed, body.closed);
  }

  async function poll() {
    const ctl = new AbortController();
    controller = ctl;
    const abortTimer = setTimeout(() => ctl.abort(), ABORT_AFTER);
    let response;
    try {
      response = await fetch(url(`&timeout=${SERVER_TIMEOUT}`), { cache: 'no-store', signal: ctl.signal });
      if (response.status >= 400 && response.status < 500) return fail(await httpError(response));
      if (!response.ok) throw await httpError(response);
      const body = await response.json();
      if (controller !== ctl || stopped) return; // paused or closed meanwhile
      // The whole answer is delivered before the cursor moves past it, so
      // `cursor` always covers exactly what onMessage has seen.
      deliver(body);
      cursor = body.cursor;
      failures = 0;
    } catch (error) {
      if (controller !== ctl || stopped) return; // aborted by pause or close
      return retry(error, response);
    } finally {
      clearTimeout(abortTimer);
      if (controller === ctl) controller = null;
    }
    if (!stopped && !paused) poll();
  }

  // EventSource reconnects by itself (with Last-Event-ID: the stream names its
  // position before any message, so a reconnect loses nothing); it gives up on
  // a non-200 answer (a 204 when the stream has nothing left: every channel
  // closed, or until past), and then a plain request tells a 4xx from a 5xx.
  let open = names.split(','); // the channels not reported closed
  function openSource() {
    const es = new EventSource(url());
    source = es;
    es.onopen = () => { failures = 0; };
    es.onmessage = (e) => {
      if (e.lastEventId) cursor = e.lastEventId;
      safely(onMessage, JSON.parse(e.data));
    };
    const position = (e) => { if (e.lastEventId) cursor = e.lastEventId; };
    es.addEventListener('cursor', position);
    es.addEventListener('presence', (e) => changed(JSON.parse(e.data)));
    es.addEventListener('gap', (e) => {
      position(e);
      safely(onGap, e.data);
    });
    es.addEventListener('closed', (e) => {
      position(e);
      const gone = JSON.parse(e.data);
      safely(onClosed, gone);
      open = open.filter((name) => !gone.includes(name));
      if (!open.length) stop(); // the server ended the stream: nothing is left to follow
    });
    es.addEventListener('end', (e) => { position(e); stop(); }); // until has passed
    es.addEventListener('expired', (e) => {
      position(e);
      const body = JSON.parse(e.data);
      const error = new Error(`401 ${body.error.code}: ${body.error.message}`);
      error.status = 401;
      error.code = body.error.code;
      fail(error);
    });
    es.onerror = async () => {
      if (source !== es || es.readyState !== 2 /* CLOSED */) return;
      source = null;
      // The same request as a plain fetch tells why: 204 (nothing left to
      // stream), a 4xx, or something worth retrying.
      const ctl = new AbortController();
      let response;
      try {
        response = await fetch(url(), { cache: 'no-store', signal: ctl.signal,
                                        headers: { Accept: 'text/event-stream' } });
        if (response.status === 204) return stop();
        if (response.status >= 400 && response.status < 500) return fail(await httpError(response));
        if (response.ok) ctl.abort(); // an open stream: we only wanted its status
        retry(response.ok ? new Error('event stream closed') : await httpError(response), response);
      } catch (error) {
        retry(error, response);
      }
    };
  }

  function start() {
    if (stopped || paused || controller || source || timer) return;
    if (useSse) openSource();
    else poll();
  }

  function halt() {
    if (timer) clearTimeout(timer);
    timer = null;
    if (controller) controller.abort();
    controller = null;
    if (source) source.close();
    source = null;
  }

  function onVisibility() {
    if (document.visibilityState === 'hidden') {
      paused = true;
      halt();
    } else {
      paused = false;
      start();
    }
  }

  function onOnline() {
    failures = 0;
    if (timer) { clearTimeout(timer); timer = null; }
    start();
  }

  function stop() {
    stopped = true;
    halt();
    if (hasDoc) document.removeEventListener('visibilitychange', onVisibility);
    if (hasWin) window.removeEventListener('online', onOnline);
  }

  if (hasDoc) {
    document.addEventListener('visibilitychange', onVisibility);
    paused = document.visibilityState === 'hidden';
  }
  if (hasWin) window.addEventListener('online', onOnline);
  start();

  return {
    close: stop,
    get cursor() { return position(); },
    members,
  };
}
