// The dashboard's chat page (#/chat) in headless Chromium, against the real
// daemon tests/e2e/test_generate.sh started (the tiny model "tiny" under
// data_roots). Checked against the API read here independently:
//  - a plain prompt to the larger model "slow": the answer appears token by
//    token (the answer element changes many times while it streams) and ends
//    as the ids POST /v1/generate gives for the same prompt;
//  - a conversation with "tiny": the answer is the API's for the same
//    messages; a second turn sends the whole conversation (its answer is the
//    API's for the three messages);
//  - a bad model shows the 400's message naming the field;
//  - the job page of SAMPLE_JOB (eval_prompts) shows its `sample` events by
//    step, newest first, each prompt's text as the event stream has it.
// Screenshot: $ART/dashboard-chat.png. Errors in the page fail the test
// (bar the 400 it provokes), a breach of its Content-Security-Policy included.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';

const env = process.env;
const require = createRequire(path.join(env.PW, 'node_modules') + '/');
const { chromium } = require('playwright-core');

const guard = setTimeout(() => { console.error('FAIL(chat.test): over 150 s'); process.exit(2); }, 150000);
const ok = (msg) => console.log('ok(chat.test): ' + msg);

async function generate(messages, model = 'tiny', max = 12) {
  const body = { model, max_new_tokens: max, temperature: 0 };
  if (typeof messages === 'string') body.prompt = messages;
  else body.messages = messages;
  const r = await fetch(env.BASE + '/v1/generate', { method: 'POST', body: JSON.stringify(body) });
  assert.equal(r.status, 200);
  return r.json();
}

const browser = await chromium.launch({ executablePath: env.CHROMIUM, args: ['--no-sandbox', '--disable-dev-shm-usage'] });
const errors = [];
try {
  const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
  page.setDefaultTimeout(60000);
  page.on('pageerror', (e) => errors.push('pageerror: ' + e.message));
  page.on('console', (m) => {
    if (m.type() === 'error' && !/status of 400 /.test(m.text())) errors.push('console: ' + m.text());
  });
  await page.goto(env.BASE + '/#/chat');
  await page.locator('#chat-model').waitFor();
  await page.fill('#chat-model', 'slow');
  await page.selectOption('#chat-mode', 'prompt');
  await page.fill('#chat-max', '40');
  await page.fill('#chat-temp', '0');

  // count the answer's changes while it streams
  await page.evaluate(() => {
    window.__changes = 0;
    new MutationObserver(() => { window.__changes++; })
      .observe(document.querySelector('#chat-log'), { subtree: true, childList: true, characterData: true });
  });
  await page.fill('#chat-input', 'Hello, world');
  await page.click('#chat-send');
  await page.waitForFunction(() => window.__accumd.chat.turns.length === 2);
  const streamed = await page.evaluate(() => {
    const a = document.querySelectorAll('#chat-log .msg.assistant');
    return { text: a[a.length - 1].textContent, tokens: JSON.parse(a[a.length - 1].dataset.tokens), changes: window.__changes };
  });
  const want0 = await generate('Hello, world', 'slow', 40);
  assert.deepEqual(streamed.tokens, want0.tokens);
  assert.equal(streamed.text, want0.text);
  assert.ok(streamed.changes >= 6, `the answer changed ${streamed.changes} times: not streamed`);
  ok(`a streamed answer (${streamed.changes} changes) equals the API's (${want0.tokens.length} tokens)`);

  await page.click('#chat-clear');
  await page.fill('#chat-model', 'tiny');
  await page.selectOption('#chat-mode', 'chat');
  await page.fill('#chat-max', '4'); /* the conversation stays within tiny's 64 positions */
  await page.fill('#chat-input', 'Hi');
  await page.click('#chat-send');
  await page.waitForFunction(() => window.__accumd.chat.turns.length === 2);
  const first = await page.evaluate(() => {
    const a = document.querySelectorAll('#chat-log .msg.assistant');
    return { text: a[a.length - 1].textContent, tokens: JSON.parse(a[a.length - 1].dataset.tokens) };
  });
  const want1 = await generate([{ role: 'user', content: 'Hi' }], 'tiny', 4);
  assert.deepEqual(first.tokens, want1.tokens);
  assert.equal(first.text, want1.text);
  ok(`a conversation's answer equals the API's (${want1.tokens.length} tokens)`);

  await page.fill('#chat-input', 'More');
  await page.click('#chat-send');
  await page.waitForFunction(() => window.__accumd.chat.turns.length === 4);
  const second = await page.evaluate(() => {
    const a = document.querySelectorAll('#chat-log .msg.assistant');
    return JSON.parse(a[a.length - 1].dataset.tokens);
  });
  const want2 = await generate([{ role: 'user', content: 'Hi' }, { role: 'assistant', content: want1.text },
    { role: 'user', content: 'More' }], 'tiny', 4);
  assert.deepEqual(second, want2.tokens);
  ok('the second turn sends the conversation');
  await page.screenshot({ path: path.join(env.ART, 'dashboard-chat.png'), fullPage: true });

  await page.fill('#chat-model', 'no-such-model');
  await page.fill('#chat-input', 'x');
  await page.click('#chat-send');
  await page.waitForFunction(() => !window.__accumd.chat.busy && document.querySelector('#chat-log .msg.assistant.error-box'));
  const err = await page.locator('#chat-log .msg.assistant.error-box').last().textContent();
  assert.match(err, /^model: /);
  ok('a bad model shows the 400 naming the field: ' + err);

  // the sample answers of a job with eval_prompts, against its events
  const evr = await fetch(`${env.BASE}/v1/jobs/${env.SAMPLE_JOB}/events?format=ndjson&since=0`);
  const evs = (await evr.text()).split('\n').filter((l) => l).map((l) => JSON.parse(l)).filter((e) => e.type === 'sample');
  assert.ok(evs.length >= 2, 'the job has no sample events');
  await page.goto(`${env.BASE}/#/job/${env.SAMPLE_JOB}`);
  await page.waitForFunction((n) => document.querySelectorAll('#job-samples .sample').length === n, evs.length);
  const shown = await page.evaluate(() => [...document.querySelectorAll('#job-samples .sample-step')].map((b) => ({
    step: Number(b.dataset.step),
    texts: [...b.querySelectorAll('.sample')].map((s) => [Number(s.dataset.index), s.querySelector('.sample-text').textContent]),
  })));
  const steps = [...new Set(evs.map((e) => e.step))].sort((a, b) => b - a);
  assert.deepEqual(shown.map((b) => b.step), steps);
  for (const b of shown)
    assert.deepEqual(b.texts, evs.filter((e) => e.step === b.step).map((e) => [e.index, e.text]));
  await page.screenshot({ path: path.join(env.ART, 'dashboard-samples.png'), fullPage: true });
  ok(`the job page shows ${evs.length} sample answers at steps ${steps.join(', ')}`);
  assert.deepEqual(errors, []);
} finally {
  clearTimeout(guard);
  await browser.close();
}
