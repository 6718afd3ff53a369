// The aitk web UI: jobs on the left, the selected job (or a new one) on the right.
// Preact + htm: components without a JSX compile step; esbuild only bundles.
import { h, render } from "preact";
import { useEffect, useState, useCallback } from "preact/hooks";
import htm from "htm";
import { api, fileUrl, eventsUrl, signIn } from "./api.js";
import { LossChart } from "./chart.js";

// A job's state is the server's word: it sends `active` (its trainer lives) and
// `actions` (what the state allows), and the buttons follow them; no state list here.
const html = htm.bind(h);
const can = (job, action) => job.actions.includes(action);

function fmtTime(s) {
  if (s == null) return "–";
  s = Math.round(s);
  const m = Math.floor(s / 60);
  return m ? `${m}m ${s % 60}s` : `${s}s`;
}

function Progress({ job }) {
  const p = job.progress || {};
  const pct = p.total_steps ? Math.min(100, (100 * (p.step || 0)) / p.total_steps) : 0;
  return html`<div class="bar"><div style=${`width:${pct}%`}></div></div>`;
}

function JobList({ jobs, selected, onSelect, onNew }) {
  return html`<div class="card">
    <div class="row" style="display:flex;justify-content:space-between;align-items:center">
      <h2>Jobs</h2>
      <button id="new-job" class="primary" onClick=${onNew}>New job</button>
    </div>
    ${jobs.length === 0 && html`<p class="muted">No jobs yet: create one from the example.</p>`}
    <ul class="jobs">
      ${jobs.map((j) => html`<li key=${j.id} class=${j.id === selected ? "sel" : ""}
          data-job=${j.name} onClick=${() => onSelect(j.id)}>
        <div class="row"><b>${j.name}</b><span class=${`badge ${j.state}`}>${j.state}</span></div>
        <div class="muted">${j.progress?.step ?? 0}/${j.progress?.total_steps ?? "?"} steps
          ${j.progress?.phase && j.active ? ` · ${j.progress.phase}` : ""}</div>
        <${Progress} job=${j} />
      </li>`)}
    </ul>
  </div>`;
}

function Problems({ errors }) {
  if (!errors || !errors.length) return null;
  return html`<ul class="problems" id="problems">
    ${errors.map((e) => html`<li>${e.path ? html`<code>${e.path}</code>: ` : ""}${e.message}</li>`)}
  </ul>`;
}

function NewJob({ onCreated }) {
  const [examples, setExamples] = useState({});
  const [example, setExample] = useState("");
  const [name, setName] = useState("");
  const [text, setText] = useState("");
  const [errors, setErrors] = useState([]);
  const [busy, setBusy] = useState(false);

  useEffect(() => {
    api("GET", "/api/examples").then((found) => {
      setExamples(found);
      const first = Object.keys(found)[0] || "";
      setExample(first);
      setText(found[first] || "");
    });
  }, []);

  const pick = (value) => { setExample(value); setText(examples[value] || ""); };
  const create = async () => {
    setBusy(true);
    setErrors([]);
    const edited = text !== (examples[example] || "");
    const body = edited || !example ? { yaml: text } : { example, name: name || undefined };
    try {
      const job = await api("POST", "/api/jobs", body);
      onCreated(job.id);
    } catch (err) {
      setErrors(err.errors || [{ path: "", message: err.message }]);
    } finally {
      setBusy(false);
    }
  };

  return html`<div class="card" id="new-job-form">
    <h2>New job</h2>
    <p class="muted">Start from an example, change the name, or edit its YAML (the upstream
      AI Toolkit format). Problems are shown with the field they belong to.</p>
    <div class="actions">
      <label>Example <select id="example" value=${example}
        onChange=${(e) => pick(e.target.value)}>
        ${Object.keys(examples).map((n) => html`<option value=${n}>${n}</option>`)}
      </select></label>
      <label>Name <input id="job-name" placeholder="(the example's)" value=${name}
        onInput=${(e) => setName(e.target.value)} /></label>
    </div>
    <textarea id="yaml" value=${text} onInput=${(e) => setText(e.target.value)}></textarea>
    <${Problems} errors=${errors} />
    <div class="actions">
      <button id="create" class="primary" disabled=${busy} onClick=${create}>Create</button>
    </div>
  </div>`;
}

function JobDetail({ job, onDeleted }) {
  const [loss, setLoss] = useState([]);
  const [samples, setSamples] = useState([]);
  const [loras, setLoras] = useState([]);
  const [log, setLog] = useState("");
  const [message, setMessage] = useState("");
  const p = job.progress || {};
  const tick = `${job.id}:${job.state}:${p.step}:${p.phase}`;

  useEffect(() => {
    const base = `/api/jobs/${job.id}`;
    api("GET", `${base}/loss?max_points=500`).then(setLoss).catch(() => {});
    api("GET", `${base}/samples`).then(setSamples).catch(() => {});
    api("GET", `${base}/loras`).then(setLoras).catch(() => {});
    api("GET", `${base}/log`).then((r) => setLog(r.log)).catch(() => {});
  }, [tick]);

  const act = async (verb) => {
    setMessage("");
    try {
      const r = await api("POST", `/api/jobs/${job.id}/${verb}`);
      if (r.queued) setMessage("queued: it starts when the running job ends");
    } catch (err) { setMessage(err.message); }
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
  const recent = samples.slice(-4).reverse();
  return html`<div class="card" id="job-detail" data-state=${job.state}>
    <h2>${job.name} <span class=${`badge ${job.state}`} id="job-state">${job.state}</span></h2>
    <div class="stats">
      <div><b id="phase">${active ? p.phase || "starting" : job.state}</b><span>phase</span></div>
      <div><b id="step">${p.step ?? 0} / ${p.total_steps ?? "?"}</b><span>step</span></div>
      <div><b id="loss">${p.loss != null ? p.loss.toFixed(4) : "–"}</b><span>loss</span></div>
      <div><b>${p.it_per_s != null ? p.it_per_s.toFixed(2) : "–"}</b><span>it/s</span></div>
      <div><b>${active ? fmtTime(p.eta_s) : "–"}</b><span>ETA</span></div>
    </div>
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
      <button class="danger" disabled=${!can(job, "delete_outputs")}
        onClick=${deleteOutputs}>Delete outputs</button>
      <button class="danger" disabled=${!can(job, "delete")} onClick=${forget}>Remove job</button>
    </div>
    ${message && html`<p class="muted" id="message">${message}</p>`}
    ${job.error && html`<p class="problems" id="job-error">${job.error}</p>`}
    <${Problems} errors=${job.errors} />
    <section><h2>Loss</h2><${LossChart} points=${loss} /></section>
    <section class="grid2">
      <div><h2>Samples</h2>
        ${recent.length === 0 && html`<p class="muted">No samples yet.</p>`}
        <div class="gallery">${recent.flatMap((s) => s.files.map((f) => html`<figure>
          <img class="sample" src=${fileUrl(job.id, f)} alt=${`step ${s.step}`} />
          <figcaption>step ${s.step}</figcaption></figure>`))}</div>
      </div>
      <div><h2>LoRA files</h2>
        ${loras.length === 0 && html`<p class="muted">None saved yet.</p>`}
        <ul>${loras.map((l) => html`<li><a class=${l.final ? "lora final" : "lora"}
          href=${fileUrl(job.id, l.file, true)} download=${l.file}>${l.file}</a>
          <span class="muted"> ${(l.size / 1024).toFixed(0)} KiB</span></li>`)}</ul>
      </div>
    </section>
    <section><h2>Output</h2><pre class="log">${log.slice(-8000)}</pre></section>
  </div>`;
}

function Datasets() {
  const [list, setList] = useState(null);
  const [audit, setAudit] = useState(null);
  const [message, setMessage] = useState("");
  const load = () => api("GET", "/api/datasets").then(setList).catch((e) => setMessage(e.message));
  useEffect(() => { load(); }, []);
  const inspect = (name) => api("GET", `/api/datasets/${encodeURIComponent(name)}/audit`)
    .then((a) => setAudit({ name, ...a })).catch((e) => setMessage(e.message));
  const upload = async (event) => {
    const name = window.prompt("Upload into which dataset folder (a new name makes one)?",
      audit?.name || "");
    if (!name) return;
    for (const file of event.target.files) {
      try {
        await api("PUT", `/api/datasets/${encodeURIComponent(name)}/files/${encodeURIComponent(file.name)}`, file);
      } catch (err) { setMessage(`${file.name}: ${err.message}`); }
    }
    event.target.value = "";
    load();
    inspect(name);
  };
  return html`<div class="card" id="datasets" style="margin-top:1rem">
    <h2>Datasets</h2>
    ${list && html`<p class="muted">in ${list.folder}</p>`}
    <ul class="jobs">${(list?.datasets || []).map((d) => html`<li onClick=${() => inspect(d.name)}>
      <div class="row"><b>${d.name}</b><span class="muted">${d.images} images</span></div></li>`)}
    </ul>
    <label class="muted">Upload images and captions
      <input type="file" multiple accept=".png,.jpg,.jpeg,.webp,.txt" onChange=${upload} /></label>
    ${message && html`<p class="problems">${message}</p>`}
    ${audit && html`<div id="audit"><h2>${audit.name}</h2>
      <p>${`${audit.images.length} images · ${audit.missing_captions.length} without a ` +
        `caption · ${audit.unreadable.length} unreadable`}</p>
      ${audit.unreadable.map((u) => html`<p class="problems">${u.file}: ${u.reason}</p>`)}
      ${audit.missing_captions.length > 0 && html`<p class="muted">${
        `No caption: ${audit.missing_captions.join(", ")}`}</p>`}
    </div>`}
  </div>`;
}

// Shown instead of the page when the server does not know this browser (a server
// restarted since, another browser, another machine with --listen).
function SignIn({ how, message }) {
  const [token, setToken] = useState("");
  const [problem, setProblem] = useState("");
  const send = async () => {
    try { await signIn(token); window.location.reload(); }
    catch (err) { setProblem(err.message); }
  };
  return html`<main><div class="card" id="sign-in">
    <h2>Sign in</h2>
    <p>${message}</p>
    <p class="muted">On the machine that runs the server, <code>python3 -m manager
      launch</code> opens this page signed in (a one-time link).</p>
    ${how === "token" && html`<div class="actions">
      <label>Access token <input id="token" type="password" value=${token}
        onInput=${(e) => setToken(e.target.value)} /></label>
      <button id="sign-in-button" class="primary" onClick=${send}>Sign in</button></div>`}
    ${problem && html`<p class="problems">${problem}</p>`}
  </div></main>`;
}

function App() {
  const [jobs, setJobs] = useState([]);
  const [selected, setSelected] = useState(null);
  const [creating, setCreating] = useState(false);
  const [conn, setConn] = useState("connecting…");
  const [locked, setLocked] = useState(null);

  const refresh = useCallback(() => api("GET", "/api/jobs").then(setJobs), []);
  useEffect(() => {
    let source = null;
    // A 401 (never signed in, or the server restarted with a new secret) shows the
    // sign-in card; any other failure just waits for the event stream to come back.
    const check = () => refresh().then(() => true).catch((err) => {
      if (!err.signIn) { setConn(err.message); return true; }
      setLocked({ how: err.signIn, message: err.message });
      source?.close();
      return false;
    });
    check().then((signedIn) => {
      if (!signedIn) return;
      source = new EventSource(eventsUrl());
      source.addEventListener("jobs", (e) => { setJobs(JSON.parse(e.data)); setConn("live"); });
      source.onerror = () => { setConn("reconnecting…"); check(); };
    });
    return () => source?.close();
  }, []);

  const job = jobs.find((j) => j.id === selected);
  const header = html`<header><h1>aitk</h1><span>LoRA training</span>
      <span class="conn" id="conn">${locked ? "signed out" : conn}</span></header>`;
  if (locked) return html`${header}<${SignIn} ...${locked} />`;
  return html`${header}
    <main>
      <div>
        <${JobList} jobs=${jobs} selected=${creating ? null : selected}
          onSelect=${(id) => { setSelected(id); setCreating(false); }}
          onNew=${() => setCreating(true)} />
        <${Datasets} />
      </div>
      <div>
        ${creating || !job
          ? (creating || jobs.length === 0
            ? html`<${NewJob} onCreated=${(id) => { setCreating(false); setSelected(id); refresh(); }} />`
            : html`<div class="card muted">Select a job, or create a new one.</div>`)
          : html`<${JobDetail} job=${job} onDeleted=${() => { setSelected(null); refresh(); }} />`}
      </div>
    </main>`;
}

const root = document.getElementById("app");
root.textContent = "";  // the "Loading" placeholder: render() adds, it does not replace
render(html`<${App} />`, root);
