// Browser check of a verl run's page (a metrics.jsonl written by verl's file logger):
// the overview shows the rows masked out of the loss and the dropped segments.
// Run by tests/integration/test_dashboard/test_dashboard_verl.py with a JSON file (argv[2]).
import { pageCheck } from './page.mjs';

await pageCheck(async ({ cfg, page, check }) => {
  await page.goto(`${cfg.url}/runs/${cfg.runId}?token=${cfg.token}`);
  await page.waitForSelector('[data-panel="overview"] [data-metric="masked_rows"]');
  await page.waitForFunction(() => [...document.querySelectorAll('canvas')].every((c) => c.dataset.ready === '1'));
  const masked = await page.$eval('[data-panel="overview"] [data-metric="masked_rows"]', (e) => e.textContent);
  check(masked === cfg.maskedRowsText, `overview: masked rows of the last step (${masked})`);
  const dropped = await page.$eval('[data-panel="overview"] [data-metric="dropped_segments"]', (e) => e.textContent);
  check(dropped === cfg.droppedText, `overview: dropped segments of the last step (${dropped})`);
  const series = await page.$$eval('[data-panel="overview"] canvas', (cs) => cs.map((c) => c.dataset.series).join(';'));
  for (const want of cfg.series) check(series.includes(want), `overview charts ${want} (${series})`);
  await page.screenshot({ path: `${cfg.artifacts}/verl-run.png`, fullPage: true });
});
