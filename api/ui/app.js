/* accumd dashboard: a single page on the daemon's HTTP API v1 (docs/api.md).
 *
 *   #/            the job list (polled every 2 s) and the devices panel
 *   #/job/ID      one job: facts, live charts from its event stream, log, cancel
 *   #/devices     the devices panel alone
 *   #/submit      paste or upload a spec, check it with the dry run, submit
 *   #/chat        talk to a model or a job's (POST /v1/generate, tokens streamed)
 *
 * Every request goes through api(): it adds the bearer token kept in
 * sessionStorage and, on a 401, asks for the token once (a dialog) and
 * retries. The event stream is read with fetch() and a stream reader (not
 * EventSource, which cannot send the Authorization header), parsed as SSE,
 * and resumed after its last id when the connection drops.
 * window.__accumd exposes the charts and markers to tests.
 */
'use strict';
(function () {
  const POLL_MS = 2000;
  const LOG_MAX = 2000;
  const TOKEN_KEY = 'accumd.token';
  const COLORS = ['#2f6fdb', '#d9622b', '#1f8a4c', '#8e44ad', '#c0392b', '#16a085', '#7f8c8d', '#b7950b'];

  const hook = { charts: {}, markers: [], view: null, listed: 0, streams: 0 };
  window.__accumd = hook;

  let token = sessionStorage.getItem(TOKEN_KEY);
  let tokenAsk = null;      /* one dialog for all requests that got a 401 */
  let cleanups = [];        /* what the current view must stop when left */

  /* ---- small DOM helpers (text only: no HTML from data) ------------------- */
  const $ = (sel, root) => (root || document).querySelector(sel);
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'style') e.style.cssText = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : v);
    }
    for (const k of kids.flat()) {
      if (k == null || k === false) continue;
      e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return e;
  }
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  function setStatus(text, bad) {
    const s = $('#status');
    s.textContent = text;
    s.classList.toggle('bad', !!bad);
  }

  /* ---- formatting ---------------------------------------------------------- */
  function fmtBytes(n) {
    if (n == null) return '—';
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n.toFixed(0) : n.toFixed(n >= 100 ? 0 : n >= 10 ? 1 : 2)) + ' ' + u[i];
  }
  function fmtNum(x, digits) {
    if (x == null || !isFinite(x)) return '—';
    return Number(x).toFixed(digits == null ? 4 : digits);
  }
  function fmtRate(x) {
    if (x == null || !isFinite(x)) return '—';
    return x >= 1e6 ? (x / 1e6).toFixed(2) + ' M' : x >= 1e3 ? (x / 1e3).toFixed(1) + ' k' : x.toFixed(0);
  }
  function fmtAge(iso) {
    if (!iso) return '—';
    let s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    if (s < 60) return Math.floor(s) + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm ' + Math.floor(s % 60) + 's';
    if (s < 86400) return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
    return Math.floor(s / 86400) + 'd ' + Math.floor((s % 86400) / 3600) + 'h';
  }
  const fmtSplit = (b) => (b ? `${b.micro_batch} × ${b.accum_steps} × ${b.world}` : '—');
  const isFinal = (st) => st === 'succeeded' || st === 'failed' || st === 'cancelled';
  const badge = (st) => el('span', { class: 'badge ' + st, 'data-state': st }, st);
  function progress(step, max) {
    const pct = max > 0 ? Math.min(100, (100 * step) / max) : 0;
    return el('span', {}, el('span', { class: 'progress' }, el('span', { style: `width:${pct.toFixed(1)}%` })),
      `${step} / ${max}`);
  }

  /* ---- the API, with the bearer token -------------------------------------- */
  function askToken(again) {
    if (tokenAsk) return tokenAsk;
    const dlg = $('#token-dialog');
    $('#token-why').textContent = again
      ? 'That token was refused (401). Enter the contents of the daemon\'s token_file.'
      : 'The daemon asks for its bearer token (the contents of its token_file). It is kept in this tab\'s session storage only.';
    $('#token-input').value = '';
    tokenAsk = new Promise((resolve) => {
      const form = $('#token-form');
      const done = (e) => {
        e.preventDefault();
        const v = $('#token-input').value.trim();
        if (!v) return;
        form.removeEventListener('submit', done);
        token = v;
        sessionStorage.setItem(TOKEN_KEY, v);
        dlg.close();
        tokenAsk = null;
        resolve();
      };
      form.addEventListener('submit', done);
      dlg.addEventListener('cancel', (e) => e.preventDefault(), { once: true });
    });
    dlg.showModal();
    return tokenAsk;
  }

  async function api(path, opts) {
    opts = opts || {};
    let refused = false;
    for (;;) {
      const headers = Object.assign({}, opts.headers || {});
      const sent = token;
      if (sent) headers.Authorization = 'Bearer ' + sent;
      const r = await fetch(path, Object.assign({}, opts, { headers, cache: 'no-store' }));
      if (r.status !== 401) return r;
      if (token === sent) { /* nobody gave a newer token meanwhile */
        await askToken(refused || !!sent);
        refused = true;
      }
    }
  }

  async function apiJSON(path, opts) {
    const r = await api(path, opts);
    let body = null;
    try { body = await r.json(); } catch (e) { body = null; }
    return { status: r.status, ok: r.ok, body };
  }

  /* Read a job's event stream (SSE over fetch) and call onEvent(type, obj)
   * for each event; resumes after the last id on a dropped connection and
   * returns after the `done` event, when a stream ends and isOver() says the
   * job is final, or when `signal` aborts. */
  async function streamEvents(id, onEvent, signal, onState, isOver) {
    let lastId = null;
    while (!signal.aborted) {
      const q = lastId != null ? `?since=${lastId}` : '';
      let r;
      try {
        r = await api(`/v1/jobs/${encodeURIComponent(id)}/events${q}`, { signal, headers: { Accept: 'text/event-stream' } });
      } catch (e) {
        if (signal.aborted) return;
        onState('reconnecting');
        await sleep(1500);
        continue;
      }
      if (!r.ok) { onState('stream: HTTP ' + r.status); return; }
      onState('live');
      hook.streams++;
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '', data = [], type = 'message', evId = null, sawDone = false;
      try {
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value;
          let nl;
          while ((nl = buf.indexOf('\n')) >= 0) {
            let line = buf.slice(0, nl);
            buf = buf.slice(nl + 1);
            if (line.endsWith('\r')) line = line.slice(0, -1);
            if (line === '') { /* dispatch */
              if (evId != null) lastId = evId;
              if (data.length) {
                let obj = null;
                try { obj = JSON.parse(data.join('\n')); } catch (e) { obj = null; }
                if (obj) onEvent(type, obj);
                if (type === 'done') sawDone = true;
              }
              data = []; type = 'message'; evId = null;
              continue;
            }
            if (line[0] === ':') continue; /* keep-alive comment */
            const c = line.indexOf(':');
            const field = c < 0 ? line : line.slice(0, c);
            let val = c < 0 ? '' : line.slice(c + 1);
            if (val[0] === ' ') val = val.slice(1);
            if (field === 'data') data.push(val);
            else if (field === 'event') type = val;
            else if (field === 'id') evId = val;
          }
        }
      } catch (e) {
        if (signal.aborted) return;
      } finally {
        hook.streams--;
      }
      /* no `done`: the connection dropped, or the job was final before this
       * daemon started (its ring holds nothing to end with) */
      if (sawDone || (await isOver().catch(() => false))) { onState('finished'); return; }
      onState('reconnecting');
      await sleep(1000);
    }
  }

  /* Read a fetch() answer as Server-Sent Events: onEvent(type, obj) for
   * each; returns when the answer ends (POST /v1/generate's stream). */
  async function readSSE(r, onEvent) {
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '', data = [], type = 'message';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += value;
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        let line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line.endsWith('\r')) line = line.slice(0, -1);
        if (line === '') {
          if (data.length) {
            let obj = null;
            try { obj = JSON.parse(data.join('\n')); } catch (e) { obj = null; }
            if (obj) onEvent(type, obj);
          }
          data = []; type = 'message';
          continue;
        }
        if (line[0] === ':') continue;
        const c = line.indexOf(':');
        const field = c < 0 ? line : line.slice(0, c);
        let val = c < 0 ? '' : line.slice(c + 1);
        if (val[0] === ' ') val = val.slice(1);
        if (field === 'data') data.push(val);
        else if (field === 'event') type = val;
      }
    }
  }

  /* The newest step event of a job (for the list's tokens/s): a short read of
   * the ring's tail as NDJSON, stopped at the job's last event. */
  const tailCache = new Map();
  async function latestStep(j) {
    const c = tailCache.get(j.id);
    if (c && c.last === j.last_event) return c.step;
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), 1500);
    let step = c ? c.step : null;
    try {
      const since = Math.max(0, j.last_event - 8);
      const r = await api(`/v1/jobs/${j.id}/events?format=ndjson&since=${since}`, { signal: ctl.signal });
      if (r.ok) {
        const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = '';
        outer: for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value;
          let nl;
          while ((nl = buf.indexOf('\n')) >= 0) {
            const line = buf.slice(0, nl);
            buf = buf.slice(nl + 1);
            let ev;
            try { ev = JSON.parse(line); } catch (e) { continue; }
            if (ev.type === 'step') step = ev;
            if (ev.seq >= j.last_event) break outer;
          }
        }
      }
    } catch (e) { /* timed out or aborted: keep what we have */ }
    clearTimeout(timer);
    ctl.abort();
    tailCache.set(j.id, { last: j.last_event, step });
    return step;
  }

  /* ---- charts (uPlot) -------------------------------------------------------- */
  function markerHook(markers) {
    return (u) => {
      const ctx = u.ctx, { left, top, width, height } = u.bbox, px = uPlot.pxRatio || 1;
      ctx.save();
      ctx.font = `${10 * px}px system-ui, sans-serif`;
      for (const m of markers) {
        const x = Math.round(u.valToPos(m.step, 'x', true));
        if (!(x >= left && x <= left + width)) continue;
        ctx.strokeStyle = ctx.fillStyle = m.kind === 'oom_adjust' ? '#c8362f' : m.kind === 'checkpoint' ? '#1f8a4c' : '#b7791f';
        ctx.lineWidth = px;
        ctx.setLineDash([4 * px, 3 * px]);
        ctx.beginPath();
        ctx.moveTo(x, top);
        ctx.lineTo(x, top + height);
        ctx.stroke();
        ctx.fillText(m.kind === 'oom_adjust' ? 'OOM' : m.kind === 'checkpoint' ? 'ckpt' : 'split', x + 3 * px, top + 11 * px);
      }
      ctx.restore();
    };
  }

  function makeChart(name, parent, title, series, opts) {
    const box = el('div', { class: 'chart', id: 'chart-' + name }, el('h3', {}, title));
    parent.append(box);
    const width = Math.max(300, box.clientWidth - 16);
    const data = [[]].concat(series.map(() => []));
    const u = new uPlot({
      width, height: 210,
      scales: Object.assign({ x: { time: false } }, opts.scales || {}),
      series: [{ label: 'step' }].concat(series),
      axes: [{ label: 'step' }, Object.assign({ size: 64 }, opts.yAxis || {})],
      legend: { live: true },
      cursor: { drag: { x: true, y: false } },
      hooks: { draw: [markerHook(opts.markers)] },
    }, data, box);
    hook.charts[name] = u;
    return u;
  }

  /* ---- views ------------------------------------------------------------------ */
  function leaveView() {
    for (const f of cleanups) { try { f(); } catch (e) { /* ignore */ } }
    cleanups = [];
    setStatus('');
    for (const k of Object.keys(hook.charts)) delete hook.charts[k];
    hook.markers = [];
  }

  function every(ms, fn) {
    let stopped = false, t = null;
    const run = async () => {
      if (stopped) return;
      try { await fn(); } catch (e) { setStatus('error: ' + e.message, true); }
      if (!stopped) t = setTimeout(run, ms);
    };
    run();
    cleanups.push(() => { stopped = true; clearTimeout(t); });
  }

  /* #/ : the job list and the devices panel */
  function viewJobs(root) {
    const tbody = el('tbody', { id: 'jobs-body' });
    root.append(
      el('div', { class: 'row' }, el('h1', {}, 'Jobs'), el('span', { class: 'muted', id: 'jobs-count' }),
        el('span', { style: 'margin-left:auto' }, el('a', { href: '#/submit' }, el('button', { class: 'primary' }, 'Submit a job')))),
      el('table', { class: 'grid', id: 'jobs' },
        el('thead', {}, el('tr', {}, ['ID', 'Name', 'Owner', 'State', 'Step', 'Loss', 'Tokens/s', 'Split m×a×w', 'Devices', 'Age']
          .map((h) => el('th', { class: ['Loss', 'Tokens/s'].includes(h) ? 'num' : null }, h)))),
        tbody),
      el('h2', {}, 'Devices'), el('div', { id: 'devices-panel' }));
    every(POLL_MS, async () => {
      const [jr, dr] = await Promise.all([apiJSON('/v1/jobs'), apiJSON('/v1/devices')]);
      if (!jr.ok) { setStatus('jobs: HTTP ' + jr.status, true); return; }
      const jobs = jr.body.jobs.slice().reverse(); /* newest first */
      /* tokens/s: the running jobs' newest step each poll, the others' once */
      const steps = [];
      for (let i = 0; i < jobs.length; i += 4)
        steps.push(...await Promise.all(jobs.slice(i, i + 4).map((j) => (j.state === 'queued' ? null : latestStep(j)))));
      tbody.replaceChildren(...(jobs.length ? jobs.map((j, i) => jobRow(j, steps[i]))
        : [el('tr', {}, el('td', { colspan: 10, class: 'empty' }, 'No jobs yet. Submit one.'))]));
      $('#jobs-count').textContent = `${jobs.length} job${jobs.length === 1 ? '' : 's'}`;
      if (dr.ok) renderDevices($('#devices-panel'), dr.body);
      hook.listed = jobs.length;
      hook.jobs = jobs.map((j) => ({ id: j.id, state: j.state, step: j.step }));
      setStatus('updated ' + new Date().toLocaleTimeString());
    });
  }

  function jobRow(j, st) {
    return el('tr', { 'data-job': j.id, 'data-state': j.state },
      el('td', {}, el('a', { href: '#/job/' + j.id, class: 'mono' }, j.id)),
      el('td', {}, j.name),
      el('td', {}, j.owner != null ? String(j.owner) : '—'),
      el('td', {}, badge(j.state)),
      el('td', {}, progress(j.step, j.max_steps)),
      el('td', { class: 'num' }, fmtNum(j.loss)),
      el('td', { class: 'num' }, st ? fmtRate(st.tokens_per_s) : '—'),
      el('td', {}, fmtSplit(j.batch)),
      el('td', { class: 'mono' }, j.devices && j.devices.length ? j.devices.join(', ') : '—'),
      el('td', {}, fmtAge(j.submitted_at)));
  }

  function renderDevices(box, body) {
    const rows = body.devices.map((d) => {
      const tot = d.memory_total_bytes || 1;
      return el('tr', { 'data-device': d.name },
        el('td', { class: 'mono' }, d.name), el('td', {}, d.kind + (d.compute_capability ? ' ' + d.compute_capability : '')),
        el('td', {}, d.job ? el('a', { href: '#/job/' + d.job, class: 'mono' }, d.job) : el('span', { class: 'muted' }, 'idle')),
        el('td', {}, el('span', { class: 'meter', title: 'in use / total; red: peak' },
          el('span', { class: 'use', style: `width:${(100 * d.memory_in_use_bytes / tot).toFixed(1)}%` }),
          el('span', { class: 'peak', style: `left:${Math.min(99.5, 100 * d.memory_peak_bytes / tot).toFixed(1)}%` }))),
        el('td', { class: 'num' }, fmtBytes(d.memory_in_use_bytes)), el('td', { class: 'num' }, fmtBytes(d.memory_peak_bytes)),
        el('td', { class: 'num' }, fmtBytes(d.memory_reserved_bytes)), el('td', { class: 'num' }, fmtBytes(d.memory_free_bytes)),
        el('td', { class: 'num' }, fmtBytes(d.memory_total_bytes)));
    });
    const kids = [el('table', { class: 'grid', id: 'devices' },
      el('thead', {}, el('tr', {}, ['Device', 'Kind', 'Job', 'Memory', 'In use', 'Peak', 'Reserved', 'Free', 'Total']
        .map((h) => el('th', { class: ['In use', 'Peak', 'Reserved', 'Free', 'Total'].includes(h) ? 'num' : null }, h)))),
      el('tbody', {}, rows))];
    if (body.gpu_selftest)
      kids.push(el('p', { class: body.gpu_selftest.passed ? 'muted' : 'top-error' }, 'GPU self-test: ' + body.gpu_selftest.message));
    box.replaceChildren(...kids);
  }

  /* #/devices */
  function viewDevices(root) {
    root.append(el('h1', {}, 'Devices'), el('div', { id: 'devices-panel' }));
    every(POLL_MS, async () => {
      const dr = await apiJSON('/v1/devices');
      if (dr.ok) renderDevices($('#devices-panel'), dr.body);
      setStatus('updated ' + new Date().toLocaleTimeString());
    });
  }

  /* #/job/ID */
  async function viewJob(root, id) {
    const jr = await apiJSON('/v1/jobs/' + encodeURIComponent(id));
    if (!jr.ok) {
      root.append(el('h1', {}, id), el('div', { class: 'error-box' }, jr.body && jr.body.error ? jr.body.error.message : 'HTTP ' + jr.status));
      return;
    }
    let job = jr.body;
    const [dr, mr] = await Promise.all([apiJSON('/v1/devices'), apiJSON(`/v1/jobs/${id}/metrics`)]);
    const devByName = new Map((dr.ok ? dr.body.devices : []).map((d) => [d.name, d]));

    const facts = el('div', { class: 'facts panel', id: 'job-facts' });
    const cancelBtn = el('button', { class: 'danger', id: 'cancel', onclick: () => cancelJob(id) }, 'Cancel…');
    const msg = el('span', { id: 'job-msg', class: 'muted' });
    root.append(el('div', { class: 'row' }, el('h1', {}, el('span', { class: 'mono' }, id), ' ', el('span', { id: 'job-name' }, job.name)),
      el('span', { id: 'job-state' }), el('span', { style: 'margin-left:auto' }, msg, ' ', cancelBtn)), facts);
    const errBox = el('div', { id: 'job-error' });
    root.append(errBox);
    const chartsBox = el('div', { class: 'charts' });
    root.append(chartsBox);
    /* sample answers (eval_prompts' `sample` events), by step, newest first */
    const samplesBox = el('div', { class: 'samples', id: 'job-samples' });
    const samplesPanel = el('div', { hidden: true }, el('h2', {}, 'Sample answers'), samplesBox);
    root.append(samplesPanel);
    const samples = new Map();
    hook.samples = samples;
    function addSample(ev) {
      let box = samples.get(ev.step);
      if (!box) {
        box = el('div', { class: 'sample-step panel', 'data-step': ev.step }, el('h3', {}, 'Step ' + ev.step));
        samples.set(ev.step, box);
        const later = [...samplesBox.children].find((c) => Number(c.dataset.step) < ev.step);
        samplesBox.insertBefore(box, later || null);
      }
      const prompt = typeof ev.prompt === 'string' ? ev.prompt : JSON.stringify(ev.prompt);
      box.append(el('div', { class: 'sample', 'data-index': ev.index },
        el('div', { class: 'sample-prompt' }, el('b', {}, `#${ev.index} `), prompt),
        el('div', { class: 'sample-text' }, ev.text)));
      samplesPanel.hidden = false;
    }
    const logBox = el('pre', { class: 'log', id: 'job-log' });
    root.append(el('h2', {}, 'Log'), logBox);

    function renderFacts() {
      $('#job-state').replaceChildren(badge(job.state));
      cancelBtn.disabled = isFinal(job.state);
      const f = (k, v) => el('div', {}, el('b', {}, k), v);
      facts.replaceChildren(
        f('Step', progress(job.step, job.max_steps)), f('Loss', fmtNum(job.loss)), f('Split m × a × w', fmtSplit(job.batch)),
        f('Batch B', job.batch ? String(job.batch.train_batch_size) : '—'), f('Precision', job.precision || '—'),
        f('Devices', job.devices && job.devices.length ? job.devices.join(', ') : '—'),
        f('Owner', job.owner != null ? String(job.owner) : '—'), f('Priority', String(job.priority)),
        f('Submitted', job.submitted_at || '—'), f('Started', job.started_at || '—'),
        f('Finished', job.finished_at || '—'), f('Restarts', String(job.restarts)));
      errBox.replaceChildren(...(job.error ? [el('div', { class: 'error-box' }, `${job.error.code}: ${job.error.message}`)] : []));
    }
    renderFacts();

    /* the series, by step (a resumed run overwrites the steps it redoes) */
    const rec = new Map();
    const steps = [];
    const markers = [];
    hook.markers = markers;
    function at(step) {
      let r = rec.get(step);
      if (!r) {
        r = {};
        rec.set(step, r);
        let i = steps.length;
        while (i > 0 && steps[i - 1] > step) i--;
        steps.splice(i, 0, step);
      }
      return r;
    }
    const world = job.batch ? job.batch.world : (job.devices || []).length || 1;
    const devNames = (job.devices && job.devices.length ? job.devices : Array.from({ length: world }, (_, i) => 'rank ' + i));
    const budgets = devNames.map((n) => (devByName.get(n) || {}).memory_total_bytes || null);
    const sameBudget = budgets.every((b) => b === budgets[0]);
    const budgetSeries = sameBudget ? [{ label: 'budget', b: budgets[0] }] : devNames.map((n, i) => ({ label: n + ' budget', b: budgets[i] }));

    const mo = { markers };
    const charts = {
      loss: makeChart('loss', chartsBox, 'Loss', [
        { label: 'train', stroke: COLORS[0], width: 1.5, value: (u, v) => fmtNum(v) },
        { label: 'eval', stroke: COLORS[1], width: 2, spanGaps: true, points: { show: true, size: 6 }, value: (u, v) => fmtNum(v) }], mo),
      lr: makeChart('lr', chartsBox, 'Learning rate', [{ label: 'lr', stroke: COLORS[2], width: 1.5, value: (u, v) => (v == null ? '—' : v.toExponential(3)) }],
        Object.assign({ yAxis: { values: (u, vs) => vs.map((v) => v.toExponential(1)) } }, mo)),
      grad: makeChart('grad', chartsBox, 'Gradient norm', [{ label: 'grad norm', stroke: COLORS[3], width: 1.5, value: (u, v) => fmtNum(v, 3) }], mo),
      tps: makeChart('tps', chartsBox, 'Tokens / s', [{ label: 'tokens/s', stroke: COLORS[5], width: 1.5, value: (u, v) => fmtRate(v) }],
        Object.assign({ yAxis: { values: (u, vs) => vs.map(fmtRate) } }, mo)),
      mem: makeChart('mem', chartsBox, 'Device memory vs budget (log scale)',
        [].concat(...devNames.map((n, i) => [
          { label: n + ' in use', stroke: COLORS[i % COLORS.length], width: 1.5, value: (u, v) => fmtBytes(v) },
          { label: n + ' peak', stroke: COLORS[i % COLORS.length], dash: [6, 4], width: 1, value: (u, v) => fmtBytes(v) }]),
        budgetSeries.map((b) => ({ label: b.label, stroke: '#1d2430', width: 2.5, value: (u, v) => fmtBytes(v) }))),
        Object.assign({ scales: { y: { distr: 3, log: 2 } }, yAxis: { values: (u, vs) => vs.map(fmtBytes), size: 74 } }, mo)),
    };
    const onResize = () => {
      for (const u of Object.values(charts)) u.setSize({ width: Math.max(300, u.root.parentNode.clientWidth - 16), height: 210 });
    };
    window.addEventListener('resize', onResize);
    cleanups.push(() => window.removeEventListener('resize', onResize));
    cleanups.push(() => { for (const u of Object.values(charts)) u.destroy(); });

    let dirty = false, timer = null;
    function redraw() {
      timer = null;
      if (!dirty || document.hidden) return; /* a hidden tab draws when shown */
      dirty = false;
      const col = (f) => steps.map((s) => { const v = f(rec.get(s)); return v == null ? null : v; });
      charts.loss.setData([steps.slice(), col((r) => r.loss), col((r) => r.val_loss)]);
      charts.lr.setData([steps.slice(), col((r) => r.lr)]);
      charts.grad.setData([steps.slice(), col((r) => r.grad_norm)]);
      charts.tps.setData([steps.slice(), col((r) => r.tokens_per_s)]);
      /* memory: only the steps that reported it (the history does not) */
      const ms = steps.filter((s) => rec.get(s).mem_in_use);
      const mcol = (f) => ms.map((s) => { const v = f(rec.get(s)); return v == null || v <= 0 ? null : v; });
      const mdata = [ms];
      devNames.forEach((_, i) => { mdata.push(mcol((r) => r.mem_in_use[i])); mdata.push(mcol((r) => (r.mem_peak || [])[i])); });
      budgetSeries.forEach((b) => mdata.push(ms.map(() => b.b)));
      charts.mem.setData(mdata);
    }
    function touch() {
      dirty = true;
      if (!timer) timer = setTimeout(redraw, 200);
    }
    cleanups.push(() => clearTimeout(timer));
    const onVisible = () => { if (!document.hidden && dirty) touch(); };
    document.addEventListener('visibilitychange', onVisible);
    cleanups.push(() => document.removeEventListener('visibilitychange', onVisible));

    /* the history first (the ring may not hold the oldest steps) */
    if (mr.ok) {
      for (const s of mr.body.steps) {
        Object.assign(at(s.step), { loss: s.loss, lr: s.lr, grad_norm: s.grad_norm, tokens_per_s: s.tokens_per_s });
      }
      touch();
    }

    function logLine(ev, text) {
      const t = ev.time ? ev.time.slice(11, 23) : '';
      logBox.append(el('div', { class: 'ev-' + ev.type + (ev.state === 'failed' ? ' ev-failed' : '') }, el('span', { class: 't' }, t + ' '), text));
      while (logBox.childNodes.length > LOG_MAX) logBox.firstChild.remove();
      if (logBox.scrollHeight - logBox.scrollTop - logBox.clientHeight < 80) logBox.scrollTop = logBox.scrollHeight;
    }
    const split = (o) => (o ? `m=${o.micro_batch} a=${o.accum_steps}` : '?');

    function onEvent(type, ev) {
      switch (type) {
        case 'step':
          Object.assign(at(ev.step), { loss: ev.loss, lr: ev.lr, grad_norm: ev.grad_norm, tokens_per_s: ev.tokens_per_s,
            mem_in_use: ev.mem_in_use || [], mem_peak: ev.mem_peak || [] });
          job.step = ev.step;
          if (ev.loss != null) job.loss = ev.loss;
          if (job.batch && ev.micro_batch) { job.batch.micro_batch = ev.micro_batch; job.batch.accum_steps = ev.accum_steps; }
          touch();
          return;
        case 'eval':
          at(ev.step).val_loss = ev.val_loss;
          logLine(ev, `eval step ${ev.step}: val_loss ${fmtNum(ev.val_loss)}`);
          touch();
          return;
        case 'oom_adjust':
          markers.push({ kind: 'oom_adjust', step: ev.step + 1 }); /* step: the 0-based step that ran out */
          logLine(ev, `out of memory at step ${ev.step}: ${split(ev.from)} -> ${split(ev.to)}${ev.recompute ? ' (recompute)' : ''}, asked ${fmtBytes(ev.bytes_asked)}, free ${fmtBytes(ev.bytes_free)}`);
          touch();
          return;
        case 'split_adjust':
          markers.push({ kind: 'split_adjust', step: ev.step });
          logLine(ev, `split raised at step ${ev.step}: ${split(ev.from)} -> ${split(ev.to)}`);
          touch();
          return;
        case 'checkpoint':
          markers.push({ kind: 'checkpoint', step: ev.step });
          logLine(ev, `checkpoint at step ${ev.step}: ${ev.path}`);
          touch();
          return;
        case 'state':
          job.state = ev.state;
          logLine(ev, `state ${ev.from ? ev.from + ' -> ' : ''}${ev.state}${ev.message ? ': ' + ev.message : ''}`);
          renderFacts();
          return;
        case 'log':
          logLine(ev, (ev.step != null ? `[step ${ev.step}] ` : '') + ev.message);
          return;
        case 'gap':
          logLine(ev, `(${ev.missed} events ${ev.from}..${ev.to} skipped: this page fell behind)`);
          return;
        case 'sample':
          addSample(ev);
          return;
        case 'done':
          logLine(ev, `done: ${ev.state} at step ${ev.step}${ev.message ? ' (' + ev.message + ')' : ''}`);
          return;
        default:
          logLine(ev, type);
      }
    }

    const ctl = new AbortController();
    cleanups.push(() => ctl.abort());
    streamEvents(id, onEvent, ctl.signal, (s) => setStatus('events: ' + s, s !== 'live' && s !== 'finished'),
      async () => { const r = await apiJSON('/v1/jobs/' + encodeURIComponent(id)); return r.ok && isFinal(r.body.state); });
    /* the job's own view for what the stream does not carry (finish time, error) */
    every(POLL_MS, async () => {
      const r = await apiJSON('/v1/jobs/' + encodeURIComponent(id));
      if (r.ok) { job = r.body; renderFacts(); }
    });
    cleanups.push(() => { window.__accumd.job = null; });
    hook.job = () => job;
  }

  function confirmDialog(text) {
    const dlg = $('#confirm-dialog');
    $('#confirm-text').textContent = text;
    return new Promise((resolve) => {
      dlg.addEventListener('close', () => resolve(dlg.returnValue === 'yes'), { once: true });
      dlg.returnValue = '';
      dlg.showModal();
    });
  }

  async function cancelJob(id) {
    if (!(await confirmDialog(`Cancel job ${id}? A running job stops at its next micro-step; this cannot be undone.`))) return;
    const r = await apiJSON('/v1/jobs/' + encodeURIComponent(id), { method: 'DELETE' });
    const msg = $('#job-msg');
    if (msg) msg.textContent = r.ok ? (r.status === 202 ? 'cancel requested' : 'cancelled')
      : (r.body && r.body.error ? r.body.error.message : 'HTTP ' + r.status);
  }

  /* #/submit */
  const EXAMPLE = JSON.stringify({
    name: 'tiny-gpt',
    model: { arch: 'gpt2', n_layer: 2, n_head: 4, n_embd: 64, seq_len: 64, vocab_size: 256 },
    data: { train: 'corpus.txt', format: 'text' },
    train_batch_size: 16, train_micro_batch_size_per_gpu: 4, gradient_accumulation_steps: 'auto',
    devices: 1, optimizer: { type: 'adamw', lr: 3e-3 }, max_steps: 100, seed: 1337,
  }, null, 2);

  /* Where each key path ("optimizer.lr", "a.b[0]") of a JSON text starts:
   * path -> 1-based line. Tolerant: stops quietly at a syntax error. */
  function keyLines(text) {
    const out = new Map();
    let i = 0, line = 1;
    const ws = () => { while (i < text.length && /\s/.test(text[i])) { if (text[i] === '\n') line++; i++; } };
    const str = () => {
      let s = '';
      i++;
      while (i < text.length && text[i] !== '"') {
        if (text[i] === '\\') { s += text[i + 1]; i += 2; continue; }
        if (text[i] === '\n') line++;
        s += text[i++];
      }
      i++;
      return s;
    };
    const value = (path) => {
      ws();
      const c = text[i];
      if (c === '{') {
        i++; ws();
        if (text[i] === '}') { i++; return; }
        for (;;) {
          ws();
          if (text[i] !== '"') throw new Error('key');
          const kl = line, k = str(), p = path ? path + '.' + k : k;
          if (!out.has(p)) out.set(p, kl);
          ws();
          if (text[i++] !== ':') throw new Error(':');
          value(p); ws();
          if (text[i] === ',') { i++; continue; }
          if (text[i] === '}') { i++; return; }
          throw new Error('}');
        }
      }
      if (c === '[') {
        i++; ws();
        if (text[i] === ']') { i++; return; }
        for (let n = 0; ; n++) {
          value(`${path}[${n}]`); ws();
          if (text[i] === ',') { i++; continue; }
          if (text[i] === ']') { i++; return; }
          throw new Error(']');
        }
      }
      if (c === '"') { str(); return; }
      const m = /^[^,\]}\s]+/.exec(text.slice(i, i + 64));
      if (!m) throw new Error('value');
      i += m[0].length;
    };
    try { value(''); } catch (e) { /* partial map */ }
    return out;
  }

  /* The line of the key path `field`, or of its nearest parent present. */
  function lineOfField(text, field, message) {
    if (!field) {
      const m = /line (\d+)/.exec(message || '');
      return m ? Number(m[1]) : null;
    }
    const lines = keyLines(text);
    for (let p = field; p;) {
      if (lines.has(p)) return lines.get(p);
      const parent = p.replace(/(\.[^.[\]]*|\[\d+\])$/, '');
      p = parent === p ? '' : parent;
    }
    return null;
  }

  function viewSubmit(root) {
    const ta = el('textarea', { id: 'spec', spellcheck: 'false' });
    ta.value = sessionStorage.getItem('accumd.spec') || EXAMPLE;
    const file = el('input', { type: 'file', id: 'spec-file', accept: '.json,application/json' });
    const checkBtn = el('button', { id: 'check', class: 'primary' }, 'Check (dry run)');
    const submitBtn = el('button', { id: 'submit', disabled: true }, 'Submit');
    const out = el('div', { id: 'check-result' });
    let checked = null; /* the text the last successful dry run was for */

    file.addEventListener('change', async () => {
      if (file.files[0]) { ta.value = await file.files[0].text(); ta.dispatchEvent(new Event('input')); }
    });
    ta.addEventListener('input', () => {
      sessionStorage.setItem('accumd.spec', ta.value);
      submitBtn.disabled = ta.value !== checked;
    });

    function showError(text, status, e) {
      const field = e ? e.field : null;
      const msg = e ? e.message : 'HTTP ' + status;
      const at = lineOfField(text, field, msg);
      const kids = [el('p', { class: 'top-error', id: 'error-summary' }, `${status} ${e ? e.code : ''}`,
        field ? ` in ${field}` : '', at ? ` (line ${at})` : '', at ? '' : ': ' + msg)];
      if (field && !at) kids.push(el('div', { class: 'field-error', 'data-field': field }, `${field}: ${msg}`));
      kids.push(el('ol', { class: 'spec-lines', id: 'spec-lines' }, text.split('\n').map((l, i) => {
        const fault = at === i + 1;
        return el('li', { class: fault ? 'at-fault' : null, 'data-line': i + 1 }, el('span', {}, l || ' '),
          fault ? el('div', { class: 'field-error', 'data-field': field || '' }, msg) : null);
      })));
      out.replaceChildren(...kids);
      const fe = $('.field-error', out);
      if (fe) fe.scrollIntoView({ block: 'nearest' });
    }

    function showPlan(p) {
      const b = p.batch;
      const chosen = (c) => c.micro_batch === b.micro_batch && !c.recompute;
      out.replaceChildren(
        el('p', { class: 'plan-ok', id: 'plan-ok' }, 'The spec is valid. Plan:'),
        el('table', { class: 'grid', id: 'plan' }, el('tbody', {},
          el('tr', {}, el('th', {}, 'Batch B = m × a × w'), el('td', {}, `${b.train_batch_size} = ${b.micro_batch} × ${b.accum_steps} × ${b.world}${b.micro_auto ? ' (micro batch chosen by the planner)' : ''}`)),
          el('tr', {}, el('th', {}, 'Precision'), el('td', {}, p.precision)),
          el('tr', {}, el('th', {}, 'Placement'), el('td', {}, p.placement.starts_now
            ? `starts now on ${p.placement.devices.join(', ')} (${p.placement.kind})`
            : `waits (${p.placement.queued_before} queued job(s) run before it)`)),
          el('tr', {}, el('th', {}, 'Predicted peak / device'), el('td', {},
            p.predicted_peak_memory_bytes.map((x) => fmtBytes(x)).join(', '),
            ` of ${fmtBytes(p.device_memory_bytes)} (${(100 * Math.max(...p.predicted_peak_memory_bytes) / p.device_memory_bytes).toFixed(1)}%)`)))),
        el('h2', {}, 'Micro-batch candidates'),
        el('table', { class: 'grid', id: 'candidates' },
          el('thead', {}, el('tr', {}, ['micro batch', 'accum steps', 'recompute', 'predicted peak', 'fits'].map((h) => el('th', {}, h)))),
          el('tbody', {}, p.micro_batch_candidates.map((c) => el('tr', { style: chosen(c) ? 'font-weight:600;background:#eef4ff' : null },
            el('td', {}, c.micro_batch), el('td', {}, c.accum_steps), el('td', {}, c.recompute ? 'yes' : 'no'),
            el('td', {}, fmtBytes(c.predicted_peak_bytes)), el('td', { class: c.fits ? '' : 'fits-no' }, c.fits ? 'yes' : 'no'))))));
    }

    checkBtn.addEventListener('click', async () => {
      const text = ta.value;
      checked = null;
      submitBtn.disabled = true;
      out.replaceChildren(el('p', { class: 'muted' }, 'checking…'));
      const r = await apiJSON('/v1/jobs?dry_run=1', { method: 'POST', body: text, headers: { 'Content-Type': 'application/json' } });
      if (r.ok && r.body && r.body.dry_run) {
        checked = text;
        submitBtn.disabled = false;
        showPlan(r.body);
      } else {
        showError(text, r.status, r.body && r.body.error);
      }
    });
    submitBtn.addEventListener('click', async () => {
      const text = ta.value;
      if (text !== checked) return;
      submitBtn.disabled = true;
      const r = await apiJSON('/v1/jobs', { method: 'POST', body: text, headers: { 'Content-Type': 'application/json' } });
      if (r.status === 201) location.hash = '#/job/' + r.body.id;
      else showError(text, r.status, r.body && r.body.error);
    });

    root.append(el('h1', {}, 'Submit a job'),
      el('div', { class: 'submit-grid' },
        el('div', {}, el('p', { class: 'muted' }, 'Paste a job spec (docs/api.md) or upload a file. ',
          'It is checked with the dry run and the planner before it can be queued.'),
          el('div', { class: 'row', style: 'margin-bottom:8px' }, file), ta,
          el('div', { class: 'row', style: 'margin-top:8px' }, checkBtn, submitBtn)),
        el('div', {}, out)));
  }

  /* #/chat: talk to a model (a directory under data_roots) or a job's */
  function viewChat(root) {
    const model = el('input', { id: 'chat-model', list: 'chat-models', placeholder: 'model directory or job:ID', spellcheck: 'false', size: 32 });
    const models = el('datalist', { id: 'chat-models' });
    const mode = el('select', { id: 'chat-mode' }, el('option', { value: 'chat' }, 'chat (template)'), el('option', { value: 'prompt' }, 'plain prompt'));
    const maxTok = el('input', { id: 'chat-max', type: 'number', min: 1, value: 128, style: 'width:6em' });
    const temp = el('input', { id: 'chat-temp', type: 'number', min: 0, step: 0.1, value: 0, style: 'width:5em' });
    const log = el('div', { class: 'chat-log panel', id: 'chat-log' });
    const input = el('textarea', { id: 'chat-input', rows: 3, placeholder: 'Say something (Ctrl+Enter sends)' });
    const send = el('button', { class: 'primary', id: 'chat-send' }, 'Send');
    const clear = el('button', { id: 'chat-clear' }, 'New conversation');
    const info = el('span', { id: 'chat-info', class: 'muted' });
    const turns = [];
    hook.chat = { turns, busy: false };
    root.append(el('h1', {}, 'Chat'),
      el('div', { class: 'row' }, el('label', {}, 'Model ', model), models, mode,
        el('label', {}, 'max tokens ', maxTok), el('label', {}, 'temperature ', temp), clear),
      log, el('div', { class: 'row chat-send' }, input, send), info);
    apiJSON('/v1/jobs?limit=100').then((r) => {
      if (!r.ok) return;
      for (const j of r.body.jobs) if (j.state !== 'queued') models.append(el('option', { value: 'job:' + j.id }, j.name || j.id));
    });
    const ctl = new AbortController();
    cleanups.push(() => ctl.abort());
    clear.addEventListener('click', () => { turns.length = 0; log.replaceChildren(); info.textContent = ''; });
    async function go() {
      const text = input.value;
      if (!text.trim() || hook.chat.busy) return;
      if (!model.value.trim()) { info.textContent = 'Pick a model first.'; return; }
      hook.chat.busy = true;
      send.disabled = true;
      input.value = '';
      log.append(el('div', { class: 'msg user' }, text));
      const answer = el('div', { class: 'msg assistant streaming' });
      log.append(answer);
      const body = { model: model.value.trim(), stream: true, max_new_tokens: Number(maxTok.value), temperature: Number(temp.value) };
      if (mode.value === 'chat') body.messages = turns.concat([{ role: 'user', content: text }]);
      else body.prompt = text;
      let got = '', final = null;
      try {
        const r = await api('/v1/generate', { method: 'POST', body: JSON.stringify(body), signal: ctl.signal, headers: { 'Content-Type': 'application/json' } });
        if (!r.ok) {
          let e = null;
          try { e = (await r.json()).error; } catch (x) { e = null; }
          answer.classList.add('error-box');
          answer.textContent = e ? (e.field && !e.message.startsWith(e.field + ':') ? `${e.field}: ${e.message}` : e.message) : 'HTTP ' + r.status;
        } else {
          await readSSE(r, (type, ev) => {
            if (type === 'queued') info.textContent = `queued: position ${ev.position}`;
            else if (type === 'started') info.textContent = `generating on device ${ev.device}`;
            else if (type === 'token') { got += ev.text; answer.textContent = got; log.scrollTop = log.scrollHeight; }
            else if (type === 'done') final = ev;
            else if (type === 'error') { answer.classList.add('error-box'); answer.textContent = ev.error ? ev.error.message : 'error'; }
          });
        }
      } catch (e) {
        if (!ctl.signal.aborted) { answer.classList.add('error-box'); answer.textContent = 'error: ' + e.message; }
      }
      answer.classList.remove('streaming');
      if (final) {
        answer.textContent = final.text;
        turns.push({ role: 'user', content: text }, { role: 'assistant', content: final.text });
        info.textContent = `${final.completion_tokens} tokens (${final.finish_reason}), ${fmtNum(final.queue_s, 2)} s queued`;
        answer.dataset.tokens = JSON.stringify(final.tokens);
      }
      hook.chat.busy = false;
      send.disabled = false;
    }
    send.addEventListener('click', go);
    input.addEventListener('keydown', (e) => { if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) go(); });
  }

  /* ---- routing ----------------------------------------------------------------- */
  async function route() {
    leaveView();
    const root = $('#view');
    root.replaceChildren();
    const h = location.hash.replace(/^#/, '') || '/';
    const m = /^\/job\/([^/]+)$/.exec(h);
    const name = m ? 'job' : h === '/devices' ? 'devices' : h === '/submit' ? 'submit' : h === '/chat' ? 'chat' : 'jobs';
    hook.view = name;
    for (const a of document.querySelectorAll('header nav a')) a.classList.toggle('active', a.dataset.nav === (name === 'job' ? 'jobs' : name));
    try {
      if (name === 'job') await viewJob(root, decodeURIComponent(m[1]));
      else if (name === 'devices') viewDevices(root);
      else if (name === 'submit') viewSubmit(root);
      else if (name === 'chat') viewChat(root);
      else viewJobs(root);
    } catch (e) {
      root.append(el('div', { class: 'error-box' }, 'error: ' + e.message));
    }
  }
  window.addEventListener('hashchange', route);
  route();
})();
