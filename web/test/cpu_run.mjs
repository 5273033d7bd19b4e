// Browser check of a real run's CPU breakdown (harnessrl/cpu.py): the run page's "CPU by
// component" panel has a row per component with its seconds and share, and its chart one
// bar per component for the step. Run by tests/integration/test_dashboard/test_dashboard_cpu.py.
import { pageCheck } from './page.mjs';

await pageCheck(async ({ cfg, page, check }) => {
  await page.goto(`${cfg.url}/runs/${cfg.runId}?token=${cfg.token}`);
  await page.waitForSelector('[data-panel="cpu"] [data-cpu="engine"]');
  await page.waitForFunction(() => [...document.querySelectorAll('[data-panel="cpu"] canvas')].every((c) => c.dataset.ready === '1'));
  const rows = await page.$$eval('[data-panel="cpu"] tr[data-cpu]', (rs) => rs.map((r) => [r.dataset.cpu, [...r.children].map((c) => c.textContent)]));
  check(JSON.stringify(rows.map((r) => r[0])) === JSON.stringify(cfg.components), `a row per component (${rows.map((r) => r[0])})`);
  for (const [key, cells] of rows) {
    check(cells[1] === cfg.stepText[key], `${key}: the step's seconds as recorded (${cells[1]} vs ${cfg.stepText[key]})`);
    check(/^\d+%$/.test(cells[2]) && /^[\d.,]+ s$/.test(cells[3]), `${key}: a share and the whole run's seconds (${cells.join(' | ')})`);
  }
  const shares = rows.reduce((n, r) => n + Number(r[1][2].replace('%', '')), 0);
  check(shares >= 97 && shares <= 103, `the step's shares add up to 100% give or take rounding (${shares})`);
  const series = await page.$eval('[data-panel="cpu"] canvas', (c) => c.dataset.series);
  for (const want of cfg.series) check(series.includes(want), `chart ${want} (${series})`);
  const panel = await page.$('[data-panel="cpu"]');
  await panel.scrollIntoViewIfNeeded();
  await panel.screenshot({ path: `${cfg.artifacts}/cpu_breakdown.png` });
});
