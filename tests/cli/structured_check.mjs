// Helper of structured_tiny.sh. `make DATA N OUT`: one `deepinfer generate` line per
// (constraint, seed) for the constraints in DATA (tests/data/structured/acceptance.json).
// `check DATA N RESULTS`: every output must end with finish_reason "stop" and satisfy
// its constraint, checked independently of the engine: ajv (+ ajv-formats) for the JSON
// schemas, JavaScript RegExp for the regexes, hand-written checkers for the grammars.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const [mode, dataPath, nStr, file] = process.argv.slice(2);
const require = createRequire(path.join(process.env.DEEPINFER_NPM_DIR, 'package.json'));
const data = JSON.parse(fs.readFileSync(dataPath, 'utf8'));
const n = Number(nStr);
const constraints = [
  ...data.schemas.map((s) => ({ kind: 'schema', field: { guided_json: s }, value: s })),
  ...data.regexes.map((r) => ({ kind: 'regex', field: { guided_regex: r }, value: r })),
  ...data.grammars.map((g, i) => ({ kind: `grammar${i}`, field: { guided_grammar: g }, value: g })),
];

if (mode === 'make') {
  const lines = [];
  constraints.forEach((c, k) => {
    for (let s = 0; s < n; ++s)
      lines.push(JSON.stringify({ prompt: 'Output:', max_tokens: 400, temperature: 1, seed: 1000 * k + s, ...c.field }));
  });
  fs.writeFileSync(file, lines.join('\n') + '\n');
  process.exit(0);
}

const Ajv = require('ajv').default;
const addFormats = require('ajv-formats').default;
const ajv = new Ajv({ strict: true, allErrors: false });
addFormats(ajv);

// Independent checkers of the three GBNF grammars' languages.
function arith(s) {  // expr ::= term ([-+*] term){0,4}; term ::= [0-9]{1,3} | "(" expr ")"
  let i = 0;
  const term = () => {
    if (s[i] === '(') { ++i; if (!expr()) return false; if (s[i] !== ')') return false; ++i; return true; }
    const m = /^[0-9]{1,3}/.exec(s.slice(i));
    if (!m) return false;
    i += m[0].length;
    return !/^[0-9]/.test(s.slice(i));
  };
  const expr = () => {
    if (!term()) return false;
    let k = 0;
    while ('+-*'.includes(s[i]) && s[i] !== undefined) { if (++k > 4) return false; ++i; if (!term()) return false; }
    return true;
  };
  return expr() && i === s.length;
}
const grammarCheck = [
  arith,
  (s) => /^[a-z]{1,6}=[0-9]{1,4}(; [a-z]{1,6}=[0-9]{1,4}){0,3}$/.test(s),
  (s) => /^\[((("[a-z]{1,5}"|[0-9]{1,3}|true|false))(, ("[a-z]{1,5}"|[0-9]{1,3}|true|false)){0,4})?\]$/.test(s),
];

const results = fs.readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
if (results.length !== constraints.length * n) { console.error(`expected ${constraints.length * n} results, got ${results.length}`); process.exit(1); }
let bad = 0;
const summary = [];
constraints.forEach((c, k) => {
  const validate = c.kind === 'schema' ? ajv.compile(c.value) : null;
  let ok = 0, tokens = 0;
  for (let s = 0; s < n; ++s) {
    const r = results[k * n + s];
    let why = null;
    if (r.error) why = `error ${r.error}`;
    else if (r.finish_reason !== 'stop') why = `finish_reason ${r.finish_reason}`;
    else if (c.kind === 'schema') {
      let v;
      try { v = JSON.parse(r.text); } catch (e) { why = `not JSON: ${e.message}`; }
      if (!why && !validate(v)) why = `schema: ${ajv.errorsText(validate.errors)}`;
    } else if (c.kind === 'regex') {
      if (!new RegExp(`^(?:${c.value})$`, 'u').test(r.text)) why = 'regex does not match';
    } else if (!grammarCheck[Number(c.kind.slice(7))](r.text)) {
      why = 'grammar checker rejects';
    }
    if (why) { if (bad < 10) console.error(`constraint ${k} (${c.kind}) seed ${s}: ${why}: ${JSON.stringify(r.text)}`); ++bad; }
    else ++ok;
    tokens += r.completion_tokens || 0;
  }
  summary.push(`${c.kind}#${k}: ${ok}/${n} valid, ${(tokens / n).toFixed(1)} tokens avg`);
});
console.log(summary.join('\n'));
if (bad) { console.error(`${bad} invalid outputs`); process.exit(1); }
console.log(`all ${results.length} outputs valid`);
