// Where a step's CPU goes: CPU-seconds by component (harnessrl/cpu.py), recorded with each
// trainer step as cpu/<component>_s (the window since the step before) and for the whole
// run in run.json's cpu_s. Measured by the kernel, per thread and per reaped process tree.
import { stackedBars } from '../charts.js';
import { empty, fmt, h, panel, steps } from '../dom.js';
import { series } from './shared.js';

export const CPU_COMPONENTS = [
  ['engine', 'engine (forward passes)', '#2f6fde'],
  ['trainer', 'trainer (optimizer step)', '#8e5cc4'],
  ['harness', 'harness processes (agent phase)', '#e8772e'],
  ['sandbox', 'sandbox (setup, verifier, other children)', '#2aa876'],
  ['services', 'proxy, capture, other services (event loop)', '#7f8c8d'],
];

function share(values) {
  const total = Object.values(values).reduce((n, v) => n + (v || 0), 0);
  return (v) => (total > 0 ? `${((100 * (v || 0)) / total).toFixed(0)}%` : '—');
}

export function cpuPanel(run, summary) {
  const bySeries = Object.fromEntries(CPU_COMPONENTS.map(([key]) => [key, series(summary.metrics, `cpu/${key}_s`)]));
  const st = [...new Set(Object.values(bySeries).flatMap((s) => steps(s)))].sort((a, b) => a - b);
  const title = 'CPU by component';
  if (!st.length) return panel('cpu', title, empty('Not recorded (a run from before CPU accounting, or a trainer without it).'));
  const at = st[st.length - 1];
  const latest = Object.fromEntries(CPU_COMPONENTS.map(([key]) => [key, bySeries[key][at]]));
  const whole = (run.info && run.info.cpu_s) || null;
  const stepShare = share(latest);
  const runShare = whole ? share(whole) : null;
  const table = h(
    'table.kv.cpu',
    h('tr', h('th', 'component'), h('th', `step ${at}`), h('th', 'share'), whole ? [h('th', 'whole run'), h('th', 'share')] : null),
    CPU_COMPONENTS.map(([key, label]) =>
      h(
        'tr',
        { 'data-cpu': key },
        h('th', label),
        h('td', `${fmt(latest[key], 1)} s`),
        h('td', stepShare(latest[key])),
        whole ? [h('td', `${fmt(whole[key], 1)} s`), h('td', runShare(whole[key]))] : null,
      ),
    ),
  );
  const stacks = CPU_COMPONENTS.map(([key, label, color]) => ({ label, values: bySeries[key], color }));
  return panel(
    'cpu',
    title,
    h('div.cols', stackedBars(st, stacks, { yTitle: 'CPU-seconds' }), table),
    h(
      'p.note',
      'CPU-seconds (user + system) this run\'s process and its children spent between one trainer step and the next, '
        + 'counted by the kernel: per named thread (the engine\'s and the trainer\'s, with their OpenMP workers) and per '
        + 'sandbox process tree when it is reaped (the agent phase\'s as the harness\'s). Services: the rest of the process. '
        + 'Docker and Kubernetes sandboxes run outside it: their processes are not counted here.',
    ),
  );
}
