// The dashboard in headless Chromium, against the real daemon that
// tests/e2e/test_dashboard.sh started (token required) with a finished job
// (DONE_JOB) and a long one (JOB) that ran out of memory in its first step.
// Checked, each against the API read here independently:
//  - the token is asked (a wrong one is asked again), kept in sessionStorage,
//    not asked after a reload;
//  - the list shows the long job running (with tokens/s, its step moving on)
//    and the finished one; the devices page shows both devices held by it;
//  - the job page's loss chart gains points as steps arrive, at the losses of
//    /v1/jobs/{id}/metrics; eval points; the memory chart's budget line is the
//    devices' memory_total_bytes and the in-use lines lie under it; the
//    out-of-memory and checkpoint events are marked;
//  - a bad spec (uploaded as a file) has its 400 message shown under the line
//    of the field it names; a good spec shows the plan, then is submitted;
//  - cancel asks first ("keep running" sends nothing), then cancels.
// Screenshots: $ART/dashboard-{job,list,submit}.png. Errors in
// the page fail the test (bar the 401 and 400 answers it provokes), a
// breach of the page's Content-Security-Policy included.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';

const env = process.env;
const require = createRequire(path.join(env.PW, 'node_modules') + '/');
const { chromium } = require('playwright-core');

const guard = setTimeout(() => { console.error('FAIL(dashboard.test): over 200 s'); process.exit(2); }, 200000);
const ok = (msg) => console.log('ok(dashboard.test): ' + msg);

async function api(p, opts = {}) {
  const r = await fetch(env.BASE + p, { ...opts, headers: { Authorization: 'Bearer ' + env.TOKEN, ...(opts.headers || {}) } });
  return { status: r.status, body: await r.json() };
}

const browser = await chromium.launch({ executablePath: env.CHROMIUM, args: ['--no-sandbox', '--disable-dev-shm-usage'] });
const errors = [];
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  page.setDefaultTimeout(60000);
  page.on('pageerror', (e) => errors.push('pageerror: ' + e.message));
  page.on('console', (m) => {
    if (m.type() === 'error' && !/status of 40[01] /.test(m.text())) errors.push('console: ' + m.text());
  });
  const hook = (f, arg) => page.evaluate(f, arg);

  // ---- the token: asked, a wrong one asked again, kept, not asked after a reload
  await page.goto(env.BASE + '/');
  const dialog = page.locator('#token-dialog');
  await dialog.waitFor({ state: 'visible' });
  await page.fill('#token-input', 'wrong' + env.TOKEN);
  await page.click('#token-ok');
  await page.waitForFunction(() => document.querySelector('#token-dialog').open &&
    /refused/.test(document.querySelector('#token-why').textContent));
  await page.fill('#token-input', env.TOKEN);
  await page.click('#token-ok');
  const longRow = page.locator(`tr[data-job="${env.JOB}"][data-state="running"]`);
  await longRow.waitFor();
  assert.equal(await hook(() => sessionStorage.getItem('accumd.token')), env.TOKEN);
  await page.reload();
  await longRow.waitFor();
  assert.equal(await dialog.isVisible(), false, 'token asked again after a reload');
  ok('token asked, a wrong one refused, kept for the session');

  // ---- the list
  await page.locator(`tr[data-job="${env.DONE_JOB}"][data-state="succeeded"]`).waitFor();
  await page.waitForFunction((id) => {
    const td = document.querySelector(`tr[data-job="${id}"] td:nth-child(7)`);
    return td && /^[\d.]+( [kM])?$/.test(td.textContent);
  }, env.JOB);
  const cells = await longRow.locator('td').allTextContents();
  assert.match(cells[4], /^\d+ \/ 1000000$/, 'step / max_steps');
  assert.equal(cells[7], '4 × 2 × 2', 'split after the OOM adjustment');
  assert.equal(cells[8], 'cpu0, cpu1');
  await page.waitForFunction(([id, before]) => {
    const td = document.querySelector(`tr[data-job="${id}"] td:nth-child(5)`);
    return td && td.textContent !== before;
  }, [env.JOB, cells[4]]);
  const later = await longRow.locator('td').nth(4).textContent();
  assert.ok(parseInt(later, 10) > parseInt(cells[4], 10), `the list's step moves on: ${cells[4]} -> ${later}`);
  ok(`list: ${env.JOB} running (${cells[4]} -> ${later}, ${cells[6]} tokens/s, split ${cells[7]}), ${env.DONE_JOB} succeeded`);

  // ---- the devices page: both devices held by the long job, memory as the API says
  await page.click('a[data-nav="devices"]');
  const units = { B: 1, KiB: 1024, MiB: 1024 ** 2, GiB: 1024 ** 3 };
  const bytes = (t) => { const [n, u] = t.split(' '); return Number(n) * units[u]; };
  const apiDevs = (await api('/v1/devices')).body.devices;
  for (const d of apiDevs) {
    const row = page.locator(`#devices tr[data-device="${d.name}"]`);
    await row.waitFor();
    const c = await row.locator('td').allTextContents();
    assert.equal(c[2], env.JOB, `${d.name} held by the long job`);
    assert.ok(Math.abs(bytes(c[8]) - d.memory_total_bytes) < 0.01 * d.memory_total_bytes, `${d.name} total ${c[8]}`);
    assert.ok(bytes(c[4]) > 0 && bytes(c[4]) <= bytes(c[8]), `${d.name} in use ${c[4]}`);
  }
  await page.click('a[data-nav="jobs"]');
  await longRow.waitFor();
  ok('devices page: both devices held by the long job');

  // ---- the job page: live charts
  await page.click(`a[href="#/job/${env.JOB}"]`);
  await page.waitForFunction(() => window.__accumd.charts.loss && window.__accumd.charts.loss.data[0].length > 0);
  const n0 = await hook(() => window.__accumd.charts.loss.data[0].length);
  await page.waitForFunction((n) => window.__accumd.charts.loss.data[0].length >= n + 5, n0);
  await page.waitForFunction(() => window.__accumd.markers.some((m) => m.kind === 'checkpoint'));
  await page.waitForFunction(() => window.__accumd.charts.loss.data[2].some((v) => v != null));
  const loss = await hook(() => window.__accumd.charts.loss.data.map((a) => Array.from(a)));
  const n1 = loss[0].length;
  assert.ok(n1 >= n0 + 5, `loss chart grew ${n0} -> ${n1}`);
  for (let i = 1; i < n1; i++) assert.ok(loss[0][i] > loss[0][i - 1], 'steps increase');
  const hist = (await api(`/v1/jobs/${env.JOB}/metrics`)).body.steps;
  const byStep = new Map(hist.map((s) => [s.step, s.loss]));
  let matched = 0;
  loss[0].forEach((s, i) => {
    if (byStep.has(s)) { assert.ok(Math.abs(loss[1][i] - byStep.get(s)) < 1e-9, `loss at step ${s}`); matched++; }
  });
  assert.ok(matched >= n1 - 1, `chart losses match /metrics (${matched} of ${n1})`);
  const evals = loss[2].filter((v) => v != null);
  assert.ok(evals.length >= 1 && evals.every((v) => v > 0 && v < 10), 'eval points');
  ok(`loss chart ${n0} -> ${n1} points, equal to /metrics; ${evals.length} eval point(s)`);

  const devs = (await api('/v1/devices')).body.devices;
  const mem = await hook(() => {
    const u = window.__accumd.charts.mem;
    return { labels: u.series.map((s) => s.label), data: u.data.map((a) => Array.from(a)) };
  });
  const bi = mem.labels.indexOf('budget');
  assert.ok(bi > 0, 'a budget series: ' + mem.labels.join(', '));
  assert.ok(mem.data[0].length > 0, 'memory points');
  const total = devs[0].memory_total_bytes;
  assert.equal(devs[1].memory_total_bytes, total);
  assert.ok(mem.data[bi].every((v) => v === total), 'the budget line is memory_total_bytes');
  for (const d of ['cpu0', 'cpu1']) {
    const use = mem.data[mem.labels.indexOf(d + ' in use')], peak = mem.data[mem.labels.indexOf(d + ' peak')];
    assert.ok(use.every((v, i) => v > 0 && v <= total && peak[i] >= v), `${d}: 0 < in use <= peak, in use <= budget`);
  }
  const markers = await hook(() => window.__accumd.markers);
  assert.ok(markers.some((m) => m.kind === 'oom_adjust' && m.step === 1), 'OOM marker at step 1: ' + JSON.stringify(markers));
  const logText = await page.locator('#job-log').textContent();
  assert.match(logText, /out of memory at step 0: m=8 a=1 -> m=4 a=2/);
  assert.match(logText, /checkpoint at step 25/);
  ok(`memory chart: budget ${total} bytes, in use under it; markers ${markers.map((m) => m.kind + '@' + m.step).join(' ')}`);
  await page.screenshot({ path: path.join(env.ART, 'dashboard-job.png'), fullPage: true });

  // ---- submit: a bad spec, its 400 next to the field; a good one: plan, submit
  await page.click('a[data-nav="submit"]');
  const bad = JSON.stringify({ name: 'bad', data: { train: 'gpl.txt' }, train_batch_size: 32,
    optimizer: { type: 'adamw', lr: 'fast' } }, null, 2);
  const want = (await api('/v1/jobs?dry_run=1', { method: 'POST', body: bad })).body.error;
  assert.equal(want.field, 'optimizer.lr');
  await page.setInputFiles('#spec-file', { name: 'bad.json', mimeType: 'application/json', buffer: Buffer.from(bad) });
  await page.waitForFunction((t) => document.querySelector('#spec').value === t, bad);
  await page.click('#check');
  const fe = page.locator('li.at-fault .field-error[data-field="optimizer.lr"]');
  await fe.waitFor();
  assert.equal(await fe.textContent(), want.message);
  const line = bad.split('\n').findIndex((l) => l.includes('"lr"')) + 1;
  assert.equal(await page.locator('li.at-fault').getAttribute('data-line'), String(line));
  assert.equal(await page.locator('#submit').isDisabled(), true, 'submit stays off after a failed check');
  await page.screenshot({ path: path.join(env.ART, 'dashboard-submit.png'), clip: { x: 0, y: 0, width: 1400, height: 660 } });
  ok(`bad spec (uploaded): "${want.message}" shown under line ${line} ("lr")`);

  const good = JSON.stringify({ name: 'from-the-page', model: { n_layer: 1, n_head: 2, n_embd: 32, seq_len: 32, vocab_size: 256 },
    data: { train: 'gpl.txt' }, train_batch_size: 8, train_micro_batch_size_per_gpu: 2, devices: 2, max_steps: 1000000 }, null, 2);
  const plan = (await api('/v1/jobs?dry_run=1', { method: 'POST', body: good })).body;
  await page.fill('#spec', good);
  await page.click('#check');
  await page.locator('#plan').waitFor();
  assert.equal(await page.locator('#candidates tbody tr').count(), plan.micro_batch_candidates.length);
  assert.match(await page.locator('#plan').textContent(), /8 = 2 × 2 × 2/);
  assert.match(await page.locator('#plan').textContent(), /waits/); // the long job holds both devices
  await page.click('#submit');
  await page.waitForFunction(() => /^#\/job\/j\d+$/.test(location.hash));
  const third = (await hook(() => location.hash)).slice(6);
  await page.locator('#job-state .badge[data-state="queued"]').waitFor();
  ok(`good spec: plan shown (${plan.micro_batch_candidates.length} candidates), submitted as ${third}, queued`);

  // ---- the list with all three, the screenshot
  await page.click('a[data-nav="jobs"]');
  await page.locator(`tr[data-job="${third}"][data-state="queued"]`).waitFor();
  await longRow.waitFor();
  await page.locator(`tr[data-job="${env.DONE_JOB}"][data-state="succeeded"]`).waitFor();
  await page.locator('#devices tr[data-device="cpu1"]').waitFor();
  const bottom = await hook(() => Math.ceil(document.querySelector('main').getBoundingClientRect().bottom));
  await page.screenshot({ path: path.join(env.ART, 'dashboard-list.png'), clip: { x: 0, y: 0, width: 1400, height: Math.min(1000, bottom) } });
  ok('list: succeeded, running, queued; devices panel');

  // ---- cancel, with a confirmation
  await page.click(`a[href="#/job/${env.JOB}"]`);
  await page.locator('#job-state .badge[data-state="running"]').waitFor();
  await page.click('#cancel');
  await page.locator('#confirm-dialog').waitFor({ state: 'visible' });
  await page.click('#confirm-no');
  await page.locator('#confirm-dialog').waitFor({ state: 'hidden' });
  assert.equal((await api(`/v1/jobs/${env.JOB}`)).body.state, 'running', '"keep running" cancelled the job');
  await page.click('#cancel');
  await page.click('#confirm-yes');
  await page.locator('#job-state .badge[data-state="cancelled"]').waitFor();
  assert.match(await page.locator('#job-msg').textContent(), /cancel requested|cancelled/);
  assert.equal(await page.locator('#cancel').isDisabled(), true);
  ok('cancel: asked first, then the job is cancelled');

  assert.deepEqual(errors, [], 'errors in the page');
} finally {
  await browser.close();
  clearTimeout(guard);
}
