// Reading the router's Prometheus text (`GET /metrics`, docs/metrics.md) for the views that
// show live gauges the event log does not carry. Pure parsing plus one bounded fetch.

/**
 * Parses Prometheus / OpenMetrics text into `Map<name, [{labels, value}]>`. Comments, `# EOF`
 * and lines it cannot read are skipped.
 */
export function parseMetrics(text) {
  const out = new Map();
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const value = Number(m[3]);
    if (!Number.isFinite(value)) continue;
    const labels = {};
    for (const [, k, v] of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[k] = v.replace(/\\(.)/g, '$1');
    let list = out.get(m[1]);
    if (!list) out.set(m[1], (list = []));
    list.push({ labels, value });
  }
  return out;
}

/** The value of `name` whose labels include `labels` (summed over the matching series), or null. */
export function metric(families, name, labels = {}) {
  const list = families?.get(name);
  if (!list) return null;
  let sum = null;
  for (const s of list) {
    if (Object.entries(labels).every(([k, v]) => s.labels[k] === v)) sum = (sum ?? 0) + s.value;
  }
  return sum;
}

/**
 * One scrape through `ctx.fetchAuthed`: `{families, at}`, or `{error}` saying why not (`401`:
 * this principal's credential does not open /metrics).
 */
export async function scrape(ctx) {
  try {
    const res = await ctx.fetchAuthed('/metrics');
    if (!res.ok) return { error: res.status === 401 ? 'this credential may not read /metrics (401)' : `/metrics answered ${res.status}` };
    return { families: parseMetrics(await res.text()), at: Date.now() };
  } catch (err) {
    return { error: `/metrics did not answer (${err.name === 'TimeoutError' ? 'timeout' : err.message})` };
  }
}
