// The trajectories table of a run, with filters by step, task and termination reason.
import { fmt, h, panel, seconds } from '../dom.js';

export function trajectoriesPanel(runId, rows, links) {
  const uniq = (key) => [...new Set(rows.map((r) => r[key]))].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  const filters = { step: '', task_id: '', termination_reason: '' };
  const body = h('tbody');
  const count = h('span.note');
  const select = (key, label) =>
    h(
      'label',
      `${label} `,
      h(
        'select',
        { 'data-filter': key, onchange: (e) => { filters[key] = e.target.value; draw(); } },
        h('option', { value: '' }, 'all'),
        uniq(key).map((v) => h('option', { value: String(v) }, String(v))),
      ),
    );
  function draw() {
    const shown = rows.filter((r) => Object.entries(filters).every(([k, v]) => v === '' || String(r[k]) === v));
    count.textContent = `${shown.length} of ${rows.length}`;
    body.replaceChildren(
      ...shown.map((r) =>
        h(
          'tr',
          { 'data-trial': r.trial_id },
          h('td', h('a', { href: links.trajectory(runId, r.trial_id) }, r.trial_id)),
          h('td', r.step),
          h('td', r.task_id),
          h('td.mono', r.group_id),
          h('td', r.reward === null ? '—' : fmt(r.reward)),
          h('td', h(`span.reason.${r.infra ? 'infra' : 'policy'}`, r.termination_reason)),
          h('td', r.model_calls ?? r.turns),
          h('td', r.completion_tokens),
          h('td', seconds(r.timings.agent_s)),
        ),
      ),
    );
  }
  draw();
  return panel(
    'trajectories',
    'Trajectories',
    rows.length
      ? [
          h('div.filters', select('step', 'step'), select('task_id', 'task'), select('termination_reason', 'reason'), count),
          h(
            'div.scroll.tall',
            h(
              'table.list',
              h('thead', h('tr', ['trial', 'step', 'task', 'group', 'reward', 'termination', 'model calls', 'sampled tokens', 'agent'].map((c) => h('th', c)))),
              body,
            ),
          ),
        ]
      : h('p.empty', 'No trajectories (see the problems above if a capture store is missing).'),
  );
}
