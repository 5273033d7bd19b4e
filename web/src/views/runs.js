// The runs under the dashboard's root, newest first, with a way to compare two.
import { api, links } from '../api.js';
import { fmt, h, panel } from '../dom.js';

export async function renderRuns(view) {
  const { runs, root } = await api.runs();
  document.getElementById('run-title').textContent = '';
  const picked = new Set();
  const go = h('a.button', { href: '#', id: 'compare-picked', onclick: (e) => { e.preventDefault(); if (picked.size >= 2) window.location.href = links.compare([...picked]); } }, 'Compare selected');
  const rows = runs.map((r) =>
    h(
      'tr',
      { 'data-run': r.run_id },
      h('td', h('input', { type: 'checkbox', onchange: (e) => (e.target.checked ? picked.add(r.run_id) : picked.delete(r.run_id)) })),
      h('td', h('a', { href: links.run(r.run_id) }, r.run_id)),
      h('td', h(`span.status.${r.status}`, r.status)),
      h('td', r.model || '—'),
      h('td', r.harness || '—'),
      h('td', `${r.steps ?? '—'}${r.steps_planned ? ` / ${r.steps_planned}` : ''}`),
      h('td', fmt(r.reward)),
      h('td', r.problems ? h('span.warn', `${r.problems} problem(s)`) : 'ok'),
    ),
  );
  view.replaceChildren(
    panel(
      'runs',
      'Runs',
      h('p.note', `under ${root}`),
      runs.length
        ? h('table.list', h('thead', h('tr', ['', 'run', 'status', 'model', 'harness', 'step', 'train reward', 'directory'].map((c) => h('th', c)))), h('tbody', rows))
        : h('p.empty', 'No run directories here yet.'),
      runs.length > 1 ? go : null,
    ),
  );
}
