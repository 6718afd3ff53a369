// The loss log as an SVG line (raw loss, faint, and a moving average): no chart library.
import { h } from "preact";
import htm from "htm";

const html = htm.bind(h);
const W = 600, H = 180, PAD = 28;

function smooth(points, k = 10) {
  return points.map((p, i) => {
    const win = points.slice(Math.max(0, i - k + 1), i + 1);
    return [p[0], win.reduce((s, q) => s + q[1], 0) / win.length];
  });
}

export function LossChart({ points }) {
  if (!points || points.length < 1) {
    return html`<p class="muted" id="loss-chart-empty">No loss logged yet.</p>`;
  }
  const steps = points.map((p) => p[0]), losses = points.map((p) => p[1]);
  const x0 = Math.min(...steps), x1 = Math.max(...steps, x0 + 1);
  const y0 = Math.min(...losses), y1 = Math.max(...losses, y0 + 1e-9);
  const x = (s) => PAD + ((s - x0) / (x1 - x0)) * (W - 2 * PAD);
  const y = (l) => H - PAD + 8 - ((l - y0) / (y1 - y0)) * (H - 2 * PAD);
  const line = (pts) => pts.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
  const mid = (y0 + y1) / 2;
  return html`<div class="chart-box">
    <div class="chart-frame">
      <div class="y-axis muted"><span>${y1.toFixed(3)}</span><span>${mid.toFixed(3)}</span>
        <span>${y0.toFixed(3)}</span></div>
      <svg class="chart" id="loss-chart" viewBox=${`0 0 ${W} ${H}`} preserveAspectRatio="none">
        ${[0.25, 0.5, 0.75].map((f) => html`<line x1=${PAD} x2=${W - PAD}
          y1=${y(y0 + f * (y1 - y0))} y2=${y(y0 + f * (y1 - y0))} stroke="#e1e5ec"
          vector-effect="non-scaling-stroke" />`)}
        <polyline points=${line(points)} fill="none" stroke="#9db7ea" stroke-width="1"
          vector-effect="non-scaling-stroke" />
        <polyline points=${line(smooth(points))} fill="none" stroke="#2f6fde" stroke-width="2"
          vector-effect="non-scaling-stroke" />
      </svg>
    </div>
    <div class="x-axis muted"><span>step ${x0}</span><span>loss by step (light: raw, dark:
      moving average; ${points.length} points)</span><span>step ${x1}</span></div>
  </div>`;
}
