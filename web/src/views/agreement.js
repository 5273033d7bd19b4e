// Train/inference agreement per step, and why a step has none: the trainer measures it
// only on tokens sampled by the very weights it trains (services/dashboard/panels.py,
// agreement_gaps), so a batch of stale rollouts has no point on these charts.
import { lines } from '../charts.js';
import { empty, h, panel, steps } from '../dom.js';
import { alertsOf, series } from './shared.js';

function gapsNote(gaps) {
  const st = steps(gaps);
  if (!st.length) return null;
  return h(
    'div.note.gaps',
    { 'data-agreement-gaps': st.join(',') },
    h('span', 'No agreement at '),
    h('ul', st.map((s) => h('li', { 'data-gap-step': s }, `step ${s}: ${gaps[s]}`))),
    h('span', 'Agreement is measured only on tokens sampled by the weights being trained; IS weights over all tokens are in is/*.'),
  );
}

export function agreementPanel(summary) {
  const metrics = summary.metrics;
  const p = series(metrics, 'agreement/pearson');
  if (!steps(p).length) return panel('agreement', 'Train/inference agreement', empty('The trainer recorded no agreement metrics.'));
  const gaps = summary.agreement_gaps || {};
  // The gap steps stay on the axis, so a missing point reads as missing, not as a shorter run.
  const st = [...new Set([...steps(p), ...steps(gaps)])].sort((a, b) => a - b);
  return panel(
    'agreement',
    'Train/inference agreement',
    alertsOf(summary, 'agreement_drop'),
    h(
      'div.grid3',
      h('div.mini', h('h3', 'Pearson'), lines(st, [{ label: 'pearson', values: p }], { height: 170, showGaps: true })),
      h(
        'div.mini',
        h('h3', 'mean / max |Δ logprob|'),
        lines(st, [
          { label: 'mean |Δ|', values: series(metrics, 'agreement/mean_abs_diff') },
          { label: 'max |Δ|', values: series(metrics, 'agreement/max_abs_diff'), axis: 'y2' },
        ], { height: 170, showGaps: true }),
      ),
      h(
        'div.mini',
        h('h3', 'log-ratio spikes · ESS'),
        lines(st, [
          { label: 'q01', values: series(metrics, 'agreement/log_ratio_q01'), dashed: true },
          { label: 'q99', values: series(metrics, 'agreement/log_ratio_q99'), dashed: true },
          { label: 'ESS', values: series(metrics, 'agreement/ess', 'is/ess'), axis: 'y2' },
        ], { height: 170, showGaps: true }),
      ),
    ),
    gapsNote(gaps),
  );
}
