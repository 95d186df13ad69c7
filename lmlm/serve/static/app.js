// The lmlm serve page: generate, see which facts were looked up, delete or edit them, regenerate.
// Plain JavaScript, no build step. Text from the server is only ever set with textContent.
"use strict";

const $ = (sel) => document.querySelector(sel);
const state = { result: null, selected: null, busy: false, markers: [] };

// -- talking to the server --------------------------------------------------------------------------
function headers(write) {
  const h = { "Content-Type": "application/json" };
  const token = $("#token").value.trim();
  if (write && token) h.Authorization = "Bearer " + token;
  return h;
}

function describe(body, status) {
  if (!body) return "HTTP " + status;
  const d = body.detail !== undefined ? body.detail : body.error ? body.error.message : body;
  if (Array.isArray(d)) return d.map((e) => (e.loc || []).slice(1).join(".") + ": " + e.msg).join("; ");
  return typeof d === "string" ? d : JSON.stringify(d);
}

async function api(path, { method = "GET", body, write = false } = {}) {
  const res = await fetch(path, { method, headers: headers(write), body: body && JSON.stringify(body) });
  const data = await res.json().catch(() => null);
  if (!res.ok) throw new Error(res.status + ": " + describe(data, res.status));
  return data;
}

// Server-sent events over a POST response: calls onEvent(name, data) for each event.
async function readEvents(res, onEvent) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      let name = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      onEvent(name, data ? JSON.parse(data) : null);
    }
  }
}

function status(msg, error = false) {
  $("#status").textContent = msg;
  $("#status").classList.toggle("error", error);
}

// -- generation -----------------------------------------------------------------------------------
async function generate() {
  if (state.busy) return;
  state.busy = true;
  $("#generate").disabled = true;
  const body = {
    prompt: $("#prompt").value,
    max_new_tokens: Number($("#max-new-tokens").value) || 32,
    use_db: !$("#no-db").checked,
    stream: $("#stream").checked,
  };
  status("generating…");
  $("#output").dataset.state = "running";
  try {
    let result;
    if (body.stream) {
      const live = $("#live");
      live.hidden = false;
      live.textContent = "";
      const res = await fetch("/api/generate", { method: "POST", headers: headers(false), body: JSON.stringify(body) });
      if (!res.ok) throw new Error(res.status + ": " + describe(await res.json().catch(() => null), res.status));
      await readEvents(res, (name, data) => {
        if (name === "token") live.textContent += data.token;
        else if (name === "result") result = data;
        else if (name === "error") throw new Error(data.status + ": " + describe(data, data.status));
      });
      live.hidden = true;
    } else {
      result = await api("/api/generate", { method: "POST", body });
    }
    render(result);
    status("");
  } catch (e) {
    status(e.message, true);
  } finally {
    state.busy = false;
    $("#generate").disabled = false;
    $("#output").dataset.state = "done";
  }
}

function render(res) {
  state.result = res;
  select(null);
  const out = $("#output");
  out.replaceChildren();
  const p = document.createElement("span");
  p.className = "prompt";
  p.textContent = res.prompt;
  out.append(p);
  let last = res.prompt;
  res.segments.forEach((seg, i) => {
    if (seg.type === "text") {
      out.append(...withMarkers(seg.text));
      if (seg.text) last = seg.text;
      return;
    }
    const t = seg.trace !== null ? res.trace[seg.trace] : null;
    const span = document.createElement("span");
    span.className = "fact " + (t && t.found ? "found" : "missing");
    span.dataset.trace = seg.trace === null ? "" : String(seg.trace);
    span.dataset.found = t && t.found ? "true" : "false";
    if (t && t.triple_id !== null) span.dataset.tripleId = String(t.triple_id);
    const rel = document.createElement("span");
    rel.className = "rel";
    rel.textContent = seg.relation;
    span.append(rel, document.createTextNode(seg.value));
    span.addEventListener("mouseenter", () => showTip(span, t));
    span.addEventListener("mouseleave", () => ($("#tip").hidden = true));
    span.addEventListener("click", () => select(seg.trace, span));
    // the texts join to clean_text; a fact stands apart from the words on either side by one space
    const next = res.segments[i + 1];
    if (last && !/\s$/.test(last)) out.append(" ");
    out.append(span);
    if (!(next && next.type === "text" && /^\s/.test(next.text))) out.append(" ");
    last = " ";
  });
  $("#clean").replaceChildren(...withMarkers(res.clean_text));
  const found = res.trace.filter((t) => t.found).length;
  const n = res.trace.length;
  $("#meta").textContent = `${n} lookup${n === 1 ? "" : "s"} (${found} found) · KB v${res.kb_version} · ` +
    `${res.tokens} tokens · batch of ${res.batch_rows} · ${(res.queued_s + res.run_s).toFixed(2)} s` +
    (res.problems.length ? " · " + res.problems.join("; ") : "");
}

// Text with the lookup markers of an unfinished call shown apart (dimmed).
function withMarkers(text) {
  if (!state.markers.length) return [document.createTextNode(text)];
  const nodes = [];
  const pattern = new RegExp("(" + state.markers.map((m) => m.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("|") + ")");
  for (const part of text.split(pattern)) {
    if (!part) continue;
    if (state.markers.includes(part)) {
      const m = document.createElement("span");
      m.className = "marker";
      m.textContent = part;
      nodes.push(m);
    } else {
      nodes.push(document.createTextNode(part));
    }
  }
  return nodes;
}

// -- one fact -------------------------------------------------------------------------------------
function details(t) {
  if (!t) return [["lookup", "unfinished call (no answer yet)"]];
  const rows = [["query", `${t.query_entity} · ${t.query_relation}`]];
  if (t.found) {
    rows.push(["matched", `${t.matched_entity} · ${t.matched_relation}`], ["value", t.value],
              ["score", t.score === null ? "–" : t.score.toFixed(3) + (t.score === 1 ? " (exact)" : " (fuzzy)")],
              ["entity found by", t.via || "–"],
              ["triple", "#" + t.triple_id], ["sources", t.sources.length ? t.sources.join(", ") : "–"]);
  } else {
    rows.push(["value", `${t.value} (no fact in the KB matched)`]);
    if (t.miss_reason) {
      rows.push(["why", `${t.miss_reason.replace(/_/g, " ")}` + (t.miss_detail ? `: ${t.miss_detail}` : "")]);
      const c = t.candidates || [];
      rows.push(["considered", c.length ? c.map(([n, s]) => `${n} (${Number(s).toFixed(2)})`).join(", ") : "–"]);
    }
  }
  rows.push(["KB version", t.kb_version === null ? "–" : "v" + t.kb_version]);
  if (t.status) rows.push(["status", t.status + (t.problem ? ": " + t.problem : "")]);
  return rows;
}

function fill(dl, rows) {
  dl.replaceChildren();
  for (const [k, v] of rows) {
    const dt = document.createElement("dt"), dd = document.createElement("dd");
    dt.textContent = k;
    dd.textContent = v;
    dl.append(dt, dd);
  }
}

function showTip(span, t) {
  const tip = $("#tip");
  const dl = document.createElement("dl");
  fill(dl, details(t));
  tip.replaceChildren(dl);
  const r = span.getBoundingClientRect();
  tip.style.left = window.scrollX + r.left + "px";
  tip.style.top = window.scrollY + r.bottom + 6 + "px";
  tip.hidden = false;
}

function select(index, span) {
  document.querySelectorAll(".fact.selected").forEach((el) => el.classList.remove("selected"));
  const t = index === null || index === undefined || !state.result ? null : state.result.trace[index];
  state.selected = t;
  $("#fact-empty").hidden = !!t;
  $("#fact-body").hidden = !t;
  if (!t) return;
  if (span) span.classList.add("selected");
  fill($("#fact-details"), details(t));
  $("#fact-actions").hidden = !t.found;
  $("#edit-value").value = t.value;
}

async function change(path, body, what) {
  try {
    const r = await api(path, { method: "POST", body: { ...body, who: "web page" }, write: true });
    status(`${what}: KB v${r.version} (${r.changed} changed); regenerating…`);
    await refreshInfo();
    await refreshLog();
    await generate();
  } catch (e) {
    status(e.message, true);
  }
}

$("#delete-fact").addEventListener("click", () => {
  const t = state.selected;
  if (t && t.found) change("/api/kb/delete", { triple_ids: [t.triple_id], why: "deleted from the web page" },
                           `deleted triple #${t.triple_id}`);
});

$("#edit-fact").addEventListener("click", () => {
  const t = state.selected, value = $("#edit-value").value.trim();
  if (t && t.found && value) change("/api/kb/edit", { entity: t.matched_entity, relation: t.matched_relation, value,
                                                      why: "edited from the web page" },
                                     `${t.matched_entity} · ${t.matched_relation} → ${value}`);
});

// -- the KB ---------------------------------------------------------------------------------------
async function refreshInfo() {
  try {
    const info = await api("/api/info");
    $("#model").textContent = `model ${info.model.name} (${(info.model.parameters / 1e6).toFixed(2)}M, ${info.model.device})`;
    $("#kb").textContent = `KB ${info.kb.name} v${info.kb.version}` + (info.writes_enabled ? "" : " (read-only)");
    $("#max-new-tokens").max = info.limits.max_new_tokens;
    state.markers = info.lookup_tokens;
  } catch (e) {
    status(e.message, true);
  }
}

async function refreshLog() {
  try {
    const log = await api("/api/kb/log?limit=15");
    const body = $("#log tbody");
    body.replaceChildren();
    for (const v of log.versions) {
      const tr = document.createElement("tr");
      tr.dataset.version = String(v.version);
      for (const [text, cls] of [[v.version], [v.op, "op-" + v.op], [v.n_changed], [v.who], [v.why],
                                 [v.time.replace("T", " ").slice(0, 19)]]) {
        const td = document.createElement("td");
        td.textContent = String(text);
        if (cls) td.className = cls;
        tr.append(td);
      }
      tr.addEventListener("click", () => showChanges(v.version));
      body.append(tr);
    }
  } catch (e) {
    status(e.message, true);
  }
}

async function showChanges(version) {
  const d = await api("/api/kb/log/" + version);
  const lines = d.changes.slice(0, 50).map((c) =>
    `#${c.triple_id} ${c.op}: ${c.old_value === null ? "" : c.old_value}${c.new_value === null ? "" : " → " + c.new_value}`);
  if (d.changes.length > 50) lines.push(`… ${d.changes.length - 50} more`);
  const pre = $("#changes");
  pre.textContent = `v${version} (${d.record.op} by ${d.record.who}${d.record.why ? ": " + d.record.why : ""})\n` + lines.join("\n");
  pre.hidden = false;
}

$("#form").addEventListener("submit", (e) => { e.preventDefault(); generate(); });
$("#refresh-log").addEventListener("click", refreshLog);
$("#token").value = localStorage.getItem("lmlm-token") || "";
$("#token").addEventListener("change", () => localStorage.setItem("lmlm-token", $("#token").value.trim()));
refreshInfo();
refreshLog();
