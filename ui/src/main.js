// The aitk web UI: Jobs (the list, one job, the job form), Datasets and Settings, with
// the machine's monitor in the header. Preact + htm: components without a JSX compile
// step; esbuild only bundles.
import { h, render } from "preact";
import { useEffect, useState, useCallback } from "preact/hooks";
import htm from "htm";
import { api, eventsUrl, signIn } from "./api.js";
import { JobForm } from "./form.js";
import { JobDetail, JobList, fmtTime } from "./jobs.js";
import { Datasets } from "./datasets.js";
import { Settings } from "./settings.js";

// A job's state is the server's word: it sends `active` (its trainer lives) and
// `actions` (what the state allows), and the buttons follow them; no state list here.
const html = htm.bind(h);
const GiB = 2 ** 30;

function Monitor() {
  const [now, setNow] = useState(null);
  useEffect(() => {
    const poll = () => api("GET", "/api/machine").then(setNow).catch(() => {});
    poll();
    const timer = setInterval(poll, 3000);
    return () => clearInterval(timer);
  }, []);
  if (!now) return null;
  const gib = (b) => (b == null ? "?" : (b / GiB).toFixed(1));
  return html`<span class="monitor" id="monitor">
    ${now.gpus.map((g) => html`<span class="gpu">GPU${g.index} ${gib(g.memory_used_bytes)}/${
      gib(g.memory_total_bytes)} GiB${g.utilization_pct != null ? ` ${g.utilization_pct}%` : ""}${
      g.temperature_c != null ? ` ${g.temperature_c}°C` : ""}</span>`)}
    <span>CPU ${now.cpu_pct ?? "?"}%</span>
    <span>RAM ${gib(now.ram_used_bytes)}/${gib(now.ram_total_bytes)} GiB</span>
  </span>`;
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
  const [mode, setMode] = useState("view"); // view | new | edit
  const [page, setPage] = useState("jobs");
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

  // The running job's phase, step and ETA in the page title (seen from another tab).
  const running = jobs.find((j) => j.active);
  useEffect(() => {
    const p = running?.progress || {};
    document.title = running ? `${p.phase_text || "starting"} ${p.step ?? 0}/${
      p.total_steps ?? "?"}${p.eta_s != null ? ` · ${fmtTime(p.eta_s)}` : ""} · aitk` : "aitk";
  }, [running?.progress?.step, running?.progress?.phase, running?.id]);

  const job = jobs.find((j) => j.id === selected);
  const show = (id) => { setSelected(id); setMode("view"); refresh(); };
  const nav = (name, label) => html`<button class=${`nav ${page === name ? "on" : ""}`}
    id=${`nav-${name}`} onClick=${() => setPage(name)}>${label}</button>`;
  const header = html`<header><h1>aitk</h1>
      ${!locked && html`<nav>${nav("jobs", "Jobs")}${nav("datasets", "Datasets")}${
        nav("settings", "Settings")}</nav>`}
      ${!locked && html`<${Monitor} />`}
      <span class="conn" id="conn">${locked ? "signed out" : conn}</span></header>`;
  if (locked) return html`${header}<${SignIn} ...${locked} />`;
  if (page === "datasets") return html`${header}<${Datasets} />`;
  if (page === "settings") return html`${header}<${Settings} />`;
  let right;
  if (mode === "new" || (!job && jobs.length === 0)) {
    right = html`<${JobForm} key="new" onSaved=${show} />`;
  } else if (mode === "edit" && job) {
    right = html`<${JobForm} key=${`edit-${job.id}`} job=${job} onSaved=${show} />`;
  } else if (job) {
    right = html`<${JobDetail} job=${job} onDeleted=${() => show(null)}
      onEdit=${() => api("GET", `/api/jobs/${job.id}`).then((full) => {
        setJobs((all) => all.map((j) => (j.id === full.id ? { ...j, ...full } : j)));
        setMode("edit");
      })} onCopied=${show} />`;
  } else right = html`<div class="card muted">Select a job, or make a new one.</div>`;
  return html`${header}
    <main>
      <div><${JobList} jobs=${jobs} selected=${mode === "new" ? null : selected}
        onSelect=${(id) => { setSelected(id); setMode("view"); }}
        onNew=${() => setMode("new")} /></div>
      <div>${right}</div>
    </main>`;
}

const root = document.getElementById("app");
root.textContent = "";  // the "Loading" placeholder: render() adds, it does not replace
render(html`<${App} />`, root);
