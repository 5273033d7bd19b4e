// Helpers of the run page's panels (run.js, agreement.js).
import { h } from '../dom.js';

// A metric per step (the first of the names present), from the summary's records.
export function series(metrics, ...names) {
  const out = {};
  for (const m of metrics) {
    for (const n of names) {
      if (m.values[n] !== undefined) {
        out[m.step] = m.values[n];
        break;
      }
    }
  }
  return out;
}

export function alertsOf(summary, ...kinds) {
  const found = summary.alerts.filter((a) => kinds.includes(a.kind));
  return found.length ? h('div.alerts', found.map((a) => h('p.alert', { 'data-alert': a.kind }, `⚠ ${a.message}`))) : null;
}
