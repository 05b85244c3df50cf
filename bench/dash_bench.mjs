// dash_bench.mjs: the browser half of bench/dash_load.sh (a benchmark, not a test).
//   MODE=list  : open the job list, submit NEW jobs one by one with fetch and
//                time from the POST until the row is in the page (prints the ms)
//   MODE=pages : open N job pages of job JOB and keep them open until the job
//                is final (prints the number of pages that received steps)
// Env: BASE, PW (playwright-core install), CHROMIUM, SPEC (for list), N, JOB,
// READY (pages: a file written once every page holds its stream).
import { createRequire } from 'node:module';
import path from 'node:path';

const env = process.env;
const require = createRequire(path.join(env.PW, 'node_modules') + '/');
const { chromium } = require('playwright-core');
const browser = await chromium.launch({ executablePath: env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-dev-shm-usage'] });
try {
  if (env.MODE === 'list') {
    const page = await browser.newPage();
    await page.goto(env.BASE + '/');
    await page.waitForFunction(() => window.__accumd.listed >= 0 && document.querySelector('#jobs-body'));
    const times = [];
    for (let i = 0; i < Number(env.N || 10); i++) {
      await page.waitForTimeout(300 + Math.random() * 1700); /* any phase of the 2 s poll */
      const t0 = Date.now();
      const r = await fetch(env.BASE + '/v1/jobs', { method: 'POST', body: env.SPEC });
      const id = (await r.json()).id;
      await page.waitForSelector(`tr[data-job="${id}"]`, { timeout: 10000 });
      times.push(Date.now() - t0);
    }
    console.log(times.join(' '));
  } else {
    const n = Number(env.N || 20);
    const ctx = await browser.newContext();
    const pages = [];
    for (let i = 0; i < n; i++) {
      const p = await ctx.newPage();
      await p.goto(`${env.BASE}/#/job/${env.JOB}`);
      pages.push(p);
    }
    /* every page holds its event stream: the benchmark may start the job */
    for (const p of pages) await p.waitForFunction(() => window.__accumd.streams > 0, null, { timeout: 60000 });
    if (env.READY) (await import('node:fs')).writeFileSync(env.READY, 'ready\n');
    for (;;) {
      const r = await (await fetch(`${env.BASE}/v1/jobs/${env.JOB}`)).json();
      if (['succeeded', 'failed', 'cancelled'].includes(r.state)) break;
      await new Promise((res) => setTimeout(res, 500));
    }
    let live = 0;
    for (const p of pages)
      if (await p.evaluate(() => window.__accumd.charts.loss && window.__accumd.charts.loss.data[0].length > 0)) live++;
    console.log(live);
  }
} finally {
  await browser.close();
}
