// The charts view (issue 46). Interface (app.js): `render(root, ctx)` draws into the view's
// element when the view is shown; `observe(event)` (optional) is called with every event of
// the log in order, from its start, whether the view is shown or not.
import { el, replaceChildren } from './util.js';
import './stats.js';

export function render(root, ctx) {
  if (root.dataset.drawn === 'stub') return;
  root.dataset.drawn = 'stub';
  replaceChildren(root, el('p', { class: 'muted' }, 'Coming soon.'));
}
