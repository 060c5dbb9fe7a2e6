#!/usr/bin/env node
// Times the JavaScript implementation (@lenml/tokenizers) encoding the Brown
// corpus on one thread, one encode() call per corpus file (500 documents of
// about 12 KB); optionally writes the documents it used as a JSON array (so the
// C++ benchmark encodes the same bytes). Prints one JSON line.
//   node tools/tokenizer/bench_js.js [--docs-out FILE] [--runs N]
"use strict";
const fs = require("fs");
const { loadOracle, brownFiles } = require("./oracle.js");

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
const docs = brownFiles().map((f) => f.text);
const out = opt("--docs-out", null);
if (out) fs.writeFileSync(out, JSON.stringify(docs));
const runs = Number(opt("--runs", "3"));
const bytes = docs.reduce((s, d) => s + Buffer.byteLength(d, "utf8"), 0);
const tok = loadOracle();
for (const d of docs.slice(0, 20)) tok.encode(d, { add_special_tokens: false });  // warm-up (JIT)
let best = Infinity, ids = 0;
for (let r = 0; r < runs; ++r) {
  tok.model.clear_cache?.();  // each run starts with an empty BPE cache, like the C++ side (which has none)
  ids = 0;
  const t0 = process.hrtime.bigint();
  for (const d of docs) ids += tok.encode(d, { add_special_tokens: false }).length;
  const dt = Number(process.hrtime.bigint() - t0) / 1e9;
  best = Math.min(best, dt);
}
console.log(JSON.stringify({ impl: "js @lenml/tokenizers 3.7.2", node: process.version, bytes, ids, best_s: best,
  mb_per_s: bytes / 1e6 / best }));
