// The runs under the dashboard's root: training runs first, then evaluations, then
// single trials (services/dashboard/runlist.py orders and fills them in).
import { api, links } from '../api.js';
import { fmt, h, panel } from '../dom.js';

const when = (r) => (typeof r.created_at === 'number' ? new Date(r.created_at * 1000).toISOString().slice(0, 16).replace('T', ' ') : '—');
const dir = (r) => (r.problems ? h('span.warn', `${r.problems} problem(s)`) : 'ok');
const status = (r) => h(`span.status.${r.status}`, { title: r.error || '' }, r.status);

function table(kind, head, rows) {
  return h('div.scroll', h('table.list', { 'data-section': kind }, h('thead', h('tr', head.map((c) => h('th', c)))), h('tbody', rows)));
}

function trainingRuns(runs, picked) {
  const rows = runs.map((r) =>
    h(
      'tr',
      { 'data-run': r.run_id, 'data-kind': r.kind },
      h('td', h('input', { type: 'checkbox', onchange: (e) => (e.target.checked ? picked.add(r.run_id) : picked.delete(r.run_id)) })),
      h('td', h('a', { href: links.run(r.run_id) }, r.run_id)),
      h('td', status(r)),
      h('td', r.model || '—'),
      h('td', r.harness || '—'),
      h('td', `${r.steps ?? '—'}${r.steps_planned ? ` / ${r.steps_planned}` : ''}`),
      h('td', fmt(r.reward)),
      h('td', fmt(r.validation)),
      h('td', when(r)),
      h('td', dir(r)),
    ),
  );
  return table('run', ['', 'run', 'status', 'model', 'harness', 'optimizer steps', 'train reward', 'validation pass@1', 'started', 'directory'], rows);
}

function evaluations(runs) {
  const rows = runs.map((r) =>
    h(
      'tr',
      { 'data-run': r.run_id, 'data-kind': r.kind },
      h('td', h('a', { href: links.run(r.run_id) }, r.run_id)),
      h('td', status(r)),
      h('td', r.model || '—'),
      h('td', r.harness || '—'),
      h('td', (r.evaluated_steps || []).join(', ') || '—'),
      h('td', fmt(r.validation)),
      h('td', when(r)),
      h('td', dir(r)),
    ),
  );
  return table('eval', ['evaluation', 'status', 'model', 'harness', 'evaluated steps', 'pass@1', 'started', 'directory'], rows);
}

function trials(runs) {
  // A trial's page is its trajectory: the capture's run id is the trial id.
  const rows = runs.map((r) =>
    h(
      'tr',
      { 'data-run': r.run_id, 'data-kind': r.kind },
      h('td', h('a', { href: links.trajectory(r.run_id, r.run_id) }, r.run_id)),
      h('td', status(r)),
      h('td', r.task_id || '—'),
      h('td', r.model || '—'),
      h('td', r.harness || '—'),
      h('td', { 'data-reward': r.reward ?? '' }, fmt(r.reward)),
      h('td', r.termination_reason ? h('span.reason', r.termination_reason) : '—'),
      h('td', when(r)),
      h('td', dir(r)),
    ),
  );
  return table('trial', ['trial', 'status', 'task', 'model', 'harness', 'reward', 'termination', 'started', 'directory'], rows);
}

export async function renderRuns(view) {
  const { runs, root } = await api.runs();
  document.getElementById('run-title').textContent = '';
  const picked = new Set();
  const of = (kind) => runs.filter((r) => r.kind === kind);
  const [train, evals, single] = [of('run'), of('eval'), of('trial')];
  const go = h('a.button', { href: '#', id: 'compare-picked', onclick: (e) => { e.preventDefault(); if (picked.size >= 2) window.location.href = links.compare([...picked]); } }, 'Compare selected');
  const sections = [
    panel(
      'runs',
      'Training runs',
      h('p.note', `under ${root}`),
      train.length ? trainingRuns(train, picked) : h('p.empty', runs.length ? 'No training run here yet (harnessrl run CONFIG starts one).' : 'No run directories here yet.'),
      train.length > 1 ? go : null,
    ),
    evals.length ? panel('evaluations', `Evaluations (${evals.length})`, evaluations(evals)) : null,
    single.length ? panel('trials', `Single trials (${single.length})`, h('p.note', 'harnessrl trial run: one trial each, no training.'), trials(single)) : null,
  ];
  view.replaceChildren(...sections.filter(Boolean));
}
