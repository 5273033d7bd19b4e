// Two (to four) runs side by side: the same series overlaid per chart.
import { api } from '../api.js';
import { PALETTE, lines } from '../charts.js';
import { empty, h, panel, steps } from '../dom.js';

function metricSeries(run, name) {
  const out = {};
  for (const m of run.metrics) if (m.values[name] !== undefined) out[m.step] = m.values[name];
  return out;
}

const CHARTS = [
  ['train reward', (r) => metricSeries(r, 'reward/mean')],
  ['success rate', (r) => r.success_rate],
  ['validation score', (r) => r.validation],
  ['infrastructure share', (r) => r.infra_share],
  ['zero-variance group share', (r) => r.zero_variance_share],
  ['mean turns', (r) => r.mean_turns],
  ['train/inference Pearson', (r) => metricSeries(r, 'agreement/pearson')],
  ['gradient norm', (r) => metricSeries(r, 'optim/grad_norm')],
];

export async function renderCompare(view) {
  const params = new URLSearchParams(window.location.search);
  const chosen = (params.get('runs') || '').split(',').filter(Boolean);
  // Single trials have no per-step series: only training runs and evaluations compare.
  const runs = (await api.runs()).runs.filter((r) => r.kind !== 'trial');
  document.getElementById('run-title').textContent = 'compare';
  const pickers = [0, 1].map((i) =>
    h('select', { 'data-pick': i }, h('option', { value: '' }, '—'), runs.map((r) => h('option', { value: r.run_id, selected: chosen[i] === r.run_id }, r.run_id))),
  );
  const go = h('button', { onclick: () => { const ids = pickers.map((p) => p.value).filter(Boolean); if (ids.length === 2) window.location.href = `/compare?runs=${ids.map(encodeURIComponent).join(',')}`; } }, 'Compare');
  const head = panel('compare-pick', 'Compare runs', h('div.filters', pickers[0], ' vs ', pickers[1], go));
  if (chosen.length < 2) {
    view.replaceChildren(head, empty('Pick two runs.'));
    return;
  }
  const data = await api.compare(chosen);
  const charts = CHARTS.map(([title, get]) => {
    const per = data.runs.map((r) => get(r) || {});
    const st = [...new Set(per.flatMap((s) => steps(s)))].sort((a, b) => a - b);
    return h(
      'div.mini',
      h('h3', title),
      st.length ? lines(st, data.runs.map((r, i) => ({ label: r.run_id, values: per[i], color: PALETTE[i] })), { height: 170 }) : empty('not recorded in these runs'),
    );
  });
  view.replaceChildren(head, panel('compare', `${chosen.join(' vs ')}`, h('div.grid3', charts)));
}
