// The trajectory viewer: outcome, phase timings, trace link; the transcript as
// the engine saw it; and the token-level view (mask and logprob shading,
// segment, turn and thread boundaries).
import { api, links } from '../api.js';
import { empty, fmt, h, panel, seconds } from '../dom.js';

function timingBar(t) {
  const parts = [
    ['setup', t.setup_s, '#8e5cc4'],
    ['agent', t.agent_s, '#2f6fde'],
    ['verify', t.verify_s, '#2aa876'],
    ['teardown', t.teardown_s, '#7f8c8d'],
  ];
  const total = parts.reduce((n, p) => n + p[1], 0) || 1;
  return h(
    'div.timings',
    h('div.bar', parts.map(([name, v, color]) => h('span', { style: `width:${(100 * v) / total}%;background:${color}`, title: `${name} ${seconds(v)}` }))),
    h('div.legend', parts.map(([name, v, color]) => h('span', h('i', { style: `background:${color}` }), `${name} ${seconds(v)}`))),
  );
}

function rewardSpans(rewards) {
  return Object.keys(rewards || {}).sort().map((k) => h('span.rewardkey', { 'data-key': k, 'data-value': rewards[k] }, `${k} ${fmt(rewards[k])} `));
}

// Every key the verifier wrote (reward.json); shown unless it is only the trained {"reward": r}.
function rewardKeys(rewards) {
  const keys = Object.keys(rewards || {});
  if (!keys.length || (keys.length === 1 && keys[0] === 'reward')) return null;
  return h('span', { id: 'verifier-rewards' }, rewardSpans(rewards));
}

// A multi-step task's ([[steps]]) steps in order, each with what its verifier wrote;
// a step whose verifier gave no result (and the steps skipped after it) say so.
function taskSteps(steps) {
  if (!(steps || []).length) return null;
  return h(
    'ol.tasksteps',
    { id: 'task-steps' },
    steps.map((s) =>
      h(
        'li.taskstep',
        { 'data-task-step': s.name, 'data-verified': s.verified ? '1' : '0' },
        h('span.k', s.name),
        ' ',
        s.verified ? rewardSpans(s.rewards) : h('span.unverified', 'no verifier result'),
      ),
    ),
  );
}

function header(t) {
  const kv = (k, v) => h('div.fact', h('span.k', k), h('span.v', v));
  const keys = rewardKeys(t.rewards);
  return panel(
    'trajectory-header',
    `Trajectory ${t.trial_id}`,
    h(
      'div.facts',
      kv('run', h('a', { href: links.run(t.run_id) }, t.run_id)),
      kv('task', t.task_id),
      kv('group', `${t.group_id} (G=${t.group_size})`),
      kv('step', t.step),
      kv('harness', t.harness || '—'),
      kv('reward', h('strong', { 'data-reward': t.reward ?? '' }, t.reward === null ? 'none' : fmt(t.reward))),
      keys ? kv('verifier rewards', keys) : null,
      t.task_steps && t.task_steps.length ? kv(`task steps (${t.task_steps.length})`, taskSteps(t.task_steps)) : null,
      kv('termination', h(`span.reason.${t.infra ? 'infra' : 'policy'}`, { 'data-reason': t.termination_reason }, t.termination_reason)),
      kv('harness exit', t.harness_exit_code),
      kv('policy versions', t.policy_versions.join(', ') || '—'),
      kv('model calls', t.segments_detail.reduce((n, s) => n + s.calls, 0)),
      kv('trace', t.trace_url ? h('a', { href: t.trace_url, target: '_blank', rel: 'noopener', id: 'trace-link' }, 'open trace') : (t.metadata || {}).trace_id ? h('span.mono', { title: 'set [dashboard] trace_url to link a trace UI' }, t.metadata.trace_id) : 'not recorded'),
    ),
    timingBar(t.timings),
    t.verifier_summary ? h('details', h('summary', 'verifier output'), h('pre', t.verifier_summary)) : null,
  );
}

function message(msg) {
  return h(
    `div.msg.${msg.role}.${msg.source}`,
    { 'data-role': msg.role, 'data-source': msg.source },
    h('div.msghead', h('span.role', msg.role), h(`span.src.${msg.source}`, msg.source === 'sampled' ? 'sampled by the policy' : msg.source)),
    msg.text ? h('pre.text', msg.text) : null,
    msg.tool_calls.map((c) =>
      h('div.toolcall', { 'data-tool': c.name }, h('span.tool', `→ ${c.name}`), h('pre', JSON.stringify(c.arguments, null, 2))),
    ),
    msg.malformed_tool_calls ? h('p.alert', { 'data-malformed': msg.malformed_tool_calls }, 'malformed tool call (not parsed by the proxy)') : null,
    msg.tool_results.map((r) => h('div.toolresult', h('span.tool', '← result'), h('pre', r))),
  );
}

function segmentTitle(seg) {
  return `thread ${seg.thread} (${seg.kind}${seg.trainable ? '' : ', not trained'}) · segment ${seg.index} · ${seg.calls} model calls · ${seg.prompt_tokens} prompt + ${seg.response_tokens} response tokens (${seg.sampled_tokens} sampled) · ${seg.finish_reason || '—'}${seg.closed ? ' · closed' : ' · open'}`;
}

// What the engine sampled the segment with, and whose values they were (pin: the run's).
function samplingNote(seg) {
  const s = seg.sampling;
  if (!s) return h('div.sampling', { 'data-sampling': 'unrecorded' }, 'sampling not recorded (the run\'s temperature applies)');
  const whose = s.mode === 'pin' ? 'pinned by the run' : 'the harness\'s values honoured';
  const asked = s.from_harness.length ? ` · from the harness: ${s.from_harness.join(', ')}` : '';
  const over = s.overridden.length ? ` · overrode the harness's ${s.overridden.join(', ')}` : '';
  return h(
    'div.sampling',
    { 'data-sampling': s.mode, 'data-temperature': s.temperature },
    `sampled at temperature ${fmt(s.temperature)} · top-p ${fmt(s.top_p)} · top-k ${s.top_k || 'off'} · min-p ${s.min_p || 'off'} (${whose})${asked}${over}`,
  );
}

function transcriptView(t) {
  if (!t.decoded) return empty('No tokenizer for this run: the transcript cannot be decoded (token ids are in the token view).');
  return h(
    'div.transcript',
    t.segments_detail.map((seg) =>
      h('div.segment', { 'data-thread': seg.thread, 'data-segment': seg.index }, h('div.seghead', segmentTitle(seg)), samplingNote(seg), seg.transcript.map(message)),
    ),
  );
}

// Sampled tokens are shaded by probability: exp(logprob) 1 -> green, 0 -> red.
function tokenColor(lp) {
  const p = Math.exp(lp);
  return `hsl(${Math.round(120 * p)} 70% ${88 - 18 * (1 - p)}%)`;
}

function tokenView(t) {
  return h(
    'div.tokens',
    h(
      'div.legend',
      h('span.tok.k2', 'prompt'),
      h('span.tok.k0', 'context (mask 0)'),
      h('span.tok.k1', { style: `background:${tokenColor(-0.01)}` }, 'sampled p≈1'),
      h('span.tok.k1', { style: `background:${tokenColor(-2)}` }, 'sampled p≈0.14'),
      h('span.turnmark', '▸'),
      ' = a new model call',
    ),
    t.segments_detail.map((seg) => h('div.segment', { 'data-thread': seg.thread, 'data-segment': seg.index }, h('div.seghead', segmentTitle(seg)), samplingNote(seg), tokens(seg.tokens))),
  );
}

function tokens(tk) {
  const box = h('div.tokbox');
  const turns = new Set(tk.turn_starts);
  const frag = document.createDocumentFragment();
  for (let i = 0; i < tk.ids.length; i += 1) {
    const pos = tk.positions ? tk.positions[i] : i;
    if (tk.elided && i === tk.elided_at) frag.appendChild(h('span.elided', ` … ${tk.elided} tokens not shown … `));
    if (pos === tk.prompt_len && pos > 0) frag.appendChild(h('span.boundary', { title: 'end of prompt' }, '│'));
    if (turns.has(pos)) frag.appendChild(h('span.turnmark', { title: 'new model call' }, '▸'));
    const kind = tk.kind[i];
    const piece = tk.pieces ? tk.pieces[i] : `[${tk.ids[i]}]`;
    const span = document.createElement('span');
    span.className = `tok k${kind}`;
    span.textContent = piece;
    if (kind === 1) span.style.background = tokenColor(tk.logprobs[i]);
    span.title = kind === 1 ? `id ${tk.ids[i]} · logprob ${tk.logprobs[i]} · policy v${tk.versions[i]}` : `id ${tk.ids[i]} · ${kind === 2 ? 'prompt' : 'context'}`;
    frag.appendChild(span);
  }
  box.appendChild(frag);
  return box;
}

export async function renderTrajectory(view, runId, trialId) {
  const t = await api.trajectory(runId, trialId);
  document.getElementById('run-title').textContent = `${t.run_id} › ${t.trial_id}`;
  document.title = `${t.trial_id} · harnessrl`;
  const body = h('div.tabbody');
  const tabs = [
    ['transcript', 'Transcript', () => transcriptView(t)],
    ['tokens', 'Tokens', () => tokenView(t)],
  ];
  const bar = h('div.tabs');
  function show(id) {
    for (const b of bar.children) b.classList.toggle('on', b.dataset.tab === id);
    const tab = tabs.find((x) => x[0] === id);
    body.replaceChildren(tab[2]());
    body.dataset.tab = id;
  }
  for (const [id, label] of tabs) bar.appendChild(h('button', { 'data-tab': id, onclick: () => show(id) }, label));
  view.replaceChildren(
    h('div.trajpage', header(t), (t.problems || []).length ? h('div.problems', h('ul', t.problems.map((p) => h('li', p)))) : null, h('section.panel', { 'data-panel': 'trajectory-body' }, bar, body)),
  );
  show('transcript');
}
