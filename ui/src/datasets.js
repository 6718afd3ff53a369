// The dataset manager: make a dataset, drop pictures, clips and captions on it (each
// upload with its progress), edit a caption in place (saved atomically by the server),
// rename or delete a file (into a trash it can be restored from), the trainer's audit
// per file, the whole dataset as a zip.
import { h } from "preact";
import { useEffect, useState } from "preact/hooks";
import htm from "htm";
import { api, datasetUrl, upload } from "./api.js";

const html = htm.bind(h);
const ACCEPT = ".png,.jpg,.jpeg,.webp,.mp4,.webm,.mov,.mkv,.txt";
const IMAGE = /\.(png|jpe?g|webp)$/i;

function Caption({ dataset, item, onSaved }) {
  const [text, setText] = useState(item.caption ?? "");
  const [state, setState] = useState("");
  useEffect(() => setText(item.caption ?? ""), [item.caption]);
  const save = async () => {
    if (text === (item.caption ?? "")) return;
    setState("saving…");
    try {
      await api("PUT", datasetUrl(dataset, "captions", item.file), { text });
      setState("saved"); onSaved();
    } catch (err) { setState(err.message); }
  };
  return html`<div><textarea class="caption" name=${`caption:${item.file}`} value=${text}
      placeholder="no caption yet" onInput=${(e) => setText(e.target.value)}
      onBlur=${save} />
    <small class="muted">${state}</small></div>`;
}

function Tile({ dataset, item, findings, onChanged, setMessage }) {
  const [renaming, setRenaming] = useState(false);
  const [name, setName] = useState(item.file.replace(/\.[^.]+$/, ""));
  const rename = async () => {
    try {
      await api("POST", `${datasetUrl(dataset, "files", item.file)}/rename`, { to: name });
      setRenaming(false); onChanged();
    } catch (err) { setMessage(err.message); }
  };
  const remove = async () => {
    try { await api("DELETE", datasetUrl(dataset, "files", item.file)); onChanged(); }
    catch (err) { setMessage(err.message); }
  };
  return html`<figure class="tile" data-file=${item.file}>
    ${IMAGE.test(item.file)
      ? html`<a href=${datasetUrl(dataset, "files", item.file)} target="_blank">
          <img class="thumb" src=${datasetUrl(dataset, "thumbs", item.file)} alt=${item.file} /></a>`
      : html`<video class="thumb" src=${datasetUrl(dataset, "files", item.file)} controls muted />`}
    <figcaption>${renaming
      ? html`<input value=${name} onInput=${(e) => setName(e.target.value)} />
          <button onClick=${rename}>OK</button>`
      : html`<b>${item.file}</b>`}
      ${item.width ? html` <span class="muted">${item.width}×${item.height}</span>` : ""}</figcaption>
    <${Caption} dataset=${dataset} item=${item} onSaved=${onChanged} />
    ${(findings || []).map((f) => html`<small class=${`finding ${f.level}`}>${f.message}</small>`)}
    <div class="actions">
      <button onClick=${() => setRenaming(!renaming)}>Rename</button>
      <button class="danger delete-file" onClick=${remove}>Delete</button>
    </div>
  </figure>`;
}

// Caption the dataset with a vision-language model, as a run with progress; existing
// captions are kept unless "replace" is ticked.
function Captioning({ name, onDone }) {
  const [model, setModel] = useState(localStorage.getItem("aitk-caption-model") || "");
  const [trigger, setTrigger] = useState("");
  const [prompt, setPrompt] = useState("");
  const [overwrite, setOverwrite] = useState(false);
  const [run, setRun] = useState(null);
  const [message, setMessage] = useState("");
  useEffect(() => { // this dataset's latest run, of this server start or an earlier one
    api("GET", "/api/captioning").then((all) => setRun(all.find((r) => r.dataset === name)
      || null)).catch(() => {});
  }, [name]);
  useEffect(() => {
    if (!run?.running) return undefined;
    const timer = setInterval(async () => {
      const all = await api("GET", "/api/captioning").catch(() => []);
      const now = all.find((r) => r.id === run.id);
      if (now) { setRun(now); if (!now.running) onDone(); }
    }, 700);
    return () => clearInterval(timer);
  }, [run?.id, run?.running]);
  const start = async () => {
    setMessage("");
    localStorage.setItem("aitk-caption-model", model);
    try {
      setRun(await api("POST", datasetUrl(name, "caption"), {
        model, trigger: trigger || null, prompt: prompt || null, overwrite }));
    } catch (err) { setMessage(err.message); }
  };
  const stop = () => api("POST", `/api/captioning/${run.id}/stop`).then(setRun)
    .catch((e) => setMessage(e.message));
  return html`<details class="captioning" id="captioning" open=${!!run}>
    <summary>Caption with a vision-language model</summary>
    <div class="actions">
      <input id="caption-model" placeholder="model folder or Qwen/Qwen2.5-VL-3B-Instruct"
        value=${model} onInput=${(e) => setModel(e.target.value)} size="40" />
      <input id="caption-trigger" placeholder="trigger word (prefix)" value=${trigger}
        onInput=${(e) => setTrigger(e.target.value)} />
      <input id="caption-prompt" placeholder="instruction (optional)" value=${prompt}
        onInput=${(e) => setPrompt(e.target.value)} size="30" />
      <label><input type="checkbox" checked=${overwrite}
        onChange=${(e) => setOverwrite(e.target.checked)} /> replace existing captions</label>
      <button id="caption-start" class="primary" disabled=${!model || run?.running}
        onClick=${start}>Caption</button>
      ${run?.running && html`<button onClick=${stop}>Stop</button>`}
    </div>
    ${run && html`<div id="caption-progress">${run.phase}: ${run.done ?? 0} / ${run.total ?? "?"}
      ${run.message ? ` · ${run.message}` : ""}
      <div class="bar"><div style=${`width:${run.total ? Math.round(100 * run.done / run.total)
        : 0}%`}></div></div></div>`}
    ${(message || run?.error) && html`<p class="problems">${message || run.error}</p>`}
  </details>`;
}

// Edit models: each target with its control image(s) from another dataset (by default
// NAME_control), paired by file name as the trainer pairs them; what has no partner is
// flagged, since the trainer skips it.
function Controls({ name, tick }) {
  const [chosen, setChosen] = useState(null); // null: the server's default; "": none
  const [found, setFound] = useState(null);
  const [candidates, setCandidates] = useState([]);
  const [message, setMessage] = useState("");
  useEffect(() => setChosen(null), [name]);
  useEffect(() => {
    setMessage("");
    if (chosen === "") { setFound(null); return; }
    const query = chosen == null ? "" : `?control=${encodeURIComponent(chosen)}`;
    api("GET", `${datasetUrl(name, "pairs")}${query}`)
      .then((r) => { setFound(r); setCandidates(r.candidates); })
      .catch((e) => { setFound(null); setMessage(e.message); });
  }, [name, chosen, tick]);
  const control = found?.controls[0];
  const thumb = (dataset, file) => html`<img class="thumb pair-thumb" alt=${file}
    src=${datasetUrl(dataset, "thumbs", file)} />`;
  return html`<details class="controls" id="controls" open=${!!control}>
    <summary>Control images (edit models)</summary>
    <label>control dataset <select id="control-dataset" value=${chosen ?? control ?? ""}
        onChange=${(e) => setChosen(e.target.value)}>
      <option value="">none</option>
      ${candidates.map((c) => html`<option value=${c}>${c}</option>`)}
    </select></label>
    ${message && html`<p class="problems">${message}</p>`}
    ${control && html`<p id="pairing">${found.pairs.length - found.missing_control.length} paired ·
      ${found.missing_control.length} without a control ·
      ${found.unpaired[control].length} controls without a target</p>
    ${found.links_out.map((f) => html`<p class="problems">${f}: a link out of the datasets folder: not read</p>`)}
    ${found.shadowed[control].map((f) => html`<p class="finding warning">${control}/${f}: another file of this name comes first; not used</p>`)}
    <div class="tiles">
      ${found.pairs.map((p) => html`<figure class="tile pair" data-target=${p.target}>
        <div class="row">${thumb(name, p.target)}
          ${p.controls[0] ? thumb(control, p.controls[0])
            : html`<span class="problems no-control">no control</span>`}</div>
        <figcaption><b>${p.target}</b> ← ${p.controls[0] ?? "–"}</figcaption></figure>`)}
      ${found.unpaired[control].map((f) => html`<figure class="tile pair unpaired" data-control=${f}>
        ${thumb(control, f)}<figcaption class="problems">${f}: no target image</figcaption></figure>`)}
    </div>`}
  </details>`;
}

function Dataset({ name, onChanged }) {
  const [audit, setAudit] = useState(null);
  const [trash, setTrash] = useState([]);
  const [uploads, setUploads] = useState({});
  const [message, setMessage] = useState("");
  const [over, setOver] = useState(false);
  const load = () => {
    api("GET", datasetUrl(name, "audit")).then(setAudit).catch((e) => setMessage(e.message));
    api("GET", datasetUrl(name, "trash")).then(setTrash).catch(() => {});
  };
  useEffect(() => { setAudit(null); load(); }, [name]);
  const send = async (files) => {
    for (const file of files) {
      try {
        await upload(datasetUrl(name, "files", file.name), file,
          (f) => setUploads((u) => ({ ...u, [file.name]: f })));
      } catch (err) { setMessage(`${file.name}: ${err.message}`); }
      setUploads((u) => { const { [file.name]: _, ...rest } = u; return rest; });
    }
    load(); onChanged();
  };
  const restore = async (entry) => {
    try { await api("POST", `${datasetUrl(name, "trash")}/${entry}/restore`); load(); onChanged(); }
    catch (err) { setMessage(err.message); }
  };
  const changed = () => { load(); onChanged(); };
  const findings = audit?.findings || {};
  return html`<div class="card" id="dataset" data-name=${name}>
    <h2>${name} <a class="muted" id="zip" href=${datasetUrl(name, "zip")}
      download=${`${name}.zip`}>download as zip</a></h2>
    <div class=${`drop ${over ? "over" : ""}`} id="drop"
      onDragOver=${(e) => { e.preventDefault(); setOver(true); }}
      onDragLeave=${() => setOver(false)}
      onDrop=${(e) => { e.preventDefault(); setOver(false); send([...e.dataTransfer.files]); }}>
      Drop pictures, clips and captions here, or
      <input type="file" id="upload" multiple accept=${ACCEPT}
        onChange=${(e) => { send([...e.target.files]); e.target.value = ""; }} />
    </div>
    ${Object.entries(uploads).map(([file, f]) => html`<div class="upload">${file}
      <div class="bar"><div style=${`width:${Math.round(100 * f)}%`}></div></div></div>`)}
    ${message && html`<p class="problems" id="dataset-message">${message}</p>`}
    <${Captioning} name=${name} onDone=${() => { load(); onChanged(); }} />
    <${Controls} name=${name} tick=${audit} />
    ${audit && html`<p id="audit">${`${audit.images.length} images · ` +
      `${audit.missing_captions.length} without a caption · ${audit.unreadable.length} unreadable`}</p>`}
    ${(findings[""] || []).map((f) => html`<p class=${`finding ${f.level}`}>${f.message}</p>`)}
    ${audit?.unreadable.map((u) => html`<p class="problems">${u.file}: ${u.reason}</p>`)}
    <div class="tiles">${[...(audit?.images || []), ...(audit?.videos || [])].map((item) => html`<${Tile} key=${item.file}
      dataset=${name} item=${item} findings=${findings[item.file]} onChanged=${changed}
      setMessage=${setMessage} />`)}</div>
    ${trash.length > 0 && html`<section id="trash"><h2>Trash</h2><ul>
      ${trash.map((t) => html`<li>${t.files.join(", ")}
        <button class="restore" onClick=${() => restore(t.entry)}>Restore</button></li>`)}
    </ul></section>`}
  </div>`;
}

export function Datasets() {
  const [list, setList] = useState(null);
  const [selected, setSelected] = useState(null);
  const [name, setName] = useState("");
  const [message, setMessage] = useState("");
  const load = () => api("GET", "/api/datasets").then(setList).catch((e) => setMessage(e.message));
  useEffect(() => { load(); }, []);
  const create = async () => {
    try {
      await api("POST", "/api/datasets", { name });
      setSelected(name); setName(""); setMessage(""); load();
    } catch (err) { setMessage(err.message); }
  };
  return html`<main>
    <div class="card" id="datasets">
      <h2>Datasets</h2>
      ${list && html`<p class="muted">in ${list.folder}</p>`}
      <div class="actions"><input id="dataset-name" placeholder="new dataset name" value=${name}
        onInput=${(e) => setName(e.target.value)} />
        <button id="create-dataset" class="primary" disabled=${!name}
          onClick=${create}>Create</button></div>
      ${message && html`<p class="problems">${message}</p>`}
      <ul class="jobs">${(list?.datasets || []).map((d) => html`<li key=${d.name}
        data-dataset=${d.name} class=${d.name === selected ? "sel" : ""}
        onClick=${() => setSelected(d.name)}>
        <div class="row"><b>${d.name}</b><span class="muted">${d.images} images</span></div></li>`)}
      </ul>
    </div>
    <div>${selected ? html`<${Dataset} name=${selected} onChanged=${load} />`
      : html`<div class="card muted">Make a dataset or pick one.</div>`}</div>
  </main>`;
}
