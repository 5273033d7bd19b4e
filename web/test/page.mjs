// What a small browser check needs: its JSON config (argv[2]), headless Chromium with
// one page (page errors kept), numbered checks that stop at the first failure, and
// an exit status. Used by the single-page checks (verl_run.mjs, steps.mjs).
import { readFile } from 'node:fs/promises';
import { chromium } from 'playwright-core';

export async function pageCheck(body) {
  const cfg = JSON.parse(await readFile(process.argv[2], 'utf8'));
  const errors = [];
  let checks = 0;
  const check = (cond, what) => {
    checks += 1;
    if (!cond) throw new Error(`check failed: ${what}`);
    console.log(`ok ${checks} - ${what}`);
  };
  const browser = await chromium.launch({
    executablePath: cfg.chromium,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
  });
  try {
    const page = await (await browser.newContext({ viewport: { width: 1366, height: 768 } })).newPage();
    page.on('pageerror', (e) => errors.push(`pageerror: ${e.message}`));
    await body({ cfg, page, check });
    check(errors.length === 0, `no page errors (${errors.join(' | ')})`);
    console.log(`${checks} passed, 0 failed`);
  } catch (e) {
    console.error(e.message);
    for (const line of errors) console.error(line);
    process.exitCode = 1;
  } finally {
    await browser.close();
  }
}
