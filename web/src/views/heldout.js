// Held-out behaviour: per evaluation step, what the policy did on tasks it never
// trained on (from the evaluations' captured trajectories; services/dashboard/heldout.py).
import { lines } from '../charts.js';
import { empty, fmt, h, panel, pct, steps } from '../dom.js';

const PASS_ORDER = (k) => (k.startsWith('pass@') ? 0 : 1) * 1000 + (parseInt(k.slice(5), 10) || 0);

function passKeys(held) {
  const keys = new Set();
  for (const row of Object.values(held)) for (const k of Object.keys(row.pass || {})) keys.add(k);
  return [...keys].sort((a, b) => PASS_ORDER(a) - PASS_ORDER(b));
}

function reasons(termination) {
  return Object.entries(termination || {})
    .sort((a, b) => b[1] - a[1])
    .map(([r, n]) => `${r} ${n}`)
    .join(', ');
}

export function heldoutPanel(summary) {
  const held = summary.heldout || {};
  const st = steps(held);
  if (!st.length) return panel('heldout', 'Held-out behaviour', empty('No evaluation yet (set [run] eval_every).'));
  const keys = passKeys(held);
  const rate = (name) => Object.fromEntries(st.filter((s) => held[s][name] !== null).map((s) => [s, held[s][name]]));
  const head = ['step', 'trials', ...keys, 'submit', 'malformed / call', 'calls / trial', 'tokens / call', 'termination'];
  const body = st.map((s) => {
    const r = held[s];
    return h(
      'tr',
      { 'data-step': s },
      [s, r.trials + (r.infra ? ` (+${r.infra} infra)` : ''), ...keys.map((k) => fmt(r.pass[k])), pct(r.submit_rate), pct(r.malformed_rate), fmt(r.calls_per_trial, 2), fmt(r.response_tokens, 1), reasons(r.termination)].map((v) => h('td', String(v))),
    );
  });
  return panel(
    'heldout',
    'Held-out behaviour',
    h('p.note', 'Per evaluation step, from the captured trajectories of the evaluations (never from harness logs).'),
    lines(st, [
      { label: 'pass@1', values: Object.fromEntries(st.filter((s) => held[s].pass['pass@1'] !== undefined).map((s) => [s, held[s].pass['pass@1']])) },
      { label: 'submit rate', values: rate('submit_rate') },
      { label: 'malformed / call', values: rate('malformed_rate') },
    ], { yMin: 0, yMax: 1, height: 170 }),
    h('table.heldout', h('thead', h('tr', head.map((c) => h('th', c)))), h('tbody', body)),
  );
}
