// The new-job form and the YAML: two views of one config. The page holds the YAML
// text; every form change is sent to the server (POST /api/form), which writes it into
// the text keeping the comments of the rest and reads every field back. Each input's
// `name` is its config path, the same path the trainer's problems carry.
import { h } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import htm from "htm";
import { api } from "./api.js";

const html = htm.bind(h);
const P = "config.process[0]";
const ARCH = `${P}.model.arch`;
const DATASETS = `${P}.datasets`;
const DEFAULT_EXAMPLE = "train_lora_example_cpu";

// Whether a field applies, from the arch's description and the config's own switches.
function shown(field, arch, values) {
  switch (field.when) {
    case "control": return (arch?.control_images || 0) > 0;
    case "video": return !!arch?.video;
    case "flowmatch": return !arch || arch.schedule === "flowmatch";
    case "quantize": return !!values[`${P}.model.quantize`];
    case "lokr": return values[`${P}.network.type`] === "lokr";
    case "preserve": return !!values[`${P}.train.diff_output_preservation`];
    case "ema": return !!values[`${P}.train.ema_config.use_ema`];
    default: return true;
  }
}

function parse(field, raw) {
  switch (field.kind) {
    case "int": return raw === "" ? null : Number.parseInt(raw, 10);
    case "float": return raw === "" ? null : Number(raw);
    case "ints": return raw.split(/[ ,]+/).filter(Boolean).map((v) => Number.parseInt(v, 10));
    case "lines": case "paths": return raw.split("\n").map((l) => l.trim()).filter(Boolean);
    default: return raw === "" ? null : raw;
  }
}

function shownValue(field, value) {
  if (value == null) return "";
  if (Array.isArray(value)) return value.join(field.kind === "ints" ? ", " : "\n");
  return String(value);
}

function Input({ field, path, value, archs, datasets, onEdit }) {
  const common = { name: path, id: path, onChange: (e) => onEdit(path, parse(field, e.target.value)) };
  if (field.kind === "bool") {
    return html`<input type="checkbox" name=${path} id=${path} checked=${!!value}
      onChange=${(e) => onEdit(path, e.target.checked)} />`;
  }
  if (field.kind === "arch") {
    return html`<select ...${common} value=${value || ""}>
      ${archs.map((a) => html`<option value=${a.name}>${a.name}</option>`)}</select>`;
  }
  if (field.kind === "choice") {
    return html`<select ...${common} value=${value ?? ""}>
      ${value == null && html`<option value="">(default: ${field.default ?? "none"})</option>`}
      ${field.choices.map((c) => html`<option value=${c}>${c}</option>`)}</select>`;
  }
  if (field.kind === "lines" || field.kind === "paths") {
    return html`<textarea class="small" ...${common} value=${shownValue(field, value)} />`;
  }
  const number = field.kind === "int" || field.kind === "float";
  return html`<input ...${common} type=${number ? "number" : "text"}
    step=${field.kind === "float" ? "any" : "1"} min=${field.minimum ?? undefined}
    max=${field.maximum ?? undefined} list=${field.kind === "dataset" ? "dataset-folders" : undefined}
    placeholder=${field.default != null ? String(field.default) : ""}
    value=${shownValue(field, value)} />${field.kind === "dataset" && html`<datalist id="dataset-folders">
      ${datasets.map((d) => html`<option value=${d} />`)}</datalist>`}`;
}

function Field({ field, path, values, problems, ...rest }) {
  const mine = problems.filter((p) => p.path === path || p.path.startsWith(`${path}.`) ||
    p.path.startsWith(`${path}[`));
  return html`<div class=${`field ${mine.length ? "bad" : ""}`} data-path=${path}>
    <label for=${path}>${field.label}</label>
    <${Input} field=${field} path=${path} value=${values[path]} ...${rest} />
    ${field.help && html`<small class="muted">${field.help}</small>`}
    ${mine.map((p) => html`<small class="problem">${p.message}</small>`)}
  </div>`;
}

// Problems: [{path, message}] from the schema, the confinement and `run.py --check`.
export function Problems({ errors, fields }) {
  const left = (errors || []).filter((e) => !fields || !fields.has(e.path));
  if (!left.length) return null;
  return html`<ul class="problems" id="problems">
    ${left.map((e) => html`<li>${e.path ? html`<code>${e.path}</code>: ` : ""}${e.message}</li>`)}
  </ul>`;
}

export function JobForm({ job, onSaved }) {
  const [spec, setSpec] = useState(null);
  const [examples, setExamples] = useState({});
  const [text, setText] = useState(job?.config_yaml || "");
  const [values, setValues] = useState({});
  const [view, setView] = useState("form");
  const [problems, setProblems] = useState([]);
  const [verdict, setVerdict] = useState(null);
  const [datasets, setDatasets] = useState([]);
  const [busy, setBusy] = useState(false);
  const checkTimer = useRef(null);

  // One form request at a time, each on the text the last one left (null: the
  // latest), so two quick edits never undo each other.
  const latest = useRef(text);
  const chain = useRef(Promise.resolve());
  const read = (yaml, edits = []) => {
    chain.current = chain.current.then(async () => {
      try {
        const r = await api("POST", "/api/form", { yaml: yaml ?? latest.current, edits });
        latest.current = r.yaml;
        setText(r.yaml); setValues(r.values); setProblems([]);
        scheduleCheck(r.yaml);
      } catch (err) { setProblems(err.errors || [{ path: "", message: err.message }]); }
    });
    return chain.current;
  };
  // The trainer's full preflight, a moment after the last change (as a create would).
  const scheduleCheck = (yaml) => {
    clearTimeout(checkTimer.current);
    checkTimer.current = setTimeout(async () => {
      try {
        const r = await api("POST", "/api/check", { yaml, job: job?.id });
        setVerdict(r); setProblems(r.errors || []);
      } catch { /* the next change checks again */ }
    }, 700);
  };
  useEffect(() => {
    api("GET", "/api/form").then(setSpec);
    api("GET", "/api/datasets").then((d) => setDatasets(d.datasets.map(
      (x) => `${d.folder}/${x.name}`))).catch(() => {});
    if (job) { read(job.config_yaml); return () => clearTimeout(checkTimer.current); }
    api("GET", "/api/examples").then((found) => {
      setExamples(found);
      const first = found[DEFAULT_EXAMPLE] ? DEFAULT_EXAMPLE : Object.keys(found)[0];
      if (first) read(found[first]);
    });
    return () => clearTimeout(checkTimer.current);
  }, []);

  if (!spec) return html`<div class="card muted">Loading the form…</div>`;
  const archs = spec.archs;
  const arch = archs.find((a) => a.name === values[ARCH] || a.aliases.includes(values[ARCH]));
  const count = values[DATASETS] || 0;
  const edit = (path, value) => read(null, [{ path, value }]);
  const pickArch = (path, name) => {
    const chosen = archs.find((a) => a.name === name);
    const edits = [{ path, value: name }];
    for (const [at, value] of Object.entries(chosen?.defaults_at || {})) {
      if (at.includes("[*]")) {
        for (let i = 0; i < count; i++) edits.push({ path: at.replace("[*]", `[${i}]`), value });
      } else edits.push({ path: at, value });
    }
    read(null, edits);
  };
  const concrete = [];
  for (const f of spec.fields) {
    if (!shown(f, arch, values)) continue;
    if (f.path.includes("[*]")) {
      for (let i = 0; i < count; i++) concrete.push([f, f.path.replace("[*]", `[${i}]`), i]);
    } else concrete.push([f, f.path, null]);
  }
  const fieldPaths = new Set(concrete.map(([, p]) => p));
  const groups = [...new Set(spec.fields.map((f) => f.group))];
  const save = async () => {
    setBusy(true);
    try {
      await chain.current;  // the last form edit is in the text
      const yaml = latest.current;
      const r = job ? await api("PUT", `/api/jobs/${job.id}/config`, { yaml })
        : await api("POST", "/api/jobs", { yaml });
      onSaved(r.id);
    } catch (err) {
      setProblems(err.errors || [{ path: "", message: err.message }]);
    } finally { setBusy(false); }
  };
  const fieldProps = { values, problems, archs, datasets };

  return html`<div class="card" id="job-form">
    <h2>${job ? `Edit ${job.name}` : "New job"}</h2>
    ${!job && html`<div class="actions"><label>Start from
      <select id="example" onChange=${(e) => read(examples[e.target.value])}>
        ${Object.keys(examples).map((n) => html`<option value=${n}
          selected=${n === DEFAULT_EXAMPLE}>${n}</option>`)}</select></label></div>`}
    <div class="tabs">
      <button id="form-tab" class=${view === "form" ? "on" : ""}
        onClick=${() => setView("form")}>Form</button>
      <button id="yaml-tab" class=${view === "yaml" ? "on" : ""}
        onClick=${() => setView("yaml")}>YAML</button>
    </div>
    ${view === "yaml" ? html`<textarea id="yaml" value=${text}
        onInput=${(e) => { latest.current = e.target.value; setText(e.target.value); }}
        onBlur=${(e) => read(e.target.value)} />`
      : html`<div id="form-fields">
      ${arch && html`<p class="muted" id="arch-summary">${arch.summary} · sides a multiple of
        ${arch.size_multiple}${arch.video ? " · video" : ""}${arch.control_images
          ? ` · edits with ${arch.control_images} control image(s)` : ""}</p>`}
      ${groups.map((g) => html`<fieldset><legend>${g}</legend>
        ${g === "Datasets" && html`<div class="actions">
          <button id="add-dataset" onClick=${() => read(null, [{ path: `${DATASETS}[${count}]`,
            value: { folder_path: datasets[0] || "datasets/NAME", caption_ext: "txt" } }])}>
            Add a dataset</button>
          ${count > 1 && html`<button onClick=${() => read(null, [{ path:
            `${DATASETS}[${count - 1}]`, remove: true }])}>Remove the last</button>`}</div>`}
        ${concrete.filter(([f]) => f.group === g).map(([f, path]) => html`<${Field}
          field=${f} path=${path} ...${fieldProps}
          onEdit=${f.kind === "arch" ? pickArch : edit} />`)}
        ${g === "Memory" && verdict?.memory && html`<p class="muted" id="memory">
          ${verdict.memory.fits === false ? "Does not fit: " : "Fits: "}
          ${(verdict.memory.hints || []).join("; ")}</p>`}
      </fieldset>`)}
    </div>`}
    <${Problems} errors=${problems} fields=${view === "form" ? fieldPaths : null} />
    ${verdict?.ok && !problems.length && html`<p class="ok" id="check-ok">The trainer's
      check passes.</p>`}
    ${(verdict?.notes || []).map((n) => html`<p class="muted">${n.level}: ${n.path} ${n.message}</p>`)}
    <div class="actions">
      <button id="create" class="primary" disabled=${busy} onClick=${save}>
        ${job ? "Save" : "Create"}</button>
    </div>
  </div>`;
}
