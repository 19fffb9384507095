// Furnace dashboard. Polls the controller's monitoring endpoint every 2 s:
//   GET /api/jobs                          -> {"jobs": [JobSummary], "omitted": N} (every job
//                                              not ended and the newest 100 that have)
//   GET /api/workers                       -> {"now_unix", "workers": [WorkerInfo]} (every worker
//                                              the controller knows; now_unix is its clock)
//   GET /api/jobs/<id>/series?after_attempt=&after_step=&max=
//                                          -> {"job_id", "steps": [StepRecord]}: the steps after
//                                             that (attempt, step) (max: 1-10000, default 2000)
// (protobuf JSON: proto field names, 64-bit integers as strings; camelCase is accepted too).
// The selected job (a click, or ?job=ID) gets line charts (uPlot) and an imbalance heatmap drawn
// on a <canvas>. A machine-readable summary of what was drawn goes to #furnace-test-summary.
(() => {
  'use strict';

  const REFRESH_MS = 2000;
  const CHART_HEIGHT = 170;
  const FIRST_FETCH_MAX = 2000;     // points asked for when a job is first opened
  // Past twice that many, the series is fetched again thinned to FIRST_FETCH_MAX points spread
  // over the whole job (the controller reads only those): a tab left open on a long job keeps a
  // bounded history, as evenly spread as a fresh one, and redraws in bounded time.
  const MAX_POINTS = 2 * FIRST_FETCH_MAX;
  const COLORS = ['#d9480f', '#1c7ed6', '#2b8a3e', '#ae3ec9', '#f59f00', '#0ca678', '#e64980'];

  const params = new URLSearchParams(location.search);
  const view = {
    jobId: params.get('job') || '',
    jobs: [],
    omittedJobs: 0,     // older ended jobs the controller left out of the list
    workers: [],
    workersNow: 0,      // the controller's clock when it listed the workers
    clockSkew: 0,       // the controller's clock - this browser's, as of the last workers list
    workerStates: {},   // state word -> how many workers
    steps: [],          // StepRecords of the selected job, ascending by step
    charts: {},         // name -> uPlot
    plannerKeys: '',
    heatmapCells: 0,
    busy: false,
    again: false,       // a refresh was asked for while one was in flight: run another after it
    thin: false,        // over MAX_POINTS: the next fetch replaces the series with a thinned one
    generation: 0,      // bumped by a click on a job: a reply fetched before it is not merged
  };

  // -- small helpers ----------------------------------------------------------------------------
  const $ = (id) => document.getElementById(id);

  function get(o, snake) {
    if (o == null) return undefined;
    if (snake in o) return o[snake];
    return o[snake.replace(/_([a-z])/g, (_, c) => c.toUpperCase())];
  }
  function num(o, snake) {
    const v = Number(get(o, snake));
    return Number.isFinite(v) ? v : 0;
  }
  // A telemetry enum value as its label: 'PLANNER_ACTION_OFFLOAD' -> 'offload' (the names the
  // Prometheus labels and the CLI use; proto/furnace/v1/telemetry_labels.h).
  function enumLabel(value, prefix) {
    const s = String(value == null ? '' : value);
    return s.startsWith(prefix) ? s.slice(prefix.length).toLowerCase() : s;
  }
  // A step record's planner bytes per action label ({} when the planner did nothing).
  function plannerBytes(r) {
    const m = {};
    for (const p of get(r, 'planner') || []) {
      const k = enumLabel(get(p, 'action'), 'PLANNER_ACTION_');
      m[k] = (m[k] || 0) + num(p, 'bytes');
    }
    return m;
  }

  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    Object.assign(e, props || {});
    for (const c of children) e.append(c);
    return e;
  }

  function fmtBytes(b) {
    if (b == null || !Number.isFinite(b)) return '';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    let v = Math.abs(b);
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (b < 0 ? '-' : '') + (v >= 100 || i === 0 ? v.toFixed(0) : v.toFixed(1)) + ' ' + units[i];
  }
  function fmtSI(v) {
    if (v == null || !Number.isFinite(v)) return '';
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(1) + 'G';
    if (a >= 1e6) return (v / 1e6).toFixed(1) + 'M';
    if (a >= 1e3) return (v / 1e3).toFixed(1) + 'k';
    return a >= 10 ? v.toFixed(0) : v.toFixed(2);
  }

  async function fetchJson(url) {
    const r = await fetch(url, { cache: 'no-store' });
    if (!r.ok) throw new Error(`${url}: ${r.status} ${(await r.text()).trim()}`);
    return r.json();
  }

  function setConn(ok, text) {
    const c = $('conn');
    c.textContent = text;
    c.classList.toggle('bad', !ok);
  }

  // -- jobs table -------------------------------------------------------------------------------
  function stateClass(state) {
    return String(state || '').replace(/^JOB_/, '').toLowerCase();
  }

  // Why the job waits while it does; else its cause, which for a job whose later attempt runs is
  // the one it restarted after (muted: not a failure now), as `furnace jobs` says.
  function causeCell(j, state) {
    const waiting = get(j, 'waiting') || '';
    const cause = get(j, 'cause') || '';
    const past = cause !== '' &&
      !['JOB_SUCCEEDED', 'JOB_FAILED', 'JOB_CANCELLED', 'JOB_RECOVERING'].includes(state);
    const text = waiting ? 'waiting: ' + waiting : past ? 'restarted after: ' + cause : cause;
    return el('td', { className: 'cause' + (waiting || past ? ' past' : '') }, text);
  }

  // What is left of a job's resources.time_limit_s (deadline_unix, when it has one and started), by
  // the controller's clock (this browser's, corrected by the skew the last workers list showed):
  // '' without one or once ended.
  // Coarse, to the minute, so the row is built again about once a minute.
  function timeLeft(j, state) {
    const deadline = num(j, 'deadline_unix');
    if (!(deadline > 0) || ['JOB_SUCCEEDED', 'JOB_FAILED', 'JOB_CANCELLED'].includes(state)) {
      return '';
    }
    const now = Date.now() / 1000 + view.clockSkew;
    const min = Math.floor((deadline - now) / 60);
    if (min < 0) return 'time limit reached';
    if (min < 1) return '< 1 min left';
    if (min < 60) return `${min} min left`;
    const h = Math.floor(min / 60);
    if (h < 48) return `${h}h${String(min % 60).padStart(2, '0')}m left`;
    return `${Math.floor(h / 24)}d${String(h % 24).padStart(2, '0')}h left`;
  }

  // A job's row, built anew when what it shows changed.
  function jobRow(j) {
    const id = get(j, 'job_id');
    const state = String(get(j, 'state') || '');
    const step = num(j, 'step');
    const total = num(j, 'total_steps');
    const pct = total > 0 ? Math.min(100, (100 * step) / total) : 0;
    const bar = el('span', { className: 'bar' }, el('span'));
    bar.firstChild.style.width = pct.toFixed(1) + '%';
    const left = timeLeft(j, state);
    const progress = el('span', { className: 'progress' }, bar,
      el('span', { className: 'txt' }, total > 0 ? `${step} / ${total}` : String(step)));
    if (left) {
      progress.append(el('span', { className: 'txt left', title: 'resources.time_limit_s' }, left));
    }
    const tr = el('tr', {},
      el('td', { className: 'id' }, id),
      el('td', {}, get(j, 'name') || ''),
      el('td', {}, get(j, 'kind') || ''),
      el('td', {}, el('span', { className: 'state ' + stateClass(state) },
        state.replace(/^JOB_/, ''))),
      el('td', { className: 'num' }, String(num(j, 'attempt'))),
      el('td', { className: 'num' }, String(num(j, 'restarts'))),
      el('td', {}, progress),
      causeCell(j, state));
    tr.addEventListener('click', () => selectJob(id));
    return tr;
  }

  // Rows are kept by job id and built again only when what they show changed, and moved only when
  // out of place: a table rebuilt at every poll lost the text selected in it (a job id, a cause
  // being copied) within 2 s.
  const jobRows = new Map();  // job id -> { tr, key }
  function renderJobs() {
    const body = $('jobs').tBodies[0];
    const rows = [];
    const seen = new Set();
    for (const j of view.jobs) {
      const id = get(j, 'job_id');
      const key = JSON.stringify(['name', 'kind', 'state', 'attempt', 'restarts', 'step',
        'total_steps', 'cause', 'waiting'].map((f) => get(j, f))
        .concat([timeLeft(j, String(get(j, 'state') || ''))]));
      let row = jobRows.get(id);
      if (!row || row.key !== key) {
        const tr = jobRow(j);
        if (row) row.tr.replaceWith(tr);
        row = { tr, key };
        jobRows.set(id, row);
      }
      row.tr.classList.toggle('selected', id === view.jobId);
      seen.add(id);
      rows.push(row.tr);
    }
    for (const [id, row] of jobRows) {
      if (!seen.has(id)) {
        row.tr.remove();
        jobRows.delete(id);
      }
    }
    let next = body.firstElementChild;
    for (const tr of rows) {
      if (tr === next) {
        next = next.nextElementSibling;
      } else {
        body.insertBefore(tr, next);
      }
    }
    while (next) {  // the notes below the jobs, drawn again
      const after = next.nextElementSibling;
      next.remove();
      next = after;
    }
    if (view.jobs.length === 0) {
      body.append(el('tr', { className: 'empty' }, el('td', { colSpan: 8 }, 'no jobs yet')));
    }
    if (view.omittedJobs > 0) {
      body.append(el('tr', { className: 'empty' }, el('td', { colSpan: 8 },
        `${view.omittedJobs} older ended job${view.omittedJobs === 1 ? '' : 's'} not shown ` +
        '(furnace jobs lists every job)')));
    }
  }

  // -- workers table ----------------------------------------------------------------------------
  // A worker's state as `furnace workers` words it: ready, busy, lost, or left (lost because its
  // agent said it was stopping).
  function workerState(w) {
    const s = enumLabel(get(w, 'state'), 'WORKER_STATE_');
    return s === 'lost' && get(w, 'left') ? 'left' : s;
  }
  // Coarse on purpose: a worker heard from every second reads "< 10 s ago" poll after poll.
  function fmtAge(s) {
    if (!Number.isFinite(s)) return '';
    if (s < 10) return '< 10 s ago';
    if (s < 90) return `${10 * Math.floor(s / 10)} s ago`;
    if (s < 5400) return `${Math.round(s / 60)} min ago`;
    if (s < 172800) return `${(s / 3600).toFixed(1)} h ago`;
    return `${(s / 86400).toFixed(1)} d ago`;
  }

  // Rebuilt only when what it shows changed (as the jobs table, so a selection in it survives);
  // the last-seen column is coarse (fmtAge), so a healthy cluster's table stays put.
  let workersKey = '';
  function renderWorkers() {
    const counts = {};
    const rows = view.workers.map((w) => {
      const state = workerState(w);
      counts[state] = (counts[state] || 0) + 1;
      const job = get(w, 'job_id') || '';
      const seen = num(w, 'last_seen_unix');
      const memory = num(w, 'device_memory');
      return [get(w, 'worker_id') || '', get(w, 'host') || '', get(w, 'device_kind') || '',
        memory > 0 ? fmtBytes(memory) : '', state, job ? `${job} / ${num(w, 'rank')}` : '',
        seen > 0 ? fmtAge(view.workersNow - seen) : '', job];
    });
    const order = ['busy', 'ready', 'lost', 'left'];
    const n = view.workers.length;
    $('workers-count').textContent = n === 0 ? '' : `${n} worker${n === 1 ? '' : 's'}: ` +
      Object.keys(counts).sort((a, b) => order.indexOf(a) - order.indexOf(b))
        .map((k) => `${counts[k]} ${k}`).join(', ');
    view.workerStates = counts;
    const key = JSON.stringify(rows);
    if (key === workersKey) return;
    workersKey = key;
    const body = $('workers').tBodies[0];
    if (rows.length === 0) {
      body.replaceChildren(el('tr', { className: 'empty' },
        el('td', { colSpan: 7 }, 'no workers registered')));
      return;
    }
    body.replaceChildren(...rows.map(([id, host, kind, memory, state, jobRank, seen, job]) => {
      const tr = el('tr', { className: job ? 'jobbed' : '' },
        el('td', { className: 'id' }, id), el('td', {}, host), el('td', {}, kind),
        el('td', { className: 'num' }, memory),
        el('td', {}, el('span', { className: 'state ' + state }, state)),
        el('td', { className: 'id' }, jobRank), el('td', {}, seen));
      if (job) tr.addEventListener('click', () => selectJob(job));  // the job it runs
      return tr;
    }));
  }

  function selectJob(id) {
    if (id === view.jobId) return;
    view.jobId = id;
    view.generation++;
    view.steps = [];
    view.thin = false;
    for (const c of Object.values(view.charts)) c.destroy();
    view.charts = {};
    view.plannerKeys = '';
    // Nothing of the previous job stays on screen while the new one's series loads.
    $('job-title').textContent = 'Job ' + id;
    $('kpis').replaceChildren();
    drawHeatmap();  // empty
    const u = new URL(location.href);
    u.searchParams.set('job', id);
    history.replaceState(null, '', u);
    renderJobs();
    refresh(true);
  }

  // -- series -----------------------------------------------------------------------------------
  // Records come in (attempt, step) order. A restarted attempt redoes the steps after its
  // checkpoint: they replace the abandoned tail. (The incremental fetch asks for the steps after
  // the last one shown, by (attempt, step): an older attempt's abandoned tail never comes back,
  // a newer attempt's redone steps do.)
  function mergeSteps(incoming) {
    for (const r of incoming) {
      const s = num(r, 'step');
      if (view.steps.length && num(r, 'attempt') < lastAttempt()) continue;
      while (view.steps.length && num(view.steps[view.steps.length - 1], 'step') >= s) {
        view.steps.pop();
      }
      view.steps.push(r);
    }
    if (view.steps.length > MAX_POINTS) view.thin = true;
  }

  function lastStep() {
    return view.steps.length ? num(view.steps[view.steps.length - 1], 'step') : 0;
  }

  function lastAttempt() {
    return view.steps.length ? num(view.steps[view.steps.length - 1], 'attempt') : 0;
  }

  function chartWidth(div) {
    return Math.max(280, div.clientWidth || div.parentElement.clientWidth - 20);
  }

  // Creates (or updates) a uPlot line chart in `divId`; series: [{label, stroke, dash, sparse}]
  // (sparse: a value on some steps only, drawn as points joined across the steps without one).
  function lineChart(name, divId, series, data, yFormat) {
    let chart = view.charts[name];
    if (!chart) {
      const div = $(divId);
      div.replaceChildren();
      const opts = {
        width: chartWidth(div),
        height: CHART_HEIGHT,
        scales: { x: { time: false } },
        legend: { show: false },   // the caption names the series
        cursor: { drag: { x: true, y: false } },
        axes: [
          { stroke: '#6b7280', grid: { stroke: '#eef0f3' }, size: 30 },
          { size: 74, stroke: '#6b7280', grid: { stroke: '#eef0f3' },
            values: (u, vals) => vals.map(yFormat) },
        ],
        series: [{ label: 'step' }].concat(series.map((s) => ({
          label: s.label, stroke: s.stroke, width: 2, dash: s.dash, spanGaps: !!s.sparse,
          points: { show: !!s.sparse }, value: (u, v) => (v == null ? '–' : yFormat(v)),
        }))),
      };
      chart = new uPlot(opts, data, div);
      view.charts[name] = chart;
    } else {
      chart.setData(data);
    }
    return data[0].length;
  }

  function renderCharts() {
    const steps = view.steps;
    const x = steps.map((r) => num(r, 'step'));
    const col = (f) => steps.map(f);
    const points = {};
    $('no-steps').hidden = steps.length > 0;

    // The held-out loss (eval.every) on the steps after which it was computed.
    const evalLoss = (r) => (get(r, 'eval') ? num(get(r, 'eval'), 'loss') : null);
    points.loss = lineChart('loss', 'chart-loss',
      [{ label: 'loss', stroke: COLORS[0] }, { label: 'held-out', stroke: COLORS[1], sparse: true }],
      [x, col((r) => num(r, 'loss')), col(evalLoss)], (v) => v.toFixed(3));
    points.eval = steps.filter((r) => get(r, 'eval')).length;
    points.tokens_per_second = lineChart('tps', 'chart-tps',
      [{ label: 'tokens/s', stroke: COLORS[1] }],
      [x, col((r) => num(r, 'tokens_per_second'))], fmtSI);
    points.mfu = lineChart('mfu', 'chart-mfu',
      [{ label: 'MFU %', stroke: COLORS[2] }],
      [x, col((r) => 100 * num(r, 'mfu'))], (v) => v.toFixed(v >= 10 ? 0 : 2));
    points.memory = lineChart('mem', 'chart-mem',
      [{ label: 'peak', stroke: COLORS[3] },
        { label: 'predicted', stroke: COLORS[4 % COLORS.length], dash: [2, 3] },
        { label: 'budget', stroke: '#868e96', dash: [6, 4] }],
      [x, col((r) => num(r, 'activation_peak_bytes')),
        col((r) => (num(r, 'predicted_peak_bytes') > 0 ? num(r, 'predicted_peak_bytes') : null)),
        col((r) => (num(r, 'memory_budget_bytes') > 0 ? num(r, 'memory_budget_bytes') : null))],
      fmtBytes);
    points.planner = renderPlanner(x);
    drawHeatmap();
    return points;
  }

  function renderPlanner(x) {
    const bytes = view.steps.map(plannerBytes);
    const keys = new Set();
    for (const m of bytes) for (const k of Object.keys(m)) keys.add(k);
    const sorted = [...keys].sort();
    $('no-planner').hidden = sorted.length > 0;
    $('chart-planner').hidden = sorted.length === 0;
    if (sorted.length === 0) return 0;
    if (sorted.join(',') !== view.plannerKeys && view.charts.planner) {
      view.charts.planner.destroy();
      delete view.charts.planner;
    }
    view.plannerKeys = sorted.join(',');
    const data = [x].concat(sorted.map((k) => bytes.map((m) => (k in m ? m[k] : 0))));
    return lineChart('planner', 'chart-planner',
      sorted.map((k, i) => ({ label: k, stroke: COLORS[i % COLORS.length] })), data, fmtBytes);
  }

  // -- imbalance heatmap --------------------------------------------------------------------------
  // Colour ramp from even (1.0: pale) to strongly imbalanced (dark red).
  const RAMP = [[255, 247, 236], [253, 212, 158], [252, 141, 89], [215, 48, 31], [127, 0, 0]];
  function rampColor(t) {
    t = Math.max(0, Math.min(1, t)) * (RAMP.length - 1);
    const i = Math.min(RAMP.length - 2, Math.floor(t));
    const f = t - i;
    const c = RAMP[i].map((a, k) => Math.round(a + f * (RAMP[i + 1][k] - a)));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }

  function drawHeatmap() {
    const canvas = $('heatmap');
    const cssW = canvas.clientWidth || 800;
    const cssH = 200;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(cssW * dpr);
    canvas.height = Math.round(cssH * dpr);
    canvas.style.height = cssH + 'px';
    const g = canvas.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, cssW, cssH);
    g.font = '11px "DejaVu Sans", sans-serif';

    const steps = view.steps;
    const layers = steps.reduce((m, r) => Math.max(m, (get(r, 'imbalance') || []).length), 0);
    view.heatmapCells = 0;
    if (steps.length === 0 || layers === 0) {
      g.fillStyle = '#6b7280';
      g.fillText('no routing data yet', 12, 24);
      return;
    }
    let vmax = 1.5;
    for (const r of steps) for (const v of get(r, 'imbalance') || []) vmax = Math.max(vmax, Number(v));
    vmax = Math.ceil(vmax * 4) / 4;

    const left = 44, right = 78, top = 6, bottom = 30;
    const w = cssW - left - right, h = cssH - top - bottom;
    const ch = h / layers;
    // Columns are placed by step number, as the line charts above are (a thinned history and the
    // unthinned steps after it keep one scale): step s spans [x(s), x(next step)).
    const s0 = num(steps[0], 'step'), sEnd = num(steps[steps.length - 1], 'step') + 1;
    const x = (st) => left + ((st - s0) / Math.max(1, sEnd - s0)) * w;
    // One column per step, or per pixel when steps outnumber pixels: a column shows the worst
    // imbalance of its steps (a spike never averages away) and reaches to the next column.
    const columns = [];  // {x0, worst[]}
    const perPixel = steps.length > Math.floor(w);
    for (const r of steps) {
      const x0 = perPixel ? left + Math.floor(x(num(r, 'step')) - left) : x(num(r, 'step'));
      let col = columns[columns.length - 1];
      if (!col || col.x0 !== x0) {
        col = {x0, worst: []};
        columns.push(col);
      }
      const imb = get(r, 'imbalance') || [];
      for (let l = 0; l < imb.length; l++) {
        const v = Number(imb[l]);
        if (Number.isFinite(v) && !(col.worst[l] >= v)) col.worst[l] = v;
      }
    }
    for (let c = 0; c < columns.length; c++) {
      const {x0, worst} = columns[c];
      const x1 = c + 1 < columns.length ? columns[c + 1].x0 : left + w;
      for (let l = 0; l < worst.length; l++) {
        if (worst[l] === undefined) continue;
        g.fillStyle = rampColor((worst[l] - 1) / (vmax - 1));
        // Layer 0 at the top; cells overlap by a pixel so no seams show.
        g.fillRect(x0, top + l * ch, Math.max(1, x1 - x0 + 0.5), ch + 0.5);
        view.heatmapCells++;
      }
    }
    // Axes: layers on the left, steps below.
    g.fillStyle = '#4b5563';
    g.textAlign = 'right';
    g.textBaseline = 'middle';
    const every = Math.ceil(layers / Math.max(1, Math.floor(h / 14)));
    for (let l = 0; l < layers; l += every) g.fillText('L' + l, left - 6, top + (l + 0.5) * ch);
    g.textAlign = 'center';
    g.textBaseline = 'top';
    // Step ticks at a round interval (1, 2, 5, 10, 20, 50, ...), about 70 px apart or more.
    const span = sEnd - 1 - s0;
    let stepEvery = 1;
    for (let k = 1; span / stepEvery > Math.max(1, w / 70); k++) {
      stepEvery = [1, 2, 5][k % 3] * 10 ** Math.floor(k / 3);
    }
    // At the round steps in the range, where those steps sit (whether or not a thinned series
    // holds them).
    for (let t = Math.ceil(s0 / stepEvery) * stepEvery; t < sEnd; t += stepEvery) {
      g.fillText(String(t), (x(t) + x(t + 1)) / 2, top + h + 6);
    }
    g.fillText('step', left + w / 2, top + h + 18);
    // Colour bar.
    const bx = cssW - right + 16, bw = 12;
    for (let y = 0; y < h; y++) {
      g.fillStyle = rampColor(1 - y / h);
      g.fillRect(bx, top + y, bw, 1.5);
    }
    g.textAlign = 'left';
    g.textBaseline = 'middle';
    g.fillStyle = '#4b5563';
    g.fillText(vmax.toFixed(2), bx + bw + 4, top + 4);
    g.fillText('1.00', bx + bw + 4, top + h - 4);
  }

  // -- header numbers ---------------------------------------------------------------------------
  function renderKpis() {
    const j = view.jobs.find((x) => get(x, 'job_id') === view.jobId);
    const title = $('job-title');
    // A job missing from the list is one of the older ended ones the controller leaves out.
    title.textContent = 'Job ' + view.jobId + (j ? ` · ${get(j, 'name')} · ` +
      String(get(j, 'state') || '').replace(/^JOB_/, '').toLowerCase()
      : view.omittedJobs > 0 ? ' · an older ended job (not in the list above)' : '');
    const last = view.steps[view.steps.length - 1];
    // Rates are of training now: between attempts (recovering, starting) nothing trains, and the
    // failed attempt's would read as the job's. An MFU not known (0) is not 0 %.
    const state = j ? String(get(j, 'state') || '') : '';
    const training = !/^JOB_(RECOVERING|PENDING|SCHEDULED|STARTING)$/.test(state);
    const rate = (value, text) => (last && training && value > 0 ? text : '–');
    const kpis = [
      ['step', last ? `${num(last, 'step')}${j && num(j, 'total_steps') ? ' / ' + num(j, 'total_steps') : ''}` : '–'],
      ['loss', last ? num(last, 'loss').toFixed(4) : '–'],
      ['held-out loss', lastEval() ? num(lastEval(), 'loss').toFixed(4) +
        ` (ppl ${num(lastEval(), 'perplexity').toFixed(2)})` : '–'],
      ['tokens/s', rate(num(last || {}, 'tokens_per_second'),
        fmtSI(num(last || {}, 'tokens_per_second')))],
      ['MFU', rate(num(last || {}, 'mfu'), (100 * num(last || {}, 'mfu')).toFixed(2) + ' %')],
      ['step time', last ? num(last, 'step_seconds').toFixed(3) + ' s' : '–'],
      ['attempt', last ? String(num(last, 'attempt')) : (j ? String(num(j, 'attempt')) : '–')],
      // The last step's routing and what the adaptive planner did in it (all ranks).
      ['routing', last ? (get(last, 'routing_spike') ? 'spike' : 'normal') : '–'],
      ['planner', last ? `${num(last, 'planner_decisions')} acted · ` +
        `${num(last, 'emergency_offloads')} emergency` +
        (num(last, 'agreed_drops') > 0 ? ` · ${num(last, 'agreed_drops')} agreed drops` : '') : '–'],
    ];
    $('kpis').replaceChildren(...kpis.map(([k, v]) =>
      el('div', { className: 'kpi' }, el('div', { className: 'k' }, k), el('div', { className: 'v' }, v))));
  }

  // The newest step's held-out evaluation (eval.every), or undefined.
  function lastEval() {
    for (let i = view.steps.length - 1; i >= 0; i--) {
      if (get(view.steps[i], 'eval')) return get(view.steps[i], 'eval');
    }
    return undefined;
  }

  function writeSummary(points) {
    const last = view.steps[view.steps.length - 1];
    const summary = {
      job_id: view.jobId,
      points: points || {},
      last_step: last ? num(last, 'step') : null,
      last_loss: last ? num(last, 'loss') : null,
      last_eval_loss: lastEval() ? num(lastEval(), 'loss') : null,
      last_tokens_per_second: last ? num(last, 'tokens_per_second') : null,
      heatmap_cells: view.heatmapCells,
      jobs: view.jobs.length,
      omitted_jobs: view.omittedJobs,
      workers: view.workers.length,
      worker_states: view.workerStates,
      // job id -> what its row says is left of its time limit (jobs with one, not ended)
      time_left: Object.fromEntries(view.jobs
        .map((j) => [get(j, 'job_id'), timeLeft(j, String(get(j, 'state') || ''))])
        .filter(([, left]) => left)),
    };
    $('furnace-test-summary').textContent = JSON.stringify(summary);
  }

  // -- polling ----------------------------------------------------------------------------------
  // queue: when a poll is in flight, run again right after it (a click on another job wants its
  // series now, not in 2 s); the timer's polls are dropped instead, so none pile up.
  async function refresh(queue) {
    if (view.busy) {
      if (queue) view.again = true;
      return;
    }
    view.busy = true;
    view.again = false;
    try {
      const jobs = await fetchJson('/api/jobs');
      view.jobs = get(jobs, 'jobs') || [];
      view.omittedJobs = num(jobs, 'omitted');
      renderJobs();
      try {  // (a failed workers list leaves the jobs and the selected job's charts updating)
        const workers = await fetchJson('/api/workers');
        view.workers = get(workers, 'workers') || [];
        view.workersNow = num(workers, 'now_unix');
        if (view.workersNow > 0) view.clockSkew = view.workersNow - Date.now() / 1000;
        renderWorkers();
      } catch (e) {
        $('workers-count').textContent = 'not updated: ' + String(e.message || e);
      }
      let points = null;
      if (view.jobId) {
        $('job').hidden = false;
        const id = view.jobId;
        const whole = view.thin;
        // Bounded either way (a tab that slept through a night of steps gets them thinned).
        const q = view.steps.length && !whole
          ? `after_attempt=${lastAttempt()}&after_step=${lastStep()}&max=${FIRST_FETCH_MAX}`
          : `max=${FIRST_FETCH_MAX}`;
        const generation = view.generation;
        const series = await fetchJson(`/api/jobs/${encodeURIComponent(id)}/series?${q}`);
        if (generation === view.generation) {
          // Thinned again: the newest held-out evaluations shown so far stay, half a fetch's worth
          // at most (the controller spaces its points evenly and would drop most of them).
          const evals = whole
            ? view.steps.filter((r) => get(r, 'eval')).slice(-FIRST_FETCH_MAX / 2) : [];
          if (whole) {
            view.steps = [];
            view.thin = false;
          }
          // Merged in (attempt, step) order with the fetched records, so an evaluation of an
          // attempt that a later one redid (from a checkpoint before it) goes as its steps do.
          const incoming = get(series, 'steps') || [];
          mergeSteps(evals.length ? incoming.concat(evals).sort((a, b) =>
            num(a, 'attempt') - num(b, 'attempt') || num(a, 'step') - num(b, 'step')) : incoming);
          points = renderCharts();
          renderKpis();
        }
      }
      writeSummary(points);
      setConn(true, 'updated ' + new Date().toLocaleTimeString());
    } catch (e) {
      setConn(false, String(e.message || e));
    } finally {
      view.busy = false;
      if (view.again) refresh();
    }
  }

  window.addEventListener('resize', () => {
    for (const [name, c] of Object.entries(view.charts)) {
      const div = $('chart-' + name) || c.root.parentElement;
      c.setSize({ width: chartWidth(div), height: CHART_HEIGHT });
    }
    drawHeatmap();
  });

  refresh();
  setInterval(() => refresh(), REFRESH_MS);
})();
