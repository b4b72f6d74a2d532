// The standing schema check (issue 31): every frame the router sends to a WebSocket client of
// this process is validated against upstream MAP's JSON Schemas (schema/, verbatim copies; see
// schema/README.md) with ajv, a real JSON Schema 2020-12 validator.
//
// - `installSchemaRecorder()` patches the `ws` client class once, before any socket opens, so
//   every socket is seen: the SDK's, the suites' raw ones. It records the requests each socket
//   sends (id -> method) and every text frame it receives.
// - `checkSchema()` validates what was recorded: a response against `MAPResponse` and its result
//   against the method's `responseType` (core/meta.json, ext/*/manifest.json); a notification
//   against `MAPNotification`; a request from the router against `MAPRequest`. It returns the
//   failures grouped by kind (method, or `error <code>`), and what passed, per kind.
// - schema/overlay.json widens the schema where the official SDK's types or JSON-RPC 2.0 itself
//   contradict it. Each entry says why; docs/compatibility.md ("The schema check") has the
//   evidence. Nothing else is widened: a new field or event type that breaks the schema fails.
import WebSocket from 'ws';
import { readFileSync, readdirSync, existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Ajv2020 from 'ajv/dist/2020.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const SCHEMA_DIR = path.join(HERE, 'schema');

const readJson = (p) => JSON.parse(readFileSync(p, 'utf8'));

/** Recorded sockets, in opening order: { sent: Map<id, method>, received: string[] }. */
const sockets = [];
const bySocket = new WeakMap();
let installed = false;

function recordOf(ws) {
  let rec = bySocket.get(ws);
  if (!rec) {
    // sent: request id -> method; filters: request id -> the eventTypes a map/subscribe named;
    // named: subscription id -> those types (vendor event types are valid only where named).
    rec = { sent: new Map(), filters: new Map(), named: new Map(), received: [] };
    bySocket.set(ws, rec);
    sockets.push(rec);
  }
  return rec;
}

/** Records every frame of every `ws` client socket of this process from now on. */
export function installSchemaRecorder() {
  if (installed) return;
  installed = true;
  const proto = WebSocket.prototype;
  const send = proto.send;
  proto.send = function (data, ...rest) {
    const rec = recordOf(this);
    try {
      const frames = [].concat(JSON.parse(String(data)));
      for (const f of frames) {
        if (f && typeof f === 'object' && 'method' in f && 'id' in f) {
          rec.sent.set(JSON.stringify(f.id), f.method);
          if (f.method === 'map/subscribe') rec.filters.set(JSON.stringify(f.id), f.params?.filter?.eventTypes ?? []);
        }
      }
    } catch {
      // Hostile input sent on purpose: its answers are still checked, without a method.
    }
    return send.call(this, data, ...rest);
  };
  const emit = proto.emit;
  proto.emit = function (event, ...args) {
    if (event === 'message' && !args[1]) recordOf(this).received.push(args[0].toString());
    return emit.call(this, event, ...args);
  };
}

/** The merged schema: core $defs plus every extension's, then the overlay applied. */
function loadSchema() {
  const core = readJson(path.join(SCHEMA_DIR, 'core', 'schema.json'));
  const responseTypes = new Map();
  const metas = [path.join(SCHEMA_DIR, 'core', 'meta.json')];
  for (const ext of readdirSync(path.join(SCHEMA_DIR, 'ext'))) {
    const dir = path.join(SCHEMA_DIR, 'ext', ext);
    const schema = path.join(dir, 'schema.json');
    if (existsSync(schema)) {
      for (const [name, def] of Object.entries(readJson(schema).$defs ?? {})) {
        if (!(name in core.$defs)) core.$defs[name] = def;
      }
    }
    metas.push(path.join(dir, 'manifest.json'));
  }
  for (const meta of metas) {
    for (const [method, m] of Object.entries(readJson(meta).methods ?? {})) {
      if (m.responseType && m.responseType in core.$defs) responseTypes.set(method, m.responseType);
    }
  }
  const overlay = readJson(path.join(SCHEMA_DIR, 'overlay.json'));
  for (const entry of overlay.entries) applyOverlay(core, entry);
  return { core, responseTypes };
}

/** Sets the value at a JSON pointer (`/$defs/X/properties/y`), creating objects on the way. */
function applyOverlay(schema, { pointer, value, why }) {
  if (!pointer || value === undefined || !why) throw new Error(`overlay entry needs pointer, value and why: ${pointer}`);
  const parts = pointer.split('/').slice(1).map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'));
  let at = schema;
  for (const p of parts.slice(0, -1)) {
    if (!(p in at)) throw new Error(`overlay pointer ${pointer}: no ${p} in the schema`);
    at = at[p];
  }
  at[parts.at(-1)] = value;
}

function compile() {
  const { core, responseTypes } = loadSchema();
  const ajv = new Ajv2020({ strict: false, allErrors: false });
  ajv.addSchema(core, 'map');
  const ref = (name) => {
    const v = ajv.getSchema(`map#/$defs/${name}`);
    if (!v) throw new Error(`no $defs/${name} in the schema`);
    return v;
  };
  return { ref, responseTypes };
}

const describe = (errors) =>
  (errors ?? [])
    .slice(0, 3)
    .map((e) => `${e.instancePath || '/'} ${e.message}${e.params ? ` ${JSON.stringify(e.params)}` : ''}`)
    .join('; ');

/**
 * Validates every recorded frame. Returns `{ frames, passed: Map<kind, n>, failed: Map<kind,
 * {count, example, errors}>, unchecked: Map<kind, n> }`; `unchecked` counts results of methods
 * the schema has no response type for (their envelope is still checked).
 */
export function checkSchema() {
  const { ref, responseTypes } = compile();
  const response = ref('MAPResponse');
  const notification = ref('MAPNotification');
  const request = ref('MAPRequest');
  const passed = new Map();
  const failed = new Map();
  const unchecked = new Map();
  let frames = 0;
  const bump = (m, k) => m.set(k, (m.get(k) ?? 0) + 1);
  const fail = (kind, text, errors) => {
    const f = failed.get(kind) ?? { count: 0, example: text.slice(0, 400), errors: describe(errors) };
    f.count++;
    failed.set(kind, f);
  };
  for (const rec of sockets) {
    for (const text of rec.received) {
      let parsed;
      try {
        parsed = JSON.parse(text);
      } catch {
        fail('unparsable frame', text, []);
        continue;
      }
      for (const frame of [].concat(parsed)) {
        frames++;
        if (frame && typeof frame === 'object' && 'method' in frame) {
          let kind = `${'id' in frame ? 'request' : 'notification'} ${frame.method}`;
          const v = 'id' in frame ? request : notification;
          let checked = frame;
          // A vendor event type is for subscriptions that name it exactly (docs/compatibility.md
          // §7): there the rest of the frame must still be valid.
          const type = frame.method === 'map/event' ? frame.params?.event?.type : undefined;
          if (type && !v(frame) && (rec.named.get(frame.params.subscriptionId) ?? []).includes(type)) {
            checked = structuredClone(frame);
            checked.params.event.type = 'system_error';
            kind = `notification map/event (vendor type ${type}, named by its subscription)`;
          }
          if (v(checked)) bump(passed, kind);
          else fail(kind, JSON.stringify(frame), v.errors);
          continue;
        }
        const method = frame && 'id' in frame ? rec.sent.get(JSON.stringify(frame.id)) : undefined;
        if (method === 'map/subscribe' && frame.result?.subscriptionId) {
          rec.named.set(frame.result.subscriptionId, rec.filters.get(JSON.stringify(frame.id)) ?? []);
        }
        const kind = frame && frame.error ? `error ${frame.error.code}${method ? ` (${method})` : ''}` : (method ?? 'response to an unknown request');
        if (!response(frame)) {
          fail(kind, JSON.stringify(frame), response.errors);
          continue;
        }
        if (frame.error || !method) {
          bump(passed, kind);
          continue;
        }
        const type = responseTypes.get(method);
        if (!type) {
          bump(unchecked, kind);
          continue;
        }
        const v = ref(type);
        if (v(frame.result)) bump(passed, kind);
        else fail(kind, JSON.stringify(frame.result), v.errors);
      }
    }
  }
  return { frames, passed, failed, unchecked };
}

/** Prints the check's outcome; returns the number of failing frames. */
export function reportSchema(write = (s) => process.stdout.write(s)) {
  const { frames, passed, failed, unchecked } = checkSchema();
  let bad = 0;
  for (const [kind, f] of failed) {
    bad += f.count;
    write(`FAIL - schema: ${kind}: ${f.count} frame(s) invalid: ${f.errors}\n    e.g. ${f.example}\n`);
  }
  const kinds = (m) => [...m.keys()].length;
  write(
    `schema: ${frames} frames from the router checked; ${kinds(passed)} kinds valid, ${kinds(failed)} invalid; ` +
      `${kinds(unchecked)} methods without a response type in the schema (envelope checked): ` +
      `${[...unchecked.keys()].sort().join(', ') || 'none'}\n`,
  );
  return bad;
}
