// Browser check of a multi-step task's trajectory page: the header lists the task's
// steps in order, each with every reward key its verifier wrote (cfg.steps: what the
// capture store holds). Run by tests/integration/test_sandbox_steps_capture.py.
import { pageCheck } from './page.mjs';

await pageCheck(async ({ cfg, page, check }) => {
  await page.goto(`${cfg.url}/runs/${cfg.runId}/trajectories/${cfg.trialId}?token=${cfg.token}`);
  await page.waitForSelector('[data-panel="trajectory-header"]');
  const shown = await page.$$eval('#task-steps .taskstep', (items) =>
    items.map((li) => ({
      name: li.dataset.taskStep,
      verified: li.dataset.verified === '1',
      rewards: Object.fromEntries([...li.querySelectorAll('.rewardkey')].map((k) => [k.dataset.key, Number(k.dataset.value)])),
    })),
  );
  check(JSON.stringify(shown) === JSON.stringify(cfg.steps), `the task's steps and their rewards (${JSON.stringify(shown)})`);
  const combined = await page.$$eval('#verifier-rewards .rewardkey', (ks) => Object.fromEntries(ks.map((k) => [k.dataset.key, Number(k.dataset.value)])));
  check(JSON.stringify(combined) === JSON.stringify(cfg.rewards), `the trial's combined rewards (${JSON.stringify(combined)})`);
  await page.screenshot({ path: `${cfg.artifacts}/trajectory-steps.png`, fullPage: true });
});
