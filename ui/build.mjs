// Bundle src/ into dist/ (git-ignored): one minified app.js, index.html and style.css.
// Built into dist.tmp and swapped in, so a failed build never leaves half a UI.
import { build } from "esbuild";
import { cpSync, existsSync, mkdirSync, renameSync, rmSync } from "node:fs";

const out = "dist.tmp";
rmSync(out, { recursive: true, force: true });
mkdirSync(out);
await build({
  entryPoints: ["src/main.js"],
  bundle: true,
  minify: true,
  format: "esm",
  target: "es2020",
  outfile: `${out}/app.js`,
  logLevel: "warning",
});
cpSync("src/index.html", `${out}/index.html`);
cpSync("src/style.css", `${out}/style.css`);
if (existsSync("dist")) rmSync("dist", { recursive: true, force: true });
renameSync(out, "dist");
