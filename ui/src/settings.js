// The settings page: the Hugging Face token (stored owner-only by the server and never
// shown back: the page only learns whether one is set) and the server's folders.
import { h } from "preact";
import { useEffect, useState } from "preact/hooks";
import htm from "htm";
import { api } from "./api.js";

const html = htm.bind(h);

export function Settings() {
  const [shown, setShown] = useState(null);
  const [token, setToken] = useState("");
  const [message, setMessage] = useState("");
  useEffect(() => { api("GET", "/api/settings").then(setShown); }, []);
  const store = async (value) => {
    try {
      setShown(await api("PUT", "/api/settings", { hf_token: value }));
      setToken(""); setMessage(value ? "stored" : "forgotten");
    } catch (err) { setMessage(err.message); }
  };
  if (!shown) return html`<main><div class="card muted">Loading…</div></main>`;
  return html`<main class="single"><div class="card" id="settings">
    <h2>Settings</h2>
    <h3>Hugging Face token</h3>
    <p class="muted" id="token-state">${shown.hf_token_set ? "A token is stored (owner-only); " +
      "jobs get it as HF_TOKEN." : "No token stored: gated models cannot download."}</p>
    <div class="actions"><input id="hf-token" type="password" autocomplete="off"
      placeholder="hf_…" value=${token} onInput=${(e) => setToken(e.target.value)} />
      <button id="store-token" class="primary" disabled=${!token}
        onClick=${() => store(token)}>Store</button>
      ${shown.hf_token_set && html`<button onClick=${() => store("")}>Forget it</button>`}</div>
    ${message && html`<p class="muted" id="settings-message">${message}</p>`}
    <h3>Folders</h3>
    <dl><dt>Datasets</dt><dd>${shown.datasets_dir}</dd>
      <dt>Outputs root (jobs write only under it)</dt><dd>${shown.outputs_dir}</dd>
      <dt>Server data</dt><dd>${shown.data_dir}</dd>
      <dt>Extra allowed host names</dt><dd>${shown.allowed_hosts.join(", ") || "none"}</dd></dl>
    <p class="muted">The folders and host names are the server's start options:
      <code>.venv/bin/python -m aitk_server --datasets-dir DIR --outputs-dir DIR
      --allowed-host NAME</code>.</p>
  </div></main>`;
}
