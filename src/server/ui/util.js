// Small helpers shared by the dashboard's modules: DOM building, formatting, event ids.

/**
 * Creates an element: `el('div', {class: 'x', 'data-testid': 'y', onclick: f}, child, ...)`.
 * Children may be strings (text), nodes, or arrays of those; null and false are skipped.
 * Attributes named `on<event>` become listeners; `true` sets a boolean attribute.
 */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') {
      node.addEventListener(key.slice(2), value);
    } else if (value === true) {
      node.setAttribute(key, '');
    } else {
      node.setAttribute(key, String(value));
    }
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else node.append(child instanceof Node ? child : String(child));
  }
}

const SVG = 'http://www.w3.org/2000/svg';

/** As `el`, for an SVG element: `svg('line', {x1, y1, class: 'lane'})`. */
export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith('on') && typeof v === 'function') node.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) if (c !== null && c !== undefined && c !== false) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

/** Replaces every child of `node`. */
export function replaceChildren(node, ...children) {
  node.replaceChildren();
  append(node, children);
}

/** `12:03:04.123` for a Unix-ms timestamp. */
export function clock(ms) {
  if (typeof ms !== 'number') return '';
  const d = new Date(ms);
  const pad = (n, w = 2) => String(n).padStart(w, '0');
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

/** JSON on one line, cut to `max` characters. */
export function compact(value, max = 160) {
  let text;
  try {
    text = JSON.stringify(value);
  } catch {
    text = String(value);
  }
  if (text === undefined) return '';
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** Indented JSON for detail panes. */
export function pretty(value) {
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

/**
 * Event ids are ULIDs: fixed-length Crockford base32 strings that increase along the log, so
 * comparing them as strings compares their positions. Returns <0, 0 or >0.
 */
export function compareIds(a, b) {
  if (a === b) return 0;
  if (a === null || a === undefined) return -1;
  if (b === null || b === undefined) return 1;
  return a < b ? -1 : 1;
}

const CROCKFORD = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';

/** The millisecond timestamp inside a ULID (its first 10 characters), or null. */
export function ulidTime(id) {
  if (typeof id !== 'string' || id.length < 10) return null;
  let ms = 0;
  for (const ch of id.slice(0, 10).toUpperCase()) {
    const v = CROCKFORD.indexOf(ch);
    if (v < 0) return null;
    ms = ms * 32 + v;
  }
  return ms;
}

/** A number formatted for people: `12 345`, `0.0123`. */
export function num(n, digits = 0) {
  if (typeof n !== 'number' || !Number.isFinite(n)) return '–';
  return n.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
}
