// The job list and one job: live progress in words, its controls (from the `actions`
// its state allows, sent by the server), previews, LoRA files and the followed log.
import { h } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import htm from "htm";
import { api, fileUrl } from "./api.js";
import { LossChart } from "./chart.js";
import { Previews } from "./previews.js";
import { Problems } from "./form.js";

const html = htm.bind(h);
export const can = (job, action) => job.actions.includes(action);

export function fmtTime(s) {
  if (s == null) return "–";
  s = Math.round(s);
  const hrs = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  return hrs ? `${hrs}h ${m}m` : m ? `${m}m ${s % 60}s` : `${s}s`;
}

function Progress({ job }) {
  const p = job.progress || {};
  const pct = p.total_steps ? Math.min(100, (100 * (p.step || 0)) / p.total_steps) : 0;
  return html`<div class="bar"><div style=${`width:${pct}%`}></div></div>`;
}

// The queue's order: the page sends the whole queue in its new order (POST
// /api/queue/order); the list comes back through the job events.
function queueMoves(jobs, setMessage) {
  const queue = jobs.filter((j) => j.queue_place != null)
    .sort((a, b) => a.queue_place - b.queue_place).map((j) => j.id);
  return async (event, id, by) => {
    event.stopPropagation();
    const ids = [...queue], i = ids.indexOf(id), k = i + by;
    if (i < 0 || k < 0 || k >= ids.length) return;
    [ids[i], ids[k]] = [ids[k], ids[i]];
    setMessage("");
    try { await api("POST", "/api/queue/order", { ids }); }
    catch (err) { setMessage(err.message); }
  };
}

export function JobList({ jobs, selected, onSelect, onNew }) {
  const [message, setMessage] = useState("");
  const move = queueMoves(jobs, setMessage);
  const last = Math.max(0, ...jobs.map((j) => j.queue_place ?? 0));
  return html`<div class="card">
    <div class="row head"><h2>Jobs</h2>
      <button id="new-job" class="primary" onClick=${onNew}>New job</button></div>
    ${jobs.length === 0 && html`<p class="muted">No jobs yet: make one with the form.</p>`}
    ${message && html`<p class="problems" id="queue-message">${message}</p>`}
    <ul class="jobs">
      ${jobs.map((j) => html`<li key=${j.id} class=${j.id === selected ? "sel" : ""}
          data-job=${j.name} onClick=${() => onSelect(j.id)}>
        <div class="row"><b>${j.name}</b><span class=${`badge ${j.state}`}>${j.state}</span></div>
        ${j.queue_place != null && html`<div class="row queue-place">
          <span class="muted">starts ${j.queue_place === 1 ? "next" : `#${j.queue_place}`}</span>
          <span><button class="move-up" title="start earlier" disabled=${j.queue_place === 1}
              onClick=${(e) => move(e, j.id, -1)}>↑</button>
            <button class="move-down" title="start later" disabled=${j.queue_place === last}
              onClick=${(e) => move(e, j.id, 1)}>↓</button></span></div>`}
        <div class="muted">${j.progress?.step ?? 0}/${j.progress?.total_steps ?? "?"} steps
          ${j.active && j.progress?.phase_text ? ` · ${j.progress.phase_text}` : ""}</div>
        <${Progress} job=${j} />
      </li>`)}
    </ul>
  </div>`;
}

function Log({ text }) {
  const box = useRef(null);
  const [follow, setFollow] = useState(true);
  useEffect(() => { if (follow && box.current) box.current.scrollTop = box.current.scrollHeight; },
    [text, follow]);
  return html`<section><h2>Output <label class="muted"><input type="checkbox" id="follow"
      checked=${follow} onChange=${(e) => setFollow(e.target.checked)} /> follow</label></h2>
    <pre class="log" id="log" ref=${box}>${text.slice(-16000)}</pre></section>`;
}

export function JobDetail({ job, onDeleted, onEdit, onCopied }) {
  const [loss, setLoss] = useState([]);
  const [previews, setPreviews] = useState([]);
  const [loras, setLoras] = useState([]);
  const [made, setMade] = useState(null); // a file job's outputs (null: a training job)
  const [log, setLog] = useState("");
  const [message, setMessage] = useState("");
  const [copyName, setCopyName] = useState(`${job.name}_2`);
  const [errors, setErrors] = useState([]);
  const p = job.progress || {};
  const tick = `${job.id}:${job.state}:${p.step}:${p.phase}`;

  useEffect(() => {
    const base = `/api/jobs/${job.id}`;
    api("GET", `${base}/loss?max_points=500`).then(setLoss).catch(() => {});
    api("GET", `${base}/previews`).then(setPreviews).catch(() => {});
    api("GET", `${base}/loras`).then(setLoras).catch(() => {});
    api("GET", base).then((full) => setMade(full.files || null)).catch(() => {});
    api("GET", `${base}/log`).then((r) => setLog(r.log)).catch(() => {});
  }, [tick]);
  useEffect(() => setCopyName(`${job.name}_2`), [job.id]);

  const act = async (verb, body) => {
    setMessage("");
    try {
      const r = await api("POST", `/api/jobs/${job.id}/${verb}`, body);
      if (r.queued) setMessage("queued: it starts when the running job ends");
      if (verb === "ask") setMessage(`asked: ${body.what} at the next step`);
    } catch (err) { setMessage(err.message); }
  };
  const copy = async () => {
    try {
      const r = await api("POST", `/api/jobs/${job.id}/copy`, { name: copyName });
      setErrors([]); onCopied(r.id);
    } catch (err) { setErrors(err.errors || [{ path: "", message: err.message }]); }
  };
  const deleteOutputs = async () => {
    const typed = window.prompt(`This deletes ${job.out_dir} (LoRA files, checkpoints, ` +
      `samples). Type the job name "${job.name}" to confirm.`);
    if (typed == null) return;
    try { await api("DELETE", `/api/jobs/${job.id}/outputs`, { confirm: typed }); }
    catch (err) { setMessage(err.message); }
  };
  const forget = async () => {
    if (!window.confirm(`Remove ${job.name} from the list? Its outputs stay on disk.`)) return;
    try { await api("DELETE", `/api/jobs/${job.id}`); onDeleted(); }
    catch (err) { setMessage(err.message); }
  };

  const active = job.active;
  return html`<div class="card" id="job-detail" data-state=${job.state}>
    <h2>${job.name} <span class=${`badge ${job.state}`} id="job-state">${job.state}</span></h2>
    <div class="stats">
      <div><b id="phase">${active ? p.phase || "starting" : job.state}</b>
        <span id="phase-text">${active ? p.phase_text || "starting the trainer" : "phase"}</span></div>
      <div><b id="step">${p.step ?? 0} / ${p.total_steps ?? "?"}</b><span>step</span></div>
      <div><b id="loss">${p.loss != null ? p.loss.toFixed(4) : "–"}</b><span>loss</span></div>
      <div><b id="speed">${p.it_per_s != null ? p.it_per_s.toFixed(2) : "–"}</b><span>it/s</span></div>
      <div><b id="eta">${fmtTime(p.eta_s)}</b><span>ETA</span></div>
    </div>
    ${active && p.message && html`<p class="muted">${p.message}</p>`}
    <${Progress} job=${job} />
    <div class="actions">
      ${can(job, "start") && html`<button id="start" class="primary"
        onClick=${() => act("start")}>Start</button>`}
      ${can(job, "resume") && html`<button id="resume" class="primary"
        onClick=${() => act("resume")}>Resume</button>`}
      ${can(job, "rerun") && html`<button id="rerun"
        onClick=${() => act("start")}>Run again</button>`}
      ${can(job, "stop") && html`<button id="stop" onClick=${() => act("stop")}>Stop</button>`}
      ${active && !can(job, "stop") && html`<button id="stop" disabled>Saving…</button>`}
      ${can(job, "save_now") && html`<button id="save-now" disabled=${job.asked.includes("save")}
        onClick=${() => act("ask", { what: "save" })}>Save now</button>`}
      ${can(job, "sample_now") && html`<button id="sample-now"
        disabled=${job.asked.includes("sample")}
        onClick=${() => act("ask", { what: "sample" })}>Sample now</button>`}
      ${can(job, "edit") && html`<button id="edit" onClick=${onEdit}>View / edit config</button>`}
      <button class="danger" disabled=${!can(job, "delete_outputs")}
        onClick=${deleteOutputs}>Delete outputs</button>
      <button class="danger" disabled=${!can(job, "delete")} onClick=${forget}>Remove job</button>
    </div>
    ${can(job, "copy") && html`<div class="actions"><input id="copy-name" value=${copyName}
        onInput=${(e) => setCopyName(e.target.value)} />
      <button id="copy" onClick=${copy}>Run again under this name</button></div>`}
    <${Problems} errors=${errors} />
    ${message && html`<p class="muted" id="message">${message}</p>`}
    ${job.error && html`<p class="problems" id="job-error">${job.error}</p>`}
    <${Problems} errors=${job.errors} />
    ${made ? html`<section id="made"><h2>Files made</h2>
      ${made.length === 0 && html`<p class="muted">None yet.</p>`}
      <ul>${made.map((f) => html`<li><a class="made" href=${fileUrl(job.id, f.file, !f.inline)}
        download=${f.inline ? undefined : f.file} target=${f.inline ? "_blank" : undefined}
        rel="noopener">${f.file}</a>
        <span class="muted"> ${(f.size / 1024).toFixed(0)} KiB</span></li>`)}</ul>
    </section>` : html`
    <section><h2>Loss</h2><${LossChart} points=${loss} /></section>
    <section><h2>Previews</h2><${Previews} jobId=${job.id} prompts=${previews} /></section>
    <section><h2>LoRA files</h2>
      ${loras.length === 0 && html`<p class="muted">None saved yet.</p>`}
      <ul>${loras.map((l) => html`<li><a class=${l.final ? "lora final" : "lora"}
        href=${fileUrl(job.id, l.file, true)} download=${l.file}>${l.file}</a>
        <span class="muted"> ${(l.size / 1024).toFixed(0)} KiB</span></li>`)}</ul>
    </section>`}
    <${Log} text=${log} />
  </div>`;
}
