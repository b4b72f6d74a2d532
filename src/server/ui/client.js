// A tiny MAP client over one WebSocket: JSON-RPC 2.0 requests with ids and a time limit, and
// the notifications the router sends a client (`map/event`, `map/message`, `map/auth/expiring`).
// It knows nothing about the dashboard; app.js drives it.

/** A JSON-RPC error answer, with its MAP `code` (-32601, 1003, 2001, ...) and `data`. */
export class RpcError extends Error {
  constructor(error) {
    super(error?.message ?? 'request failed');
    this.name = 'RpcError';
    this.code = error?.code;
    this.data = error?.data;
  }
}

/** Raised when the socket closes; `code` is the WebSocket close code (4001: credential expired). */
export class ClosedError extends Error {
  constructor(code, reason) {
    super(`connection closed (${code}${reason ? `: ${reason}` : ''})`);
    this.name = 'ClosedError';
    this.code = code;
    this.reason = reason;
  }
}

const OPEN_TIMEOUT_MS = 10_000;
const REQUEST_TIMEOUT_MS = 15_000;

export class MapClient {
  /**
   * @param {string} url `ws(s)://host/map`
   * @param {{onNotification?: (method: string, params: any) => void,
   *          onClose?: (err: ClosedError) => void}} handlers
   */
  constructor(url, handlers = {}) {
    this.url = url;
    this.handlers = handlers;
    this.nextId = 1;
    this.pending = new Map();
    this.ws = null;
    this.closed = null;
  }

  /** Opens the socket (bounded by a timeout). */
  open() {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(this.url);
      this.ws = ws;
      const timer = setTimeout(() => {
        ws.close();
        reject(new Error(`could not open ${this.url} within ${OPEN_TIMEOUT_MS / 1000} s`));
      }, OPEN_TIMEOUT_MS);
      ws.addEventListener('open', () => {
        clearTimeout(timer);
        resolve();
      });
      ws.addEventListener('message', (e) => this.#onFrame(e.data));
      ws.addEventListener('close', (e) => {
        clearTimeout(timer);
        const err = new ClosedError(e.code, e.reason);
        const wasOpen = this.closed === null;
        this.closed = err;
        for (const { reject: fail, timer: t } of this.pending.values()) {
          clearTimeout(t);
          fail(err);
        }
        this.pending.clear();
        reject(err);
        if (wasOpen) this.handlers.onClose?.(err);
      });
    });
  }

  /** Sends a request; resolves with its result, rejects with an RpcError or on timeout. */
  request(method, params = {}, timeoutMs = REQUEST_TIMEOUT_MS) {
    if (this.closed) return Promise.reject(this.closed);
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`${method} got no answer within ${timeoutMs / 1000} s`));
      }, timeoutMs);
      this.pending.set(id, { resolve, reject, timer });
      this.ws.send(JSON.stringify({ jsonrpc: '2.0', id, method, params }));
    });
  }

  /** Closes the socket (no reconnect is implied; that is the caller's business). */
  close() {
    if (this.ws && this.ws.readyState <= 1) this.ws.close(1000, 'dashboard closed');
  }

  #onFrame(text) {
    let frame;
    try {
      frame = JSON.parse(text);
    } catch {
      console.warn('map-router dashboard: unparsable frame', text);
      return;
    }
    for (const f of Array.isArray(frame) ? frame : [frame]) {
      if (f.id !== undefined && f.id !== null && (f.result !== undefined || f.error !== undefined)) {
        const waiter = this.pending.get(f.id);
        if (!waiter) continue;
        this.pending.delete(f.id);
        clearTimeout(waiter.timer);
        if (f.error) waiter.reject(new RpcError(f.error));
        else waiter.resolve(f.result);
      } else if (typeof f.method === 'string') {
        this.handlers.onNotification?.(f.method, f.params);
      }
    }
  }
}

/** The dashboard's WebSocket URL: the page's own host, `/map`. */
export function routerUrl(location) {
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  // The page redraws at most five times a second: the router may hold its events up to 100 ms
  // to write them together (`?linger=`, docs/dashboard.md); answers are never held.
  return `${scheme}//${location.host}/map?linger=100`;
}
