// HyperQwen monitor page: polls /api/state and draws it. Plain JS, no build step, no external files.
"use strict";

const COLORS = { gen: "#2f7ed8", prompt: "#8e44ad", ttft: "#d35400", running: "#27ae60", waiting: "#c0392b",
                 kv: "#2c3e50", hit: "#16a085", spec: "#e67e22" };

const $ = (id) => document.getElementById(id);

function num(value, digits) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  return Number(value).toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
}
const int = (v) => num(v, 0);
const pct = (v) => (v === null || v === undefined ? "–" : num(100 * v, 1) + " %");
function secs(v) {
  if (v === null || v === undefined) return "–";
  return v < 1 ? num(1000 * v, 0) + " ms" : num(v, 2) + " s";
}
function clock(t) {
  return new Date(t * 1000).toLocaleTimeString("en-GB", { hour12: false });
}
function set(id, text) {
  const el = $(id);
  if (el) el.textContent = text;
}

// A small line chart on a canvas: series = [{values, color}], times = epoch seconds.
function drawChart(canvas, times, series, opts) {
  const ctx = canvas.getContext("2d");
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || canvas.width, height = canvas.clientHeight || canvas.height;
  if (canvas.width !== width * ratio) { canvas.width = width * ratio; canvas.height = height * ratio; }
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const left = 48, right = 8, top = 8, bottom = 20;
  const plotW = width - left - right, plotH = height - top - bottom;
  let max = opts.max;
  if (max === undefined) {
    max = 0;
    for (const s of series) for (const v of s.values) if (v !== null && v > max) max = v;
    max = max > 0 ? niceCeil(max * 1.1) : 1;
  }
  const min = opts.min || 0;
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#666";
  ctx.strokeStyle = "#e3e3e3";
  ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const v = min + (max - min) * i / 4, y = top + plotH - plotH * i / 4;
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + plotW, y); ctx.stroke();
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    ctx.fillText(opts.format ? opts.format(v) : num(v, max <= 2 ? 2 : max <= 20 ? 1 : 0), left - 4, y);
  }
  if (!times.length) {
    ctx.textAlign = "center"; ctx.fillText("waiting for data", left + plotW / 2, top + plotH / 2);
    return;
  }
  const t1 = times[times.length - 1], t0 = Math.min(times[0], t1 - 60);
  const x = (t) => left + plotW * (t - t0) / Math.max(1e-9, t1 - t0);
  const y = (v) => top + plotH - plotH * (Math.min(v, max) - min) / Math.max(1e-9, max - min);
  ctx.textAlign = "center"; ctx.textBaseline = "top";
  for (let i = 0; i <= 4; i++) {
    const t = t0 + (t1 - t0) * i / 4, ago = Math.round((t1 - t) / 60 * 10) / 10;
    ctx.textAlign = i === 4 ? "right" : "center";  // keep "now" inside the canvas
    ctx.fillText(ago === 0 ? "now" : "-" + ago + " min", x(t), top + plotH + 4);
  }
  for (const s of series) {
    ctx.strokeStyle = s.color; ctx.lineWidth = 1.8; ctx.beginPath();
    let pen = false;
    s.values.forEach((v, i) => {
      if (v === null || v === undefined) { pen = false; return; }
      if (pen) ctx.lineTo(x(times[i]), y(v)); else ctx.moveTo(x(times[i]), y(v));
      pen = true;
    });
    ctx.stroke();
    // Values that arrive only now and then (TTFT: only when a request starts) get a dot each,
    // so a lone point between gaps is still visible.
    if (opts.dots || s.dots) {
      ctx.fillStyle = s.color;
      s.values.forEach((v, i) => {
        if (v === null || v === undefined) return;
        ctx.beginPath(); ctx.arc(x(times[i]), y(v), 2.5, 0, 2 * Math.PI); ctx.fill();
      });
    }
  }
}

function niceCeil(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function renderPositions(perPos) {
  const box = $("spec-positions");
  box.textContent = "";
  if (!perPos) return;
  perPos.forEach((rate, i) => {
    const row = document.createElement("div");
    row.className = "position";
    row.dataset.position = String(i);
    const label = document.createElement("span");
    label.textContent = "draft " + (i + 1);
    const bar = document.createElement("div");
    bar.className = "bar";
    const fill = document.createElement("div");
    fill.style.width = Math.max(0, Math.min(100, 100 * rate)) + "%";
    bar.appendChild(fill);
    const value = document.createElement("span");
    value.className = "value";
    value.textContent = pct(rate);
    row.append(label, bar, value);
    box.appendChild(row);
  });
}

function renderWindows(windows) {
  const body = document.querySelector("#windows tbody");
  body.textContent = "";
  for (const [name, w] of Object.entries(windows)) {
    const tr = document.createElement("tr");
    tr.dataset.window = name;
    for (const text of [name, num(w.generation_tps, 1), num(w.prompt_tps, 1), secs(w.ttft_mean_s), int(w.finished),
                        pct(w.prefix_hit_rate), num(w.spec_tokens_per_step, 2)]) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}

function renderRequests(rows) {
  const body = document.querySelector("#requests tbody");
  body.textContent = "";
  if (!rows.length) {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = 7; td.className = "empty"; td.textContent = "no finished requests seen yet";
    tr.appendChild(td); body.appendChild(tr);
    return;
  }
  for (const r of rows) {
    const tr = document.createElement("tr");
    tr.className = r.exact ? "exact" : "group";
    const reasons = Object.entries(r.finish_reasons).map(([k, n]) => (r.count > 1 ? n + "× " : "") + k).join(", ");
    const cells = {
      time: clock(r.time), count: r.exact ? "1" : "× " + r.count, prompt: int(r.prompt_tokens),
      output: int(r.output_tokens), ttft: (r.exact ? "" : "mean ") + secs(r.ttft_s),
      duration: (r.exact ? "" : "mean ") + secs(r.duration_s), reason: reasons,
    };
    for (const [col, text] of Object.entries(cells)) {
      const td = document.createElement("td");
      td.dataset.col = col;
      td.textContent = text;
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}

const PREFILL_NOTE = $("prefill-note") ? $("prefill-note").textContent : "";

function renderPrefill(prefill) {
  const body = document.querySelector("#prefill tbody");
  if (!body || !prefill) return;
  set("prefill-note", prefill.available === false && prefill.note ? prefill.note : PREFILL_NOTE);
  body.textContent = "";
  if (!prefill.requests.length) {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = 5; td.className = "empty";
    td.textContent = prefill.available === false ? "not available" : "no prompt is being filled";
    tr.appendChild(td); body.appendChild(tr);
    return;
  }
  for (const r of prefill.requests) {
    const tr = document.createElement("tr");
    tr.dataset.id = r.id;
    const cells = {
      id: r.id, progress: pct(r.fraction), tokens: int(r.computed_tokens) + " / " + int(r.prompt_tokens),
      rate: num(r.tokens_per_s, 0), eta: secs(r.eta_s),
    };
    for (const [col, text] of Object.entries(cells)) {
      const td = document.createElement("td");
      td.dataset.col = col;
      td.textContent = text;
      if (col === "progress") {
        const bar = document.createElement("div");
        bar.className = "bar";
        const fill = document.createElement("div");
        fill.style.width = Math.min(100, 100 * r.fraction) + "%";
        bar.appendChild(fill); td.appendChild(bar);
      }
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}

// Replicas behind a router (docs/multi-gpu.md): ?replica=N picks whose charts the page shows; every replica is
// listed with its status.
const REPLICA = new URLSearchParams(location.search).get("replica") || "0";

function renderReplicas(state) {
  const nav = $("replicas");
  if (!nav) return;
  nav.hidden = !state.replicas;
  if (!state.replicas) return;
  nav.replaceChildren(...state.replicas.map((r, i) => {
    const a = document.createElement("a");
    a.href = "?replica=" + i;
    a.className = "replica " + (r.up ? "up" : "down") + (i === state.replica ? " current" : "");
    a.dataset.up = String(r.up);
    a.textContent = "replica " + i + ": " + (r.up ? "up" : "down") + " (" + r.url + ")";
    return a;
  }));
}

function render(state) {
  renderReplicas(state);
  const up = state.upstream.up;
  const status = $("status");
  status.className = "status " + (up ? "up" : "down");
  status.dataset.up = String(up);
  status.textContent = up ? "server up" : "server unreachable: " + (state.upstream.error || "");
  set("model-name", state.model_name || "–");
  set("upstream-url", state.upstream.url);
  set("interval", num(state.interval_s, 1));
  set("updated", state.upstream.last_success ? clock(state.upstream.last_success) : "never");
  document.querySelectorAll(".now-window").forEach((el) => { el.textContent = num(state.now_window_s, 0); });

  const now = state.now, w1 = state.windows["1m"] || now, w5 = state.windows["5m"] || w1, life = state.lifetime || {};
  set("now-generation-tps", num(now.generation_tps, 1));
  set("now-prompt-tps", num(now.prompt_tps, 1));
  set("w1m-generation-tps", num(w1.generation_tps, 1));
  set("w1m-prompt-tps", num(w1.prompt_tps, 1));
  set("life-generation-tokens", int(life.generation_tokens));
  set("life-prompt-tokens", int(life.prompt_tokens));
  set("w1m-ttft", secs(w1.ttft_mean_s));
  set("life-ttft", secs(life.ttft_mean_s));
  set("running", int(now.running));
  set("waiting", int(now.waiting));
  set("life-finished", int(life.finished_total));
  set("kv-usage", pct(now.kv_usage));
  $("kv-usage-bar").style.width = (now.kv_usage ? Math.min(100, 100 * now.kv_usage) : 0) + "%";
  const known = state.lifetime !== null;  // "off" only once the server said so
  set("w5m-prefix-hit-rate", state.prefix_cache || !known ? pct(w5.prefix_hit_rate) : "off");
  set("life-prefix-hit-rate", pct(life.prefix_hit_rate));
  // RAM_CACHE: prompt tokens restored from host RAM instead of recomputed ("off" until a connector answered).
  $("ram-card").classList.toggle("off", known && !state.ram_cache);
  set("w5m-ram-cache-hit-rate", state.ram_cache || !known ? pct(w5.ram_cache_hit_rate) : "off");
  set("life-ram-cache-hits", int(life.ram_cache_hits));
  $("spec-card").classList.toggle("off", known && !state.speculative);
  set("w5m-spec-tokens-per-step", state.speculative || !known ? num(w5.spec_tokens_per_step, 2) : "off");
  set("life-spec-tokens-per-step", num(life.spec_tokens_per_step, 2));
  renderPositions(state.speculative ? (w5.spec_per_position || life.spec_per_position) : null);
  renderWindows(state.windows);
  renderRequests(state.requests);
  renderPrefill(state.prefill);

  const s = state.series;
  drawChart($("chart-tps"), s.t, [{ values: s.generation_tps, color: COLORS.gen },
                                  { values: s.prompt_tps, color: COLORS.prompt }], {});
  drawChart($("chart-ttft"), s.t, [{ values: s.ttft_s, color: COLORS.ttft }], { format: (v) => num(v, 2), dots: true });
  drawChart($("chart-queue"), s.t, [{ values: s.running, color: COLORS.running },
                                    { values: s.waiting, color: COLORS.waiting }], {});
  drawChart($("chart-kv"), s.t, [{ values: s.kv_usage.map((v) => (v === null ? null : 100 * v)), color: COLORS.kv },
                                 { values: s.prefix_hit_rate.map((v) => (v === null ? null : 100 * v)), color: COLORS.hit, dots: true }],
            { max: 100 });
  $("chart-spec-figure").classList.toggle("off", !state.speculative);
  drawChart($("chart-spec"), s.t, [{ values: s.spec_tokens_per_step, color: COLORS.spec }], { format: (v) => num(v, 1), dots: true });
  document.body.dataset.rendered = String(state.server_time);
}

async function poll() {
  let delay = 2000;
  try {
    const response = await fetch("/api/state?replica=" + encodeURIComponent(REPLICA),
                                 { cache: "no-store", credentials: "same-origin" });
    if (!response.ok) throw new Error("HTTP " + response.status);
    const state = await response.json();
    render(state);
    delay = Math.max(500, 1000 * state.interval_s);
  } catch (err) {
    const status = $("status");
    status.className = "status down";
    status.dataset.up = "false";
    status.textContent = "monitor unreachable: " + err.message;
  }
  setTimeout(poll, delay);
}

poll();
