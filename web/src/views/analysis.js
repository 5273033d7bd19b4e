// Assisted analysis: candidate explanations from the endpoint the user configured,
// each for a person to confirm or dismiss. Off unless configured.
import { api, isStatic } from '../api.js';
import { h, panel } from '../dom.js';

function card(runId, c, redraw) {
  const decide = (verdict) => async () => {
    await api.verdict(runId, c.id, verdict);
    await redraw();
  };
  return h(
    `div.candidate.${c.verdict || 'open'}`,
    { 'data-candidate': c.id, 'data-verdict': c.verdict || 'open' },
    h('div.candhead', h('strong', c.title), h(`span.cat.${c.category}`, c.category), c.verdict ? h('span.verdict', c.verdict) : null),
    h('p', c.explanation),
    c.evidence.length ? h('div', h('em', 'evidence: '), h('ul', c.evidence.map((e) => h('li', e)))) : null,
    c.checks.length ? h('div', h('em', 'to check: '), h('ul', c.checks.map((e) => h('li', e)))) : null,
    !c.verdict && !isStatic
      ? h('div.buttons', h('button.confirm', { onclick: decide('confirmed') }, 'Confirm'), h('button.dismiss', { onclick: decide('dismissed') }, 'Dismiss'))
      : null,
  );
}

export async function analysisPanel(runId, run) {
  const body = h('div');
  async function redraw(error) {
    const data = await api.analysis(runId);
    const ask = h('button', {
      id: 'analyse',
      onclick: async (e) => {
        e.target.disabled = true;
        e.target.textContent = 'Asking…';
        try {
          await api.analyse(runId);
          await redraw();
        } catch (err) {
          await redraw(err.message);
        }
      },
    }, 'Ask for candidate explanations');
    body.replaceChildren(
      ...[
      data.enabled
        ? h('p.note', 'Sends this run\'s anomaly summary (termination spikes, agreement drops, turn collapse, zero-variance growth) to the configured endpoint. Nothing is acted on: confirm or dismiss each candidate.')
        : h('p.note', isStatic ? 'Static export: candidates as recorded.' : 'Assisted analysis is off: set [dashboard.analysis] endpoint (an OpenAI-compatible API you choose).'),
      data.enabled ? ask : null,
      error ? h('p.alert', error) : null,
      ...data.candidates.map((c) => card(runId, c, redraw)),
      ].filter(Boolean),
    );
  }
  await redraw();
  return panel('analysis', 'Assisted analysis', body);
}
