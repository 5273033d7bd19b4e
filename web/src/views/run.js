// The run page: every panel of the run, re-rendered when SSE says the run moved.
import { api, links, subscribe } from '../api.js';
import { REASON_COLORS, STEP_AXIS, bars, lines, stackedBars } from '../charts.js';
import { empty, fmt, h, panel, pct, seconds, steps } from '../dom.js';
import { agreementPanel } from './agreement.js';
import { cpuPanel } from './cpu.js';
import { alertsOf, series } from './shared.js';
import { analysisPanel } from './analysis.js';
import { heldoutPanel } from './heldout.js';
import { trajectoriesPanel } from './table.js';

const INFRA = new Set(['verifier_timeout', 'env_setup_failed', 'verifier_error', 'engine_error', 'proxy_error', 'cancelled']);

const ALIASES = {
  reward: ['reward/mean', 'critic/score/mean'],
  entropy: ['loss/entropy', 'actor/entropy', 'entropy/mean'],
  kl: ['loss/kl', 'loss/ppo_kl', 'actor/ppo_kl', 'kl/mean'],
  clip: ['loss/pg_clipfrac', 'loss/clipfrac', 'actor/pg_clipfrac', 'loss/is_clipped_frac'],
  grad: ['optim/grad_norm', 'actor/grad_norm'],
  stepTime: ['step/seconds', 'timing_s/step'],
  tokens: ['batch/policy_tokens'],
  idle: ['trainer/idle_fraction'],
  queue: ['queue/depth', 'queue/groups_pending', 'trainer/groups_pending'],
};

const m = (metrics, key) => series(metrics, ...ALIASES[key]);

function last(obj) {
  const s = steps(obj);
  return s.length ? obj[s[s.length - 1]] : null;
}

function trainTokensPerS(metrics) {
  const tok = m(metrics, 'tokens');
  const secs = m(metrics, 'stepTime');
  const out = {};
  for (const s of steps(tok)) if (secs[s] > 0) out[s] = tok[s] / secs[s];
  return out;
}

function overviewPanel(run, summary) {
  const metrics = summary.metrics;
  const info = run.info || {};
  // Updates done: the trainer's own step count (the charts' axis is the rollout step).
  const updates = metrics.length ? Math.max(...metrics.map((x) => x.trainer_step ?? x.step)) : null;
  const tps = trainTokensPerS(metrics);
  const kv = (k, v) => h('tr', h('th', k), h('td', v));
  const status = run.status;
  const facts = h(
    'table.kv',
    kv('run', run.run_id),
    kv('status', info.status || 'unknown'),
    kv('model', info.model || '—'),
    kv('harness', info.harness || '—'),
    kv('engine', info.engine || '—'),
    kv('group size G', info.group_size ?? '—'),
    kv('groups per step', info.batch_groups ?? '—'),
    kv('optimizer steps', `${updates ?? '—'}${info.steps_planned ? ` / ${info.steps_planned}` : ''}`),
    status ? kv('trainer', `${status.state}, policy v${status.policy_version}, ${status.groups_pending} groups pending`) : null,
    kv('trajectories', `${summary.finalized} finished of ${summary.trajectories}`),
  );
  const latest = h(
    'table.kv.latest',
    kv('train reward', fmt(last(m(metrics, 'reward')))),
    kv('success rate', pct(last(summary.success_rate))),
    kv('validation score', fmt(last(summary.validation))),
    kv('entropy', fmt(last(m(metrics, 'entropy')))),
    kv('KL', fmt(last(m(metrics, 'kl')))),
    kv('clip fraction', fmt(last(m(metrics, 'clip')))),
    kv('gradient norm', fmt(last(m(metrics, 'grad')))),
    kv('step time', seconds(last(m(metrics, 'stepTime')))),
    kv('train tokens/s', fmt(last(tps), 1)),
    kv('rollout tokens/s', fmt(last(summary.rollout_tokens_per_s), 1)),
    kv('mean response tokens', fmt(last(summary.behaviour.mean_response_tokens), 1)),
    kv('mean turns', fmt(last(summary.behaviour.mean_turns), 2)),
    ...maskingRows(summary.masking, kv),
  );
  const rewardSteps = unionSteps(m(metrics, 'reward'), summary.validation, summary.success_rate);
  const optSteps = unionSteps(m(metrics, 'entropy'), m(metrics, 'kl'), m(metrics, 'clip'), m(metrics, 'grad'));
  const perfSteps = unionSteps(m(metrics, 'stepTime'), tps, summary.rollout_tokens_per_s);
  const lenSteps = unionSteps(summary.behaviour.mean_response_tokens, summary.behaviour.mean_turns);
  const mask = summary.masking || { masked_rows: {}, dropped_segments: {}, by_reason: {} };
  const masked = unionSteps(mask.masked_rows, mask.dropped_segments);
  const small = (title, s, chart) => h('div.mini', h('h3', title), s.length ? chart() : empty('not recorded'));
  return panel(
    'overview',
    'Run overview',
    h('div.cols', facts, latest),
    h(
      'div.grid4',
      small('reward & validation', rewardSteps, () =>
        lines(rewardSteps, [
          { label: 'train reward', values: m(metrics, 'reward') },
          { label: 'success rate', values: summary.success_rate, dashed: true },
          { label: 'validation', values: summary.validation },
        ], { height: 160 }),
      ),
      small('entropy · KL · clip', optSteps, () =>
        lines(optSteps, [
          { label: 'entropy', values: m(metrics, 'entropy') },
          { label: 'KL', values: m(metrics, 'kl') },
          { label: 'clip frac', values: m(metrics, 'clip') },
          { label: 'grad norm', values: m(metrics, 'grad'), axis: 'y2' },
        ], { height: 160 }),
      ),
      small('step time · tokens/s', perfSteps, () =>
        lines(perfSteps, [
          { label: 'step s', values: m(metrics, 'stepTime') },
          { label: 'train tok/s', values: tps, axis: 'y2' },
          { label: 'rollout tok/s', values: summary.rollout_tokens_per_s, axis: 'y2', dashed: true },
        ], { height: 160 }),
      ),
      masked.length
        ? small('masked rows · dropped segments', masked, () =>
            lines(masked, [
              { label: 'masked rows', values: mask.masked_rows },
              { label: 'masked: infra', values: mask.by_reason.infra || {}, dashed: true },
              { label: 'dropped segments', values: mask.dropped_segments, axis: 'y2' },
            ], { height: 160 }),
          )
        : null,
      small('response length · turns', lenSteps, () =>
        lines(lenSteps, [
          { label: 'response tokens', values: summary.behaviour.mean_response_tokens },
          { label: 'turns', values: summary.behaviour.mean_turns, axis: 'y2' },
        ], { height: 160 }),
      ),
    ),
    h(
      'p.note',
      { 'data-step-convention': '' },
      'Every chart\'s step N: the rollouts sampled by the policy after N optimizer updates, and the update trained on them '
        + '(the trainer\'s step N+1 in metrics.jsonl). Validation at N evaluates the policy after N updates.',
    ),
    run.config ? h('details', h('summary', 'resolved config (config.toml)'), h('pre.config', run.config)) : null,
  );
}

// verl's agent loop (harnessrl/* metrics): rows trained with weight 0, by reason, and
// segments verl could not take. Shown only when the trainer recorded them.
function maskingRows(mask, kv) {
  if (!mask || !unionSteps(mask.masked_rows, mask.dropped_segments).length) return [];
  const s = steps(mask.masked_rows);
  const at = s.length ? s[s.length - 1] : null;
  const why = Object.entries(mask.by_reason)
    .filter(([r, v]) => r !== 'infra' && at !== null && v[at] > 0)
    .map(([r, v]) => `${r} ${fmt(v[at])}`);
  return [
    h('tr', { 'data-metric': 'masked_rows' }, h('th', 'masked rows'), h('td', `${fmt(last(mask.masked_rows))}${why.length ? ` (${why.join(', ')})` : ''}`)),
    h('tr', { 'data-metric': 'dropped_segments' }, h('th', 'dropped segments'), h('td', fmt(last(mask.dropped_segments)))),
  ];
}

function unionSteps(...objs) {
  const all = new Set();
  for (const o of objs) for (const s of steps(o)) all.add(s);
  return [...all].sort((a, b) => a - b);
}

function terminationPanel(summary) {
  const t = summary.termination;
  const st = steps(t.by_step);
  if (!st.length) return panel('termination', 'Termination reasons per step', empty('No finished trials yet.'));
  const stacks = t.reasons.map((r) => ({
    label: INFRA.has(r) ? `${r} (infra)` : r,
    values: Object.fromEntries(st.map((s) => [s, t.by_step[s][r] || 0])),
    color: REASON_COLORS[r],
  }));
  return panel(
    'termination',
    'Termination reasons per step',
    alertsOf(summary, 'infra_spike'),
    stackedBars(st, stacks, { yTitle: 'trials' }),
    h('p.note', `Infrastructure reasons (weight 0 in the loss): ${t.infra_reasons.join(', ')}.`),
  );
}

function groupsPanel(summary) {
  const g = summary.groups;
  const st = steps(g.distribution);
  if (!g.groups.length) return panel('groups', 'Successes out of G per group', empty('No groups yet.'));
  const keys = [...new Set(st.flatMap((s) => Object.keys(g.distribution[s])))].sort((a, b) => frac(a) - frac(b));
  const stacks = keys.map((k) => ({
    label: `${k} successes`,
    values: Object.fromEntries(st.map((s) => [s, g.distribution[s][k] || 0])),
    color: shade(frac(k)),
  }));
  const byStep = {};
  for (const grp of g.groups) (byStep[grp.step] = byStep[grp.step] || []).push(grp);
  const table = h(
    'table.groups',
    h('tr', h('th', 'step'), h('th', 'groups (task: successes/G)')),
    Object.keys(byStep).map((s) =>
      h(
        'tr',
        h('td', s),
        h(
          'td',
          byStep[s].map((grp) =>
            h(
              'span.badge',
              {
                style: `background:${shade(grp.successes / grp.G)}`,
                title: `${grp.group_id}: ${grp.valid} valid, ${grp.finished} finished${grp.zero_variance ? ', zero variance' : ''}`,
              },
              `${grp.task_id}: ${grp.successes}/${grp.G}${grp.complete ? '' : '…'}`,
            ),
          ),
        ),
      ),
    ),
  );
  return panel(
    'groups',
    'Successes out of G per group',
    h('p.note', `G = ${g.sizes.join(', ')} (from the run's groups); success: reward ≥ ${summary.success_threshold}.`),
    alertsOf(summary, 'zero_variance_growth'),
    h(
      'div.cols',
      st.length ? stackedBars(st, stacks, { yTitle: 'groups' }) : empty('No complete group yet.'),
      steps(g.zero_variance_share).length
        ? lines(steps(g.zero_variance_share), [{ label: 'zero-variance share', values: g.zero_variance_share, color: '#7f8c8d' }], { yMin: 0, yMax: 1 })
        : empty('No complete group yet.'),
    ),
    h('div.scroll', table),
  );
}

function frac(k) {
  const [a, b] = k.split('/').map(Number);
  return b ? a / b : 0;
}

function shade(x) {
  const hue = Math.round(0 + 130 * Math.max(0, Math.min(1, x)));
  return `hsl(${hue} 60% 62%)`;
}

function tasksPanel(summary, runId) {
  const t = summary.tasks;
  const tasks = Object.keys(t.tasks);
  if (!tasks.length) return panel('tasks', 'Task grid', empty('No finished trials yet.'));
  const table = h(
    'table.taskgrid',
    h('tr', h('th', 'task'), t.steps.map((s) => h('th', `${s}`))),
    tasks.map((task) =>
      h(
        'tr',
        h('th', { title: task }, task),
        t.steps.map((s) => {
          const c = t.tasks[task][s];
          return c
            ? h('td', { style: `background:${shade(c.rate)}`, title: `${task} step ${s}: ${c.solved}/${c.trials} solved` }, `${c.solved}/${c.trials}`)
            : h('td.none', '');
        }),
      ),
    ),
  );
  return panel('tasks', 'Task grid: solve rate per task over steps', h('div.scroll', table));
}

function asyncPanel(run, summary) {
  const metrics = summary.metrics;
  const stale = { mean: series(metrics, 'staleness/mean'), max: series(metrics, 'staleness/max') };
  const st = unionSteps(stale.mean, stale.max);
  const hist = summary.staleness_hist;
  const idle = m(metrics, 'idle');
  const queue = m(metrics, 'queue');
  const status = run.status;
  return panel(
    'async',
    'Async health',
    status ? h('p.note', `now: ${status.groups_pending} groups waiting for the trainer, idle ${pct(status.trainer_idle_fraction)}`) : null,
    h(
      'div.grid3',
      h('div.mini', h('h3', 'staleness per step (versions)'), st.length ? lines(st, [{ label: 'mean', values: stale.mean }, { label: 'max', values: stale.max }], { height: 160 }) : empty('not recorded')),
      h(
        'div.mini',
        h('h3', 'staleness distribution (trajectories)'),
        Object.keys(hist).length ? bars(Object.keys(hist), Object.values(hist), { label: 'trajectories', xTitle: 'versions behind', height: 160 }) : empty('no policy versions recorded'),
      ),
      h(
        'div.mini',
        h('h3', 'trainer idle · queue depth'),
        unionSteps(idle, queue).length
          ? lines(unionSteps(idle, queue), [{ label: 'idle fraction', values: idle }, { label: 'queue depth', values: queue, axis: 'y2' }], { height: 160 })
          : empty('not recorded'),
      ),
    ),
  );
}

function behaviourPanel(summary) {
  const b = summary.behaviour;
  const st = steps(b.mean_turns);
  if (!st.length) return panel('behaviour', 'Behaviour', empty('No trials yet.'));
  const mix = b.tools.map((tool) => ({ label: tool, values: Object.fromEntries(st.map((s) => [s, (b.tool_calls[s] || {})[tool] || 0])) }));
  return panel(
    'behaviour',
    'Behaviour',
    alertsOf(summary, 'turn_collapse'),
    h(
      'div.grid3',
      h('div.mini', h('h3', 'tool-call mix'), mix.length ? stackedBars(st, mix, { yTitle: 'calls', height: 170 }) : empty(b.decoded_trajectories ? 'no tool calls' : 'tokens not decoded (no tokenizer)')),
      h('div.mini', h('h3', 'malformed tool calls'), bars(st, st.map((s) => b.malformed[s] || 0), { label: 'malformed', color: '#c0392b', xTitle: STEP_AXIS, height: 170 })),
      h('div.mini', h('h3', 'mean turns'), lines(st, [{ label: 'mean turns', values: b.mean_turns }], { yMin: 0, height: 170 })),
    ),
  );
}

function integrityPanel(summary) {
  const g = summary.integrity || { tamper: {}, suspicious: {}, flagged_trials: {} };
  const st = steps(g.tamper);
  if (!st.length) return panel('integrity', 'Reward integrity', empty('No trials yet.'));
  const sum = (m) => st.reduce((n, s) => n + (m[s] || 0), 0);
  return panel(
    'integrity',
    'Reward integrity',
    h(
      'p.note',
      { 'data-integrity-totals': '' },
      `${sum(g.tamper)} tamper events and ${sum(g.suspicious)} suspicious events, in ${sum(g.flagged_trials)} of ${sum(g.trials || {})} trials. ` +
        'Tamper: a plant the sandbox reverted before the verifier ran. Suspicious: a reward-hack pattern in the agent’s change (counted, or the reward zeroed where the run says so).',
    ),
    h(
      'div.grid3',
      h('div.mini', h('h3', 'tamper events (reverted plants)'), bars(st, st.map((s) => g.tamper[s] || 0), { label: 'tamper', color: '#8e5cc4', xTitle: STEP_AXIS, height: 170 })),
      h('div.mini', h('h3', 'suspicious events (hack patterns)'), bars(st, st.map((s) => g.suspicious[s] || 0), { label: 'suspicious', color: '#c0392b', xTitle: STEP_AXIS, height: 170 })),
      h('div.mini', h('h3', 'trials with either event'), bars(st, st.map((s) => g.flagged_trials[s] || 0), { label: 'trials', color: '#e8772e', xTitle: STEP_AXIS, height: 170 })),
    ),
  );
}

function failuresPanel(summary) {
  const f = summary.failures.by_step;
  const st = steps(f);
  if (!st.length) return panel('failures', 'Failures by stage', empty('No failed trial.'));
  const order = ['setup/infra', 'agent/policy', 'agent/infra', 'verifier/policy', 'verifier/infra'];
  const colors = { 'setup/infra': '#8e5cc4', 'agent/policy': '#d4a017', 'agent/infra': '#c0392b', 'verifier/policy': '#e8772e', 'verifier/infra': '#e84393' };
  const keys = order.filter((k) => st.some((s) => f[s][k]));
  const totals = Object.fromEntries(keys.map((k) => [k, st.reduce((n, s) => n + (f[s][k] || 0), 0)]));
  const infra = keys.filter((k) => k.endsWith('infra')).reduce((n, k) => n + totals[k], 0);
  const policy = keys.filter((k) => k.endsWith('policy')).reduce((n, k) => n + totals[k], 0);
  return panel(
    'failures',
    'Failures by stage',
    h('p.note', `infrastructure ${infra} · policy ${policy} (a completed trial whose tests failed is a verifier-stage policy failure)`),
    stackedBars(st, keys.map((k) => ({ label: k, values: Object.fromEntries(st.map((s) => [s, f[s][k] || 0])), color: colors[k] })), { yTitle: 'trials' }),
  );
}

function banner(run, summary) {
  const problems = [...new Set([...(run.problems || []), ...(summary ? summary.problems : [])])];
  const box = document.getElementById('banner');
  box.replaceChildren();
  if (problems.length) {
    box.appendChild(h('div.problems', { 'data-problems': problems.length }, h('strong', 'This run directory has problems:'), h('ul', problems.map((p) => h('li', p)))));
  }
}

export async function renderRun(view, runId) {
  const [run, summary] = await Promise.all([api.run(runId), api.summary(runId)]);
  document.getElementById('run-title').textContent = run.run_id;
  document.title = `${run.run_id} · harnessrl`;
  banner(run, summary);
  const alerts = summary.alerts.length
    ? h('div.alertbar', { 'data-alerts': summary.alerts.length }, summary.alerts.map((a) => h('span.alert', { 'data-alert': a.kind }, `⚠ ${a.step !== null ? `step ${a.step}: ` : ''}${a.message}`)))
    : null;
  const rows = (await api.trajectories(runId)).trajectories;
  view.replaceChildren(
    h(
      'div.runpage',
      alerts,
      overviewPanel(run, summary),
      h('div.pair', terminationPanel(summary), groupsPanel(summary)),
      agreementPanel(summary),
      h('div.pair', tasksPanel(summary, runId), failuresPanel(summary)),
      behaviourPanel(summary),
      integrityPanel(summary),
      heldoutPanel(summary),
      asyncPanel(run, summary),
      cpuPanel(run, summary),
      trajectoriesPanel(runId, rows, links),
      await analysisPanel(runId, run),
    ),
  );
  return run;
}

// Live updates for a running run only: a finished run opens no stream and shows no
// badge, and a run that finishes while watched closes its stream (the page settles).
export function follow(view, runId, run) {
  const badge = document.getElementById('live');
  badge.hidden = true;
  if (!run || !run.live) return () => {};
  let first = null;
  let busy = false;
  let finished = false;
  let close = () => {};
  const redraw = async () => {
    busy = true;
    const y = window.scrollY;
    try {
      await renderRun(view, runId);
      window.scrollTo(0, y);
    } finally {
      busy = false;
    }
  };
  close = subscribe(
    runId,
    async (fp) => {
      if (fp.live === false) {
        finished = true;
        close();
        badge.hidden = true;
        await redraw();
        return;
      }
      if (first === null) {
        first = JSON.stringify(fp);
        return;
      }
      if (busy || JSON.stringify(fp) === first) return;
      first = JSON.stringify(fp);
      await redraw();
    },
    (up) => {
      badge.hidden = finished || !up;
    },
  );
  return () => {
    close();
    badge.hidden = true;
  };
}
