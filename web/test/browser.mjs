// Browser test of the dashboard in headless Chromium (Debian's chromium driven by
// playwright-core). Run by tests/integration/test_dashboard/test_dashboard_browser.py,
// which serves a recorded run and passes what to expect as a JSON file (argv[2]).
// Exits non-zero on the first failed check; screenshots go to cfg.artifacts.
import { appendFileSync, readFileSync, writeFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { chromium } from 'playwright-core';

const cfg = JSON.parse(await readFile(process.argv[2], 'utf8'));
const errors = [];
let checks = 0;

function check(cond, what) {
  checks += 1;
  if (!cond) throw new Error(`check failed: ${what}`);
  console.log(`ok ${checks} - ${what}`);
}

const browser = await chromium.launch({
  executablePath: cfg.chromium || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
});
const context = await browser.newContext({ viewport: { width: 1366, height: 768 } });
let page = await context.newPage();
page.on('pageerror', (e) => errors.push(`pageerror: ${e.message}`));
page.on('console', (m) => { if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) errors.push(`console: ${m.text()}`); });

async function shot(name) {
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: `${cfg.artifacts}/${name}.png`, fullPage: true });
}

async function chartsReady() {
  await page.waitForFunction(() => [...document.querySelectorAll('canvas')].every((c) => c.dataset.ready === '1'));
}

async function series(panel) {
  return page.$$eval(`[data-panel="${panel}"] canvas`, (cs) => cs.map((c) => c.dataset.series).join(';'));
}

async function text(selector) {
  return page.$eval(selector, (e) => e.textContent);
}

// Every chart's x axis (the step convention), and where a dataset has points (by axis label).
async function axes(panel) {
  return page.$$eval(`[data-panel="${panel}"] canvas`, (cs) => cs.map((c) => c.dataset.xaxis));
}

async function pointsOf(panel, chart, label) {
  return page.$$eval(
    `[data-panel="${panel}"] canvas`,
    (cs, [i, name]) => {
      const ch = cs[i]._chart;
      const d = ch.data.datasets.find((x) => x.label === name);
      return ch.data.labels.filter((_, j) => d.data[j] !== null && d.data[j] !== undefined).join(',');
    },
    [chart, label],
  );
}

async function valuesOf(panel, chart) {
  return page.$$eval(`[data-panel="${panel}"] canvas`, (cs, i) => cs[i]._chart.data.datasets[0].data.join(','), chart);
}

function setStatus(status) {
  const info = JSON.parse(readFileSync(cfg.runInfoFile, 'utf8'));
  writeFileSync(cfg.runInfoFile, JSON.stringify({ ...info, status }));
}

async function runPageChecks(where) {
  await page.waitForSelector('[data-panel="trajectories"] tbody tr');
  await chartsReady();
  const panels = await page.$$eval('section.panel', (s) => s.map((x) => x.dataset.panel));
  for (const p of ['overview', 'termination', 'groups', 'agreement', 'tasks', 'failures', 'behaviour', 'integrity', 'heldout', 'async', 'trajectories', 'analysis']) {
    check(panels.includes(p), `${where}: panel ${p} is shown`);
  }
  const overview = await text('[data-panel="overview"]');
  check(overview.includes(cfg.model) && overview.includes('group size G3'), `${where}: overview names the model and G=3`);
  check((await series('overview')).includes('train reward:3'), `${where}: overview charts the train reward of 3 steps`);
  // One step convention: the train reward and the success rate of the same rollouts share a step.
  const reward = await pointsOf('overview', 0, 'train reward');
  check(reward === '0,1,2' && (await pointsOf('overview', 0, 'success rate')) === reward, `${where}: train reward and success rate at rollout steps ${reward}`);
  check((await pointsOf('overview', 0, 'validation')) === '0,3', `${where}: validation at 0 and 3 (the policy after N updates)`);
  check((await pointsOf('termination', 0, 'completed')) === '0,1,2', `${where}: termination reasons at the same steps`);
  for (const p of ['overview', 'termination', 'agreement', 'failures', 'behaviour', 'heldout']) {
    const a = await axes(p);
    check(a.length > 0 && a.every((x) => x === cfg.stepAxis), `${where}: every ${p} chart is labelled '${cfg.stepAxis}' (${a})`);
  }
  const term = await series('termination');
  check(term.includes('completed:3') && term.includes('engine_error (infra):3'), `${where}: termination stacks per step (${term})`);
  check((await page.$$('[data-panel="termination"] [data-alert="infra_spike"]')).length === 1, `${where}: infra spike alert`);
  const groups = await text('[data-panel="groups"]');
  check(groups.includes('G = 3') && groups.includes('hello: 2/3') && groups.includes('greet: 0/3'), `${where}: successes out of G per group`);
  check((await page.$$('[data-panel="groups"] .badge')).length === 6, `${where}: six groups`);
  check((await series('agreement')).includes('pearson:3'), `${where}: agreement per step`);
  check((await page.$$('[data-panel="agreement"] [data-alert="agreement_drop"]')).length === 1, `${where}: agreement drop alert`);
  // Axis labels as people write numbers: the |Δ| axis of 4.5e-6..9.3e-6 reads '6e-6', not '6.00000000E-6'.
  const ticks = await page.$$eval('[data-panel="agreement"] canvas', (cs) =>
    cs.flatMap((c) => Object.values(c._chart.scales).filter((s) => s.axis === 'y').flatMap((s) => s.ticks.map((t) => t.label))).join('|'),
  );
  const labels = ticks.split('|');
  check(labels.some((t) => /^\d(\.\d+)?e-6$/.test(t)) && labels.every((t) => !/E|0000/.test(t) && t.length <= 8), `${where}: agreement axis ticks read as numbers (${ticks})`);
  const grid = await page.$$eval('[data-panel="tasks"] tr', (rows) => rows.map((r) => r.textContent));
  check(grid.some((r) => r.startsWith('hello') && r.includes('2/3')) && grid.some((r) => r.startsWith('greet')), `${where}: task grid`);
  check((await series('failures')).includes('agent/infra:3'), `${where}: failures by stage`);
  const beh = await series('behaviour');
  check(beh.includes('bash:3') && beh.includes('write_file:') && beh.includes('malformed:3') && beh.includes('mean turns:3'), `${where}: behaviour (${beh})`);
  check((await page.$$('[data-panel="behaviour"] [data-alert="turn_collapse"]')).length === 1, `${where}: turn collapse alert`);
  const held = await page.$$eval('[data-panel="heldout"] tbody tr', (rows) => rows.map((r) => r.dataset.step));
  check(held.join(',') === '0,3', `${where}: held-out behaviour per evaluation step (${held})`);
  const heldText = await text('[data-panel="heldout"] tbody');
  check((await series('heldout')).includes('pass@1:2') && heldText.includes('50%') && heldText.includes('completed 4'), `${where}: held-out pass@1, submit rate, termination (${heldText})`);
  check((await series('async')).includes('trajectories:'), `${where}: staleness distribution`);
  // Reward integrity: the sandbox's tamper and suspicious counts per step, as the capture store has them.
  const g = cfg.integrity;
  check((await axes('integrity')).every((x) => x === cfg.stepAxis), `${where}: integrity charts on the step axis`);
  check((await page.$eval('[data-panel="integrity"] canvas', (c) => c.dataset.labels)) === g.steps.join(','), `${where}: integrity steps ${g.steps}`);
  for (const [i, key] of [[0, 'tamper'], [1, 'suspicious'], [2, 'flagged']]) {
    const got = await valuesOf('integrity', i);
    check(got === g[key].join(','), `${where}: integrity ${key} per step ${got} (expected ${g[key]})`);
  }
  const totals = await text('[data-panel="integrity"] [data-integrity-totals]');
  const sum = (xs) => xs.reduce((a, b) => a + b, 0);
  const ofTrials = `in ${sum(g.flagged)} of ${g.trials} trials`;
  check(totals.includes(`${sum(g.tamper)} tamper events and ${sum(g.suspicious)} suspicious events, ${ofTrials}`), `${where}: integrity totals (${totals})`);
  const counts = await page.$$eval('[data-panel="integrity"] canvas', (cs) => cs.flatMap((c) => c._chart.scales.y.ticks.map((t) => t.value)));
  check(counts.every((v) => Number.isInteger(v)), `${where}: integrity counts tick in whole numbers (${counts})`);
  check((await page.$$('[data-panel="trajectories"] tbody tr')).length === 18, `${where}: 18 trajectories listed`);
  await page.selectOption('[data-filter="termination_reason"]', 'engine_error');
  check((await page.$$('[data-panel="trajectories"] tbody tr')).length === 3, `${where}: filter by termination reason`);
  await page.selectOption('[data-filter="termination_reason"]', '');
  const width = await page.evaluate(() => document.documentElement.scrollWidth);
  check(width <= 1366, `${where}: fits a 1366 px laptop screen (scrollWidth ${width})`);
}

async function trajectoryChecks(where) {
  await page.waitForSelector('.msg');
  const head = await text('[data-panel="trajectory-header"]');
  check(head.includes(cfg.trial) && head.includes('completed') && head.includes('agent'), `${where}: trajectory header`);
  if (cfg.traceLink[where]) {
    const traceHref = await page.$eval('#trace-link', (a) => a.getAttribute('href'));
    check(/\/trace\/[0-9a-f]{32}$/.test(traceHref), `${where}: link to the trial's trace (${traceHref})`);
  } else {
    check((await page.$('#trace-link')) === null, `${where}: no trace link without a configured trace UI`);
  }
  const cmds = await page.$$eval('.toolcall[data-tool="bash"] pre', (ps) => ps.map((p) => JSON.parse(p.textContent).command));
  check(JSON.stringify(cmds) === JSON.stringify(cfg.commands), `${where}: tool calls ${JSON.stringify(cmds)}`);
  check((await page.$$('.toolresult')).length === cfg.commands.length, `${where}: tool results`);
  check((await page.$$('.msg.assistant.sampled')).length === cfg.commands.length + 2, `${where}: sampled replies (main + title)`);
  const threads = await page.$$eval('.transcript .segment', (ss) => ss.map((x) => x.dataset.thread));
  check(threads.length === cfg.segments && new Set(threads).size === cfg.segments, `${where}: one block per thread (${threads})`);
  const sampling = (await page.$$eval('.transcript .segment .sampling', (ss) => ss.map((x) => `${x.dataset.sampling}:${x.dataset.temperature}`))).sort();
  check(JSON.stringify(sampling) === JSON.stringify(cfg.sampling), `${where}: each segment shows its sampling (${sampling})`);
  await shot(`${where}-transcript`);
  await page.click('button[data-tab="tokens"]');
  await page.waitForSelector('.tok');
  const toks = await page.$$eval('.tokbox .tok', (t) => t.length);
  check(toks === cfg.tokens, `${where}: one span per token (${toks} of ${cfg.tokens})`);
  check((await page.$$('.tokbox .turnmark')).length === cfg.commands.length, `${where}: turn boundaries`);
  check((await page.$$('.tokbox .boundary')).length === cfg.segments, `${where}: a prompt boundary per segment`);
  const shaded = await page.$$eval('.tokbox .tok.k1', (t) => new Set(t.map((x) => x.style.background)).size);
  check(shaded > 3, `${where}: sampled tokens shaded by logprob (${shaded} shades)`);
  await shot(`${where}-tokens`);
}

try {
  // --- authentication
  const denied = await page.goto(`${cfg.url}/?token=wrong-token`);
  check(denied.status() === 401 && (await page.$('form input[name=token]')) !== null, 'a wrong token gets 401 and the login page');
  await shot('login');
  await page.fill('input[name=token]', cfg.token);
  await Promise.all([page.waitForNavigation(), page.click('form button')]);
  await page.waitForSelector('[data-panel="runs"] tbody tr');
  const runs = await page.$$eval('[data-run]', (rows) => rows.map((r) => r.dataset.run));
  check(JSON.stringify(runs) === JSON.stringify(cfg.runsOrder), `runs list: training runs, then evaluations, then trials (${runs})`);
  const sections = await page.$$eval('table[data-section]', (ts) => ts.map((t) => t.dataset.section));
  check(sections.join(',') === 'run,eval,trial', `runs list sections in order (${sections})`);
  const trialRow = await text(`[data-run="${cfg.trialRun}"]`);
  check(trialRow.includes(cfg.model) && trialRow.includes('completed') && trialRow.includes('test/hello'), `a single trial's row is filled in (${trialRow})`);
  check((await page.$eval(`[data-run="${cfg.trialRun}"] [data-reward]`, (e) => e.dataset.reward)) === '1', 'a single trial shows its reward');
  const evalRow = await text(`[data-run="${cfg.evalRun}"]`);
  check(evalRow.includes(cfg.evalPass), `an evaluation shows its pass@1 (${evalRow})`);
  await shot('runs');

  // --- a single trial: its page is its trajectory, decoded
  await page.click(`[data-run="${cfg.trialRun}"] a`);
  await page.waitForSelector('.msg');
  const trialHead = await text('[data-panel="trajectory-header"]');
  check(trialHead.includes(cfg.trialRun) && trialHead.includes('completed'), 'trial page header');
  const said = await page.$$eval('.msg.assistant.sampled pre.text', (ps) => ps.map((p) => p.textContent));
  check(said.includes('I will create the file.') && said.includes('Done: hello.txt holds hello.'), `trial transcript decoded (${said})`);
  const trialCmds = await page.$$eval('.toolcall[data-tool="bash"] pre', (ps) => ps.map((p) => JSON.parse(p.textContent).command));
  check(JSON.stringify(trialCmds) === JSON.stringify(['echo hello > hello.txt']), `trial tool call (${trialCmds})`);
  await shot('trial');

  // --- the run page of a finished run: every panel, no live badge, no event stream
  const streams = [];
  page.on('request', (r) => { if (r.url().includes('/events')) streams.push(r.url()); });
  await page.goto(`${cfg.url}/`);
  await page.click(`[data-run="${cfg.runId}"] a`);
  await runPageChecks('run');
  check(await page.$eval('#live', (e) => e.hidden), 'a finished run shows no live badge');
  check(streams.length === 0, `a finished run opens no event stream (${streams})`);
  const integrityPanel = await page.$('[data-panel="integrity"]');
  await integrityPanel.scrollIntoViewIfNeeded();
  await integrityPanel.screenshot({ path: `${cfg.artifacts}/integrity-panel.png` });
  await page.click('#analyse');
  await page.waitForSelector('[data-candidate]');
  check((await page.$$('[data-candidate]')).length === 2, 'assisted analysis shows the candidates');
  await page.click('[data-candidate] button.confirm');
  await page.waitForSelector('[data-candidate][data-verdict="confirmed"]');
  check(true, 'a person confirms a candidate');
  await shot('run');

  // --- a running run is followed live (badge and SSE) until it finishes; then the page settles
  setStatus('running');
  await page.reload();
  await page.waitForSelector('#live:not([hidden])');
  check(streams.length === 1, 'a running run opens one event stream and shows the live badge');
  appendFileSync(cfg.metricsFile, `${JSON.stringify({ step: 4, wall_time: Date.now() / 1000, values: { 'reward/mean': 0.75 } })}\n`);
  await page.waitForFunction(() => document.querySelector('[data-panel="overview"]').textContent.includes('4 / 3'), null, { timeout: 20000 });
  check(true, 'the page follows the run live (SSE)');
  setStatus('done');
  await page.waitForSelector('#live[hidden]', { state: 'attached', timeout: 20000 });
  await page.waitForFunction(() => document.querySelector('[data-panel="overview"] table.kv').textContent.includes('statusdone'), null, { timeout: 20000 });
  check(streams.length === 1, 'once the run is done the badge goes and the stream is not reopened');

  // --- a trajectory
  await page.click(`[data-trial="${cfg.trial}"] a`);
  await trajectoryChecks('trajectory');
  const notFound = await page.goto(`${cfg.url}/runs/${cfg.runId}/trajectories/no-such-trial`);
  check(notFound.status() === 404 && (await page.content()).includes('no-such-trial'), 'unknown trajectory: 404 page');
  const noRun = await page.goto(`${cfg.url}/runs/no-such-run`);
  check(noRun.status() === 404, 'unknown run: 404 page');

  // --- a run directory with problems says what is missing, and still shows what it has
  await page.goto(`${cfg.url}/runs/${cfg.compareRun}`);
  await page.waitForSelector('[data-panel="overview"]');
  await chartsReady();
  const problems = await text('#banner .problems');
  check(problems.includes('names no capture store'), `broken run: the banner names what is missing (${problems})`);
  check((await series('overview')).includes('train reward:3'), 'broken run: its metrics still render');
  const gaps = await page.$eval('[data-panel="agreement"] [data-agreement-gaps]', (e) => e.dataset.agreementGaps);
  const why = await text('[data-panel="agreement"] [data-gap-step="1"]');
  check(gaps === '1' && why.includes('sampled by the weights being trained'), `a step without agreement says why (${why})`);
  check((await pointsOf('agreement', 0, 'pearson')) === '0,2', 'the stale step stays on the axis, without a point');
  await shot('broken-run');

  // --- compare
  await page.goto(`${cfg.url}/compare?runs=${cfg.runId},${cfg.compareRun}`);
  await page.waitForSelector('[data-panel="compare"] canvas');
  await chartsReady();
  const cmp = await series('compare');
  check(cmp.includes(`${cfg.runId}:4`) && cmp.includes(`${cfg.compareRun}:3`), `compare overlays both runs (${cmp})`);
  await shot('compare');

  // --- the static export, from disk, with no backend
  const offline = await browser.newContext({ viewport: { width: 1366, height: 768 } });
  page = await offline.newPage();
  const requests = [];
  page.on('request', (r) => requests.push(r.url()));
  page.on('pageerror', (e) => errors.push(`export pageerror: ${e.message}`));
  await page.goto(`file://${cfg.exportDir}/index.html`);
  await runPageChecks('export');
  await shot('export-run');
  await page.click(`[data-trial="${cfg.trial}"] a`);
  await trajectoryChecks('export-trajectory');
  const remote = requests.filter((u) => !u.startsWith('file://'));
  check(remote.length === 0, `the export loads nothing but its own files (${remote.join(', ')})`);
  check(errors.length === 0, `no page errors (${errors.join(' | ')})`);
  console.log(`${checks} passed, 0 failed`);
  await browser.close();
} catch (e) {
  console.error(e.message);
  for (const line of errors) console.error(line);
  await browser.close();
  process.exit(1);
}
