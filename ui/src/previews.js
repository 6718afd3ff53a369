// The previews per prompt across steps: a slider over the steps of each prompt, the
// prompt and seed it was made with, full size on click (an animated WebP plays); a
// preview with sound (LTX-2) also plays as its mp4 below the picture.
import { h } from "preact";
import { useState } from "preact/hooks";
import htm from "htm";
import { fileUrl } from "./api.js";

const html = htm.bind(h);

function Prompt({ jobId, prompt, onOpen }) {
  const steps = prompt.steps;
  const [at, setAt] = useState(null);
  const index = at == null || at >= steps.length ? steps.length - 1 : at;
  const shown = steps[index];
  return html`<figure class="preview" data-prompt=${prompt.index}>
    ${shown ? html`<img class="sample" src=${fileUrl(jobId, shown.file)}
        alt=${`step ${shown.step}`} onClick=${() => onOpen(fileUrl(jobId, shown.file))} />`
      : html`<div class="muted">none yet</div>`}
    ${shown?.sound && html`<video class="sound" controls preload="none"
        src=${fileUrl(jobId, shown.sound)}></video>`}
    <figcaption>
      <div class="prompt">${prompt.prompt ?? `prompt ${prompt.index + 1}`}</div>
      <div class="muted">seed ${prompt.seed ?? "–"} · step <b class="shown-step">${shown?.step ?? "–"}</b></div>
      ${steps.length > 1 && html`<input type="range" class="steps" min="0"
        max=${steps.length - 1} value=${index} onInput=${(e) => setAt(Number(e.target.value))} />`}
    </figcaption>
  </figure>`;
}

export function Previews({ jobId, prompts }) {
  const [open, setOpen] = useState(null);
  if (!prompts.some((p) => p.steps.length)) return html`<p class="muted">No previews yet.</p>`;
  return html`<div class="previews" id="previews">
    ${prompts.map((p) => html`<${Prompt} key=${p.index} jobId=${jobId} prompt=${p} onOpen=${setOpen} />`)}
    ${open && html`<div class="lightbox" id="lightbox" onClick=${() => setOpen(null)}>
      <img src=${open} alt="full size" /></div>`}
  </div>`;
}
