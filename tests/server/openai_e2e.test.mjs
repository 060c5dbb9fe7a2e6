// End-to-end tests of `deepinfer serve` with the official `openai` npm client
// as a real client. Started by tests/cli/server_e2e.sh, which runs the server
// on the tiny checkpoint (random weights: the text is gibberish, but it is a
// deterministic function of prompt, parameters and seed) with
//   --served-model-name tiny --api-key $DEEPINFER_API_KEY --max-model-len 256
//   --max-num-seqs 16 --max-request-bytes 1000000
// Environment: DEEPINFER_URL (http://127.0.0.1:PORT), DEEPINFER_API_KEY,
// DEEPINFER_NPM_DIR (tools/npm, where the npm packages are installed).
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { execFileSync } from 'node:child_process';
import path from 'node:path';

const require = createRequire(path.join(process.env.DEEPINFER_NPM_DIR, 'package.json'));
const { default: OpenAI } = await import(require.resolve('openai'));
const parsePrometheus = require('parse-prometheus-text-format');

const URL_BASE = process.env.DEEPINFER_URL;
const API_KEY = process.env.DEEPINFER_API_KEY;
const MAX_MODEL_LEN = 256;
const client = new OpenAI({ baseURL: `${URL_BASE}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 300_000 });
const AUTH = { Authorization: `Bearer ${API_KEY}` };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function post(pathname, body, headers = {}) {
  const r = await fetch(URL_BASE + pathname, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...AUTH, ...headers },
    body: typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, json, text };
}

// ---------------------------------------------------------------------------
// Prometheus text: the npm parser (parse-prometheus-text-format) plus a strict
// line grammar check (exposition format 0.0.4), since that parser is lenient.
const NAME = '[a-zA-Z_:][a-zA-Z0-9_:]*';
const LABEL = '[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\\\\n]|\\\\[\\\\"n])*"';
const SAMPLE_RE = new RegExp(`^(${NAME})(\\{(?:${LABEL})(?:,${LABEL})*\\})? (NaN|[+-]Inf|[-+]?[0-9]*\\.?[0-9]+(?:[eE][-+]?[0-9]+)?)$`);
const HELP_RE = new RegExp(`^# HELP (${NAME}) .*$`);
const TYPE_RE = new RegExp(`^# TYPE (${NAME}) (counter|gauge|histogram|summary|untyped)$`);

function parseMetrics(text) {
  assert.ok(text.endsWith('\n'), 'exposition text ends with a newline');
  const samples = new Map();  // "name{labels}" -> value
  const types = new Map();
  for (const line of text.slice(0, -1).split('\n')) {
    let m;
    if ((m = TYPE_RE.exec(line))) { types.set(m[1], m[2]); continue; }
    if (HELP_RE.test(line)) continue;
    m = SAMPLE_RE.exec(line);
    assert.ok(m, `invalid exposition line: ${JSON.stringify(line)}`);
    samples.set(m[1] + (m[2] || ''), Number(m[3]));
  }
  const families = parsePrometheus(text);
  const byName = new Map(families.map((f) => [f.name, f]));
  return { samples, types, byName };
}

async function metrics() {
  const r = await fetch(`${URL_BASE}/metrics`);
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^text\/plain/);
  return parseMetrics(await r.text());
}

const L = '{model_name="tiny"}';
const gauge = (m, name) => m.samples.get(`deepinfer_${name}${L}`);

before(async () => {
  const deadline = Date.now() + 180_000;
  for (;;) {
    try {
      const r = await fetch(`${URL_BASE}/health`);
      if (r.status === 200) return;
      assert.equal(r.status, 503, 'health answers 503 while loading');
    } catch (e) {
      if (Date.now() > deadline) throw e;
    }
    if (Date.now() > deadline) throw new Error('server not healthy in 180 s');
    await sleep(200);
  }
});

// Greedy completion of a token prompt, used as the reference for chat.
async function greedyCompletion(prompt, maxTokens) {
  const r = await client.completions.create({ model: 'tiny', prompt, max_tokens: maxTokens, temperature: 0 });
  return r.choices[0].text;
}

test('models, health, tokenize and detokenize', async () => {
  const models = await client.models.list();
  assert.equal(models.data.length, 1);
  assert.equal(models.data[0].id, 'tiny');
  assert.equal(models.data[0].max_model_len, MAX_MODEL_LEN);
  assert.equal((await fetch(`${URL_BASE}/health`)).status, 200);
  const t = await post('/tokenize', { prompt: 'Hello world, hello!' });
  assert.equal(t.status, 200);
  assert.equal(t.json.count, t.json.tokens.length);
  assert.equal(t.json.tokens[0], 0, 'BOS first');
  const d = await post('/detokenize', { tokens: t.json.tokens.slice(1) });
  assert.equal(d.status, 200);
  assert.equal(d.json.prompt, 'Hello world, hello!');
});

test('completion: text, usage, echo, token-id prompt', async () => {
  const prompt = 'The quick brown fox';
  const r = await client.completions.create({ model: 'tiny', prompt, max_tokens: 8, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(r.choices[0].text.length > 0);
  const tok = await post('/tokenize', { prompt });
  assert.equal(r.usage.prompt_tokens, tok.json.count);
  assert.equal(r.usage.completion_tokens, 8);
  assert.equal(r.usage.total_tokens, tok.json.count + 8);
  // The same prompt as token ids gives the same text.
  const ids = await client.completions.create({ model: 'tiny', prompt: tok.json.tokens, max_tokens: 8, temperature: 0 });
  assert.equal(ids.choices[0].text, r.choices[0].text);
  // echo prepends the prompt.
  const e = await client.completions.create({ model: 'tiny', prompt, max_tokens: 8, temperature: 0, echo: true });
  assert.equal(e.choices[0].text, prompt + r.choices[0].text);
  // Two prompts in one request: choice i belongs to prompt i.
  const two = await client.completions.create({ model: 'tiny', prompt: [prompt, 'Another one'], max_tokens: 8, temperature: 0 });
  assert.equal(two.choices.length, 2);
  assert.equal(two.choices[0].text, r.choices[0].text);
  assert.equal(two.choices[1].text, await greedyCompletion('Another one', 8));
});

test('chat: rendered with the DeepSeek format; thinking goes to reasoning_content', async () => {
  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'What is 2+2?' }];
  const r = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 10, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices[0].message.role, 'assistant');
  // Reference: the rendered prompt's token ids through /v1/completions.
  const tok = await post('/tokenize', { messages });
  assert.equal(tok.status, 200);
  assert.equal(r.usage.prompt_tokens, tok.json.count);
  assert.equal(r.choices[0].message.content, await greedyCompletion(tok.json.tokens, 10));
  const rendered = (await post('/detokenize', { tokens: tok.json.tokens })).json.prompt;
  assert.ok(rendered.endsWith('<｜User｜>What is 2+2?<｜Assistant｜></think>'), rendered);

  // Thinking mode: the prompt ends with <think>; the output (no </think> from
  // a random model in 10 tokens) is reasoning.
  const kw = { thinking: true };
  const th = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 10, temperature: 0, chat_template_kwargs: kw });
  const ttok = await post('/tokenize', { messages, chat_template_kwargs: kw });
  const trendered = (await post('/detokenize', { tokens: ttok.json.tokens })).json.prompt;
  assert.ok(trendered.endsWith('<｜Assistant｜><think>'), trendered);
  const ref = await greedyCompletion(ttok.json.tokens, 10);
  const i = ref.indexOf('</think>');
  const [reasoning, content] = i < 0 ? [ref, ''] : [ref.slice(0, i), ref.slice(i + '</think>'.length)];
  assert.equal(th.choices[0].message.reasoning_content, reasoning);
  assert.equal(th.choices[0].message.content, content);
});

async function collectCompletionStream(params) {
  const stream = await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = ''; let finish = null; let usage = null; let chunks = 0;
  for await (const c of stream) {
    chunks++;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      assert.equal(ch.index, 0);
      text += ch.text;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { text, finish, usage, chunks };
}

test('streaming equals non-streaming (completions and chat)', async () => {
  const params = { model: 'tiny', prompt: 'Once upon a time', max_tokens: 10, temperature: 0.8, seed: 42 };
  const whole = await client.completions.create(params);
  const s = await collectCompletionStream(params);
  assert.equal(s.text, whole.choices[0].text);
  assert.equal(s.finish, 'length');
  assert.deepEqual(s.usage, whole.usage);
  assert.ok(s.chunks >= 3, `tokens arrive in several chunks (${s.chunks})`);

  const cp = { model: 'tiny', messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 10, temperature: 0.8, seed: 7 };
  const cw = await client.chat.completions.create(cp);
  const stream = await client.chat.completions.create({ ...cp, stream: true, stream_options: { include_usage: true } });
  let content = ''; let role = null; let finish = null; let usage = null;
  for await (const c of stream) {
    assert.equal(c.object, 'chat.completion.chunk');
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      if (ch.delta.role) role = ch.delta.role;
      if (ch.delta.content) content += ch.delta.content;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  assert.equal(role, 'assistant');
  assert.equal(content, cw.choices[0].message.content);
  assert.equal(finish, cw.choices[0].finish_reason);
  assert.deepEqual(usage, cw.usage);
});

test('logprobs and top_logprobs', async () => {
  const r = await client.completions.create({ model: 'tiny', prompt: 'Logprobs please', max_tokens: 6, temperature: 0, logprobs: 3 });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, 6);
  assert.equal(lp.token_logprobs.length, 6);
  assert.equal(lp.top_logprobs.length, 6);
  assert.equal(lp.text_offset.length, 6);
  for (let i = 0; i < 6; i++) {
    const top = Object.values(lp.top_logprobs[i]);
    assert.ok(top.length >= 3, 'at least the top 3');
    assert.ok(lp.token_logprobs[i] <= 0);
    // Greedy: the chosen token is the most likely one.
    assert.equal(lp.token_logprobs[i], Math.max(...top));
    // Characters (code points, as OpenAI and vLLM), not UTF-8 bytes or UTF-16 units.
    if (i > 0) assert.equal(lp.text_offset[i], lp.text_offset[i - 1] + [...lp.tokens[i - 1]].length);
  }
  const c = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 2,
  });
  const content = c.choices[0].logprobs.content;
  assert.equal(content.length, c.usage.completion_tokens);
  for (const e of content) {
    assert.equal(e.top_logprobs.length, 2);
    assert.equal(e.token, e.top_logprobs[0].token);
    assert.equal(e.logprob, e.top_logprobs[0].logprob);
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
    assert.ok(Array.isArray(e.bytes) && e.bytes.length > 0);
  }
  // Streaming logprobs match the non-streaming ones.
  const stream = await client.completions.create({ model: 'tiny', prompt: 'Logprobs please', max_tokens: 6, temperature: 0, logprobs: 3, stream: true });
  const sl = [];
  for await (const ch of stream) for (const x of ch.choices) if (x.logprobs) sl.push(...x.logprobs.token_logprobs);
  assert.deepEqual(sl, lp.token_logprobs);
});

test('prompt scoring (lm-evaluation-harness style): echo + logprobs + max_tokens 0', async () => {
  // Text with a multi-byte character, and a token-id prompt; logprobs 1 as lm-eval sends.
  const texts = ['The quick brown fox jumps over the lazy dög', 'Scores: 1, 2, 3'];
  const idsOf = async (t) => (await post('/tokenize', { prompt: t })).json.tokens;
  for (const prompt of [texts[0], await idsOf(texts[1])]) {
    const ids = typeof prompt === 'string' ? await idsOf(prompt) : prompt;
    const s = await client.completions.create({ model: 'tiny', prompt, echo: true, logprobs: 1, max_tokens: 0, temperature: 0 });
    const ref = await client.completions.create({ model: 'tiny', prompt, max_tokens: 1, temperature: 0, prompt_logprobs: 1 });
    const ch = s.choices[0];
    const plp = ref.choices[0].prompt_logprobs;
    assert.equal(ch.finish_reason, 'length');
    assert.equal(s.usage.completion_tokens, 0, 'nothing generated');
    assert.equal(s.usage.prompt_tokens, ids.length);
    const echoed = typeof prompt === 'string' ? prompt : (await post('/detokenize', { tokens: ids })).json.prompt;
    assert.equal(ch.text, echoed);
    const lp = ch.logprobs;
    assert.equal(lp.tokens.length, ids.length);
    assert.equal(lp.token_logprobs[0], null, 'the first token has no logprob');
    assert.equal(lp.top_logprobs[0], null);
    for (let p = 1; p < ids.length; p++) {
      // Bit for bit the prompt_logprobs value of the prompt token.
      assert.equal(lp.token_logprobs[p], plp[p][String(ids[p])].logprob, `position ${p}`);
      assert.equal(lp.tokens[p], plp[p][String(ids[p])].decoded_token);
      const top = Object.entries(lp.top_logprobs[p]);
      assert.ok(top.length === 1 || top.length === 2, 'top 1 and the token itself');
      const rank1 = Object.values(plp[p]).find((v) => v.rank === 1);
      assert.equal(lp.top_logprobs[p][rank1.decoded_token], rank1.logprob);
    }
    // text_offset: characters into the echoed text.
    for (let p = 1; p < ids.length; p++) {
      const at = lp.text_offset[p];
      if (typeof prompt === 'string') assert.equal([...echoed].slice(at, at + [...lp.tokens[p]].length).join(''), lp.tokens[p]);
      assert.ok(at >= lp.text_offset[p - 1]);
    }
    // Batched with n > 1 and max_tokens >= 1: the prompt part is the same, then the generated tokens follow.
    const more = await client.completions.create({ model: 'tiny', prompt: [prompt, prompt], echo: true, logprobs: 1, max_tokens: 3, temperature: 0, n: 2 });
    assert.equal(more.choices.length, 4);
    for (const c of more.choices) {
      assert.deepEqual(c.logprobs.token_logprobs.slice(0, ids.length), lp.token_logprobs);
      assert.equal(c.logprobs.tokens.length, ids.length + 3);
      assert.ok(c.text.startsWith(echoed));
    }
  }
});

test('prompt_logprobs (vLLM extension): completions and chat', async () => {
  const prompt = 'The quick brown fox jumps over';
  const ids = (await post('/tokenize', { prompt })).json.tokens;
  const P = ids.length;
  assert.ok(P >= 4);
  const r = await client.completions.create({ model: 'tiny', prompt, max_tokens: 2, temperature: 0, prompt_logprobs: 3 });
  const plp = r.choices[0].prompt_logprobs;
  assert.equal(plp.length, P, 'one element per prompt token');
  assert.equal(plp[0], null, 'the first prompt token has no context');
  for (let p = 1; p < P; p++) {
    const d = plp[p];
    assert.ok(String(ids[p]) in d, `position ${p} holds the prompt token ${ids[p]}`);
    const entries = Object.entries(d);
    assert.ok(entries.length === 3 || entries.length === 4, `top 3 + the prompt token (${entries.length})`);
    for (const [id, v] of entries) {
      assert.match(id, /^[0-9]+$/);
      assert.ok(v.logprob <= 0 && Number.isFinite(v.logprob));
      assert.ok(Number.isInteger(v.rank) && v.rank >= 1);
      assert.equal(typeof v.decoded_token, 'string');
    }
    // Ranks order the logprobs; the top 3 are ranks 1..3; a 4th entry is the prompt token below them.
    const byRank = entries.map(([, v]) => v).sort((a, b) => a.rank - b.rank);
    assert.deepEqual(byRank.slice(0, 3).map((v) => v.rank), [1, 2, 3]);
    for (let k = 1; k < byRank.length; k++) assert.ok(byRank[k - 1].logprob >= byRank[k].logprob);
    if (entries.length === 4) assert.ok(d[String(ids[p])].rank > 3);
  }
  // The last entry is the logits at position P-2: the same as the first generated token's logprobs
  // (greedy = rank 1) for the prompt without its last token.
  const prefix = await client.completions.create({ model: 'tiny', prompt: ids.slice(0, P - 1), max_tokens: 1, temperature: 0, logprobs: 3 });
  const last = Object.values(plp[P - 1]);
  const rank1 = last.find((v) => v.rank === 1);
  assert.equal(prefix.choices[0].logprobs.tokens[0], rank1.decoded_token);
  assert.equal(prefix.choices[0].logprobs.token_logprobs[0], rank1.logprob);
  for (const [text, lp] of Object.entries(prefix.choices[0].logprobs.top_logprobs[0])) {
    assert.ok(last.some((v) => v.decoded_token === text && v.logprob === lp), `top token ${JSON.stringify(text)}`);
  }
  // Token-id prompt, other sampling settings, n = 2, batched with another prompt: the same values.
  const other = (await post('/tokenize', { prompt: 'Another prompt here' })).json.tokens;
  const again = await client.completions.create({
    model: 'tiny', prompt: [ids, other], max_tokens: 3, temperature: 0.9, seed: 3, n: 2, prompt_logprobs: 3,
  });
  assert.equal(again.choices.length, 4);
  assert.deepEqual(again.choices[0].prompt_logprobs, plp);
  assert.deepEqual(again.choices[1].prompt_logprobs, plp);
  assert.equal(again.choices[2].prompt_logprobs.length, other.length);
  assert.deepEqual(again.choices[3].prompt_logprobs, again.choices[2].prompt_logprobs);
  // Not asked: no prompt_logprobs.
  assert.equal(prefix.choices[0].prompt_logprobs, undefined);
  // prompt_logprobs 0: only the prompt token itself.
  const zero = await client.completions.create({ model: 'tiny', prompt, max_tokens: 1, prompt_logprobs: 0 });
  for (let p = 1; p < P; p++) assert.deepEqual(Object.keys(zero.choices[0].prompt_logprobs[p]), [String(ids[p])]);
  assert.deepEqual(zero.choices[0].prompt_logprobs[P - 1][String(ids[P - 1])], plp[P - 1][String(ids[P - 1])]);
  // Chat: the top-level prompt_logprobs of the rendered prompt.
  const messages = [{ role: 'user', content: 'Hi there' }];
  const c = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 2, temperature: 0, prompt_logprobs: 2 });
  const ctok = (await post('/tokenize', { messages })).json.tokens;
  assert.equal(c.prompt_logprobs.length, ctok.length);
  assert.equal(c.usage.prompt_tokens, ctok.length);
  assert.equal(c.prompt_logprobs[0], null);
  const viaCompletion = await client.completions.create({ model: 'tiny', prompt: ctok, max_tokens: 1, prompt_logprobs: 2 });
  // /tokenize renders messages exactly as chat does, options included.
  for (const kwargs of [{ enable_thinking: true }, { thinking: true }, { thinking: false }]) {
    const tk = (await post('/tokenize', { messages, chat_template_kwargs: kwargs })).json;
    const cc = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 1, chat_template_kwargs: kwargs });
    assert.equal(tk.count, cc.usage.prompt_tokens, JSON.stringify(kwargs));
  }
  assert.equal((await post('/tokenize', { messages, chat_template_kwargs: { thinking: 'yes' } })).status, 400);
  assert.deepEqual(c.prompt_logprobs, viaCompletion.choices[0].prompt_logprobs);
  // Streaming is refused (as vLLM), naming the field.
  const s = await post('/v1/completions', { model: 'tiny', prompt, prompt_logprobs: 1, stream: true });
  assert.equal(s.status, 400);
  assert.equal(s.json.error.param, 'prompt_logprobs');
  assert.match(s.json.error.message, /stream/);
});

test('stop strings end the text before the match', async () => {
  const base = { model: 'tiny', prompt: 'Stop test: the', max_tokens: 16, temperature: 0 };
  const full = (await client.completions.create(base)).choices[0].text;
  // A 3-character piece whose first occurrence starts at k >= 2.
  let stop = null; let k = 2;
  for (; k + 3 <= full.length; k++) {
    const s = full.slice(k, k + 3);
    if (full.indexOf(s) === k && s.trim().length > 0 && !s.includes('\uFFFD')) { stop = s; break; }
  }
  assert.ok(stop, `no usable stop string in ${JSON.stringify(full)}`);
  const r = await client.completions.create({ ...base, stop: [stop] });
  assert.equal(r.choices[0].text, full.slice(0, k));
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].stop_reason, stop);
  const inc = await client.completions.create({ ...base, stop, include_stop_str_in_output: true });
  assert.equal(inc.choices[0].text, full.slice(0, k + 3));
  // The same through the stream.
  const s = await collectCompletionStream({ ...base, stop: [stop] });
  assert.equal(s.text, full.slice(0, k));
  assert.equal(s.finish, 'stop');
});

test('seed reproducibility and n', async () => {
  const p = { model: 'tiny', prompt: 'Random words:', max_tokens: 10, temperature: 1.0, top_p: 0.95 };
  const a = await client.completions.create({ ...p, seed: 1234 });
  const b = await client.completions.create({ ...p, seed: 1234 });
  const c = await client.completions.create({ ...p, seed: 1235 });
  assert.equal(a.choices[0].text, b.choices[0].text);
  assert.notEqual(a.choices[0].text, c.choices[0].text);
  // n = 3 with a seed: choice j uses seed + j.
  const n = await client.completions.create({ ...p, seed: 1234, n: 3 });
  assert.equal(n.choices.length, 3);
  assert.deepEqual(n.choices.map((x) => x.index), [0, 1, 2]);
  assert.equal(n.choices[0].text, a.choices[0].text);
  assert.equal(n.choices[1].text, c.choices[0].text);
  assert.equal(n.usage.completion_tokens, 30);
  // Chat with n and max_completion_tokens.
  const ch = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_completion_tokens: 4, temperature: 1.0, seed: 9, n: 2,
  });
  assert.equal(ch.choices.length, 2);
  assert.equal(ch.usage.completion_tokens, 8);
});

test('16 concurrent streams each equal their solo output', { timeout: 600_000 }, async () => {
  const params = (i) => ({ model: 'tiny', prompt: `Request ${i}: once there was`, max_tokens: 6, temperature: 0.7, seed: 100 + i });
  const solo = [];
  for (let i = 0; i < 16; i++) solo.push((await client.completions.create(params(i))).choices[0].text);
  let maxRunning = 0; let polling = true;
  const poller = (async () => {
    while (polling) {
      const m = await metrics();
      maxRunning = Math.max(maxRunning, gauge(m, 'num_requests_running'));
      await sleep(50);
    }
  })();
  const streamed = await Promise.all(Array.from({ length: 16 }, (_, i) => collectCompletionStream(params(i))));
  polling = false;
  await poller;
  for (let i = 0; i < 16; i++) {
    assert.equal(streamed[i].text, solo[i], `stream ${i}`);
    assert.equal(streamed[i].usage.completion_tokens, 6);
  }
  assert.ok(maxRunning > 1, `requests ran batched (max running ${maxRunning})`);
});

test('a plain (non-streaming) request whose client goes away after 1 s is aborted; blocks freed within 1 s', { timeout: 300_000 }, async () => {
  const ABORT = 'deepinfer_request_success_total{model_name="tiny",finished_reason="abort"}';
  const cases = [
    // n = 16 long choices: several seconds of work even on a fast machine.
    [C, { model: 'tiny', prompt: 'A long story:', max_tokens: 240, ignore_eos: true, temperature: 0.5, seed: 1, n: 16 }],
    [CH, { model: 'tiny', messages: [{ role: 'user', content: 'A long story, please' }], max_tokens: 200, ignore_eos: true, temperature: 0.5, seed: 1, n: 16 }],
  ];
  for (const [pathname, body] of cases) {
    const before = await metrics();
    const aborts0 = before.samples.get(ABORT);
    const gen0 = before.samples.get(`deepinfer_generation_tokens_total${L}`);
    const ctrl = new AbortController();
    const pending = fetch(URL_BASE + pathname, {
      method: 'POST', headers: { 'Content-Type': 'application/json', ...AUTH }, body: JSON.stringify(body), signal: ctrl.signal,
    }).catch((e) => e);
    await sleep(1000);
    assert.ok(gauge(await metrics(), 'kv_cache_blocks_used') > 0, `${pathname}: the request is running and holds blocks`);
    const t0 = Date.now();
    ctrl.abort();
    assert.ok((await pending) instanceof Error, 'the client gave up');
    let m;
    for (;;) {
      m = await metrics();
      // Every choice is one engine request: n aborts.
      if (m.samples.get(ABORT) === aborts0 + body.n && gauge(m, 'kv_cache_blocks_used') === 0 && gauge(m, 'num_requests_running') === 0) break;
      assert.ok(Date.now() - t0 < 1000, `${pathname}: not aborted and freed within 1 s`);
      await sleep(10);
    }
    assert.ok(m.samples.get(`deepinfer_generation_tokens_total${L}`) - gen0 < body.max_tokens * body.n, `${pathname}: stopped early`);
  }
});

test('a client that disconnects mid-stream aborts its request; its blocks are freed', { timeout: 300_000 }, async () => {
  const before = await metrics();
  const aborts0 = before.samples.get('deepinfer_request_success_total{model_name="tiny",finished_reason="abort"}');
  const gen0 = before.samples.get(`deepinfer_generation_tokens_total${L}`);
  const stream = await client.completions.create({
    model: 'tiny', prompt: 'A very long story:', max_tokens: 200, ignore_eos: true, temperature: 0, stream: true,
  });
  let chunks = 0;
  let sawUsed = false;
  for await (const c of stream) {
    if (c.choices.length && ++chunks === 2) {
      sawUsed = gauge(await metrics(), 'kv_cache_blocks_used') > 0;
      stream.controller.abort();
      break;
    }
  }
  assert.equal(chunks, 2);
  assert.ok(sawUsed, 'the running request held KV blocks');
  let m;
  const deadline = Date.now() + 20_000;
  for (;;) {
    m = await metrics();
    const aborts = m.samples.get('deepinfer_request_success_total{model_name="tiny",finished_reason="abort"}');
    if (aborts === aborts0 + 1 && gauge(m, 'kv_cache_blocks_used') === 0 && gauge(m, 'num_requests_running') === 0) break;
    assert.ok(Date.now() < deadline, 'blocks not freed within 20 s');
    await sleep(50);
  }
  assert.equal(m.samples.get('deepinfer_request_success_total{model_name="tiny",finished_reason="abort"}'), aborts0 + 1);
  assert.ok(m.samples.get(`deepinfer_generation_tokens_total${L}`) - gen0 < 200, 'generation stopped early');
});

// ---------------------------------------------------------------------------
// Bad requests: [name, path, body, expected status, expected type, expected param (undefined = not checked), headers]
const C = '/v1/completions';
const CH = '/v1/chat/completions';
const msgs = [{ role: 'user', content: 'hi' }];
const longIds = Array.from({ length: 250 }, (_, i) => 1000 + i);
const BAD = [
  ['malformed JSON', C, '{"prompt": "a",', 400, 'invalid_request_error'],
  ['body is an array', C, '[1, 2, 3]', 400, 'invalid_request_error'],
  ['empty body', C, '', 400, 'invalid_request_error'],
  ['invalid UTF-8 byte', C, Buffer.from([0x7b, 0x22, 0x70, 0x72, 0x6f, 0x6d, 0x70, 0x74, 0x22, 0x3a, 0x22, 0xff, 0xfe, 0x22, 0x7d]), 400, 'invalid_request_error'],
  ['lone UTF-16 surrogate escape', C, '{"prompt": "\\ud800"}', 400, 'invalid_request_error'],
  ['prompt missing', C, { model: 'tiny' }, 400, 'invalid_request_error', 'prompt'],
  ['prompt empty string', C, { prompt: '' }, 400, 'invalid_request_error', 'prompt'],
  ['prompt empty list', C, { prompt: [] }, 400, 'invalid_request_error', 'prompt'],
  ['prompt is a number', C, { prompt: 5 }, 400, 'invalid_request_error', 'prompt'],
  ['prompt list of empty list', C, { prompt: [[]] }, 400, 'invalid_request_error', 'prompt'],
  ['prompt list mixing strings and token ids', C, { prompt: ['a', [1]] }, 400, 'invalid_request_error', 'prompt'],
  ['a number too large for a double', C, '{"prompt": "a", "temperature": 1e400}', 400, 'invalid_request_error'],
  ['prompt list mixing token ids and strings', C, { prompt: [[1], 'a'] }, 400, 'invalid_request_error', 'prompt'],
  ['prompt list of objects', C, { prompt: [{}] }, 400, 'invalid_request_error', 'prompt'],
  ['token id past the vocabulary', C, { prompt: [1, 999999] }, 400, 'invalid_request_error', 'prompt'],
  ['negative token id', C, { prompt: [-1] }, 400, 'invalid_request_error', 'prompt'],
  ['unknown model', C, { model: 'gpt-4', prompt: 'a' }, 400, 'invalid_request_error', 'model'],
  ['model not a string', C, { model: 5, prompt: 'a' }, 400, 'invalid_request_error', 'model'],
  ['max_tokens 0', C, { prompt: 'a', max_tokens: 0 }, 400, 'invalid_request_error', 'max_tokens'],
  ['max_tokens negative', C, { prompt: 'a', max_tokens: -5 }, 400, 'invalid_request_error', 'max_tokens'],
  ['max_tokens a string', C, { prompt: 'a', max_tokens: 'ten' }, 400, 'invalid_request_error', 'max_tokens'],
  ['max_tokens fractional', C, { prompt: 'a', max_tokens: 1.5 }, 400, 'invalid_request_error', 'max_tokens'],
  ['prompt + max_tokens over max_model_len', C, { prompt: 'hello', max_tokens: 300 }, 400, 'invalid_request_error', 'prompt'],
  ['long prompt + default max_tokens over max_model_len', C, { prompt: longIds }, 400, 'invalid_request_error', 'prompt'],
  ['temperature negative', C, { prompt: 'a', temperature: -1 }, 400, 'invalid_request_error', 'temperature'],
  ['temperature a string', C, { prompt: 'a', temperature: 'hot' }, 400, 'invalid_request_error', 'temperature'],
  ['top_p 0', C, { prompt: 'a', top_p: 0 }, 400, 'invalid_request_error', 'top_p'],
  ['top_p above 1', C, { prompt: 'a', top_p: 1.5 }, 400, 'invalid_request_error', 'top_p'],
  ['top_k -2', C, { prompt: 'a', top_k: -2 }, 400, 'invalid_request_error', 'top_k'],
  ['min_p above 1', C, { prompt: 'a', min_p: 2 }, 400, 'invalid_request_error', 'min_p'],
  ['presence_penalty above 2', C, { prompt: 'a', presence_penalty: 3 }, 400, 'invalid_request_error', 'presence_penalty'],
  ['frequency_penalty below -2', C, { prompt: 'a', frequency_penalty: -3 }, 400, 'invalid_request_error', 'frequency_penalty'],
  ['repetition_penalty 0', C, { prompt: 'a', repetition_penalty: 0 }, 400, 'invalid_request_error', 'repetition_penalty'],
  ['logit_bias key not a token id', C, { prompt: 'a', logit_bias: { abc: 1 } }, 400, 'invalid_request_error', 'logit_bias'],
  ['logit_bias value out of range', C, { prompt: 'a', logit_bias: { 5: 500 } }, 400, 'invalid_request_error', 'logit_bias'],
  ['logprobs above max_logprobs', C, { prompt: 'a', logprobs: 50 }, 400, 'invalid_request_error', 'logprobs'],
  ['logprobs boolean in completions', C, { prompt: 'a', logprobs: true }, 400, 'invalid_request_error', 'logprobs'],
  ['n 0', C, { prompt: 'a', n: 0 }, 400, 'invalid_request_error', 'n'],
  ['n a string', C, { prompt: 'a', n: 'two' }, 400, 'invalid_request_error', 'n'],
  ['stop empty string', C, { prompt: 'a', stop: [''] }, 400, 'invalid_request_error', 'stop'],
  ['stop a number', C, { prompt: 'a', stop: 5 }, 400, 'invalid_request_error', 'stop'],
  ['seed a string', C, { prompt: 'a', seed: 'x' }, 400, 'invalid_request_error', 'seed'],
  ['stream not a boolean', C, { prompt: 'a', stream: 'yes' }, 400, 'invalid_request_error', 'stream'],
  ['stream_options without stream', C, { prompt: 'a', stream_options: { include_usage: true } }, 400, 'invalid_request_error', 'stream_options'],
  ['suffix unsupported', C, { prompt: 'a', suffix: 'b' }, 400, 'invalid_request_error', 'suffix'],
  ['min_tokens above max_tokens', C, { prompt: 'a', max_tokens: 2, min_tokens: 5 }, 400, 'invalid_request_error', 'min_tokens'],
  ['stop_token_ids negative', C, { prompt: 'a', stop_token_ids: [-1] }, 400, 'invalid_request_error', 'stop_token_ids'],
  ['echo with logprobs and stream', C, { prompt: 'a', echo: true, logprobs: 1, stream: true }, 400, 'invalid_request_error', 'echo'],
  ['max_tokens 0 without echo', C, { prompt: 'a', max_tokens: 0 }, 400, 'invalid_request_error', 'max_tokens'],
  ['max_tokens 0 with min_tokens', C, { prompt: 'a', echo: true, max_tokens: 0, min_tokens: 1 }, 400, 'invalid_request_error', 'min_tokens'],
  ['prompt_logprobs above max_logprobs', C, { prompt: 'a', prompt_logprobs: 50 }, 400, 'invalid_request_error', 'prompt_logprobs'],
  ['prompt_logprobs -2', C, { prompt: 'a', prompt_logprobs: -2 }, 400, 'invalid_request_error', 'prompt_logprobs'],
  ['prompt_logprobs a string', C, { prompt: 'a', prompt_logprobs: 'x' }, 400, 'invalid_request_error', 'prompt_logprobs'],
  ['prompt_logprobs -1 (whole vocabulary) above max_logprobs', C, { prompt: 'a', prompt_logprobs: -1 }, 400, 'invalid_request_error', 'prompt_logprobs'],
  ['prompt_logprobs with stream', C, { prompt: 'a', prompt_logprobs: 1, stream: true }, 400, 'invalid_request_error', 'prompt_logprobs'],
  ['chat: prompt_logprobs above max_logprobs', CH, { messages: msgs, prompt_logprobs: 50 }, 400, 'invalid_request_error', 'prompt_logprobs'],
  ['oversized body', C, JSON.stringify({ prompt: 'x'.repeat(1_200_000) }), 400, 'invalid_request_error'],
  ['chat: messages missing', CH, { model: 'tiny' }, 400, 'invalid_request_error', 'messages'],
  ['chat: messages empty', CH, { messages: [] }, 400, 'invalid_request_error', 'messages'],
  ['chat: messages a string', CH, { messages: 'hi' }, 400, 'invalid_request_error', 'messages'],
  ['chat: unknown role', CH, { messages: [{ role: 'wizard', content: 'x' }] }, 400, 'invalid_request_error', 'messages'],
  ['chat: logprobs not boolean', CH, { messages: msgs, logprobs: 'yes' }, 400, 'invalid_request_error', 'logprobs'],
  ['chat: top_logprobs without logprobs', CH, { messages: msgs, top_logprobs: 2 }, 400, 'invalid_request_error', 'top_logprobs'],
  ['chat: top_logprobs too large', CH, { messages: msgs, logprobs: true, top_logprobs: 30 }, 400, 'invalid_request_error', 'top_logprobs'],
  ['chat: max_completion_tokens 0', CH, { messages: msgs, max_completion_tokens: 0 }, 400, 'invalid_request_error', 'max_completion_tokens'],
  ['chat: over max_model_len', CH, { messages: msgs, max_tokens: 1000 }, 400, 'invalid_request_error', 'messages'],
  ['chat: tools with non-object parameters', CH, { messages: msgs, tools: [{ type: 'function', function: { name: 'f', parameters: 'x' } }] }, 400, 'invalid_request_error', 'tools'],
  ['chat: tool_choice names an unknown tool', CH, { messages: msgs, tools: [{ type: 'function', function: { name: 'f' } }], tool_choice: { type: 'function', function: { name: 'g' } } }, 400, 'invalid_request_error', 'tool_choice'],
  ['chat: response_format of an unknown type', CH, { messages: msgs, response_format: { type: 'xml' } }, 400, 'invalid_request_error', 'response_format'],
  ['chat: json_schema with an unsupported keyword', CH, { messages: msgs, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'integer', minimum: 0 } } } }, 400, 'invalid_request_error', 'response_format'],
  ['guided_regex invalid', C, { prompt: 'a', guided_regex: 'a(b' }, 400, 'invalid_request_error', 'guided_regex'],
  ['response_format json_object on completions', C, { prompt: 'a', response_format: { type: 'json_object' } }, 400, 'invalid_request_error', 'response_format'],
  ['chat: chat_template_kwargs not an object', CH, { messages: msgs, chat_template_kwargs: 'x' }, 400, 'invalid_request_error', 'chat_template_kwargs'],
  ['chat: unknown model', CH, { model: 'nope', messages: msgs }, 400, 'invalid_request_error', 'model'],
  ['missing API key', C, { prompt: 'a' }, 401, 'invalid_request_error', undefined, { Authorization: '' }],
  ['wrong API key', C, { prompt: 'a' }, 401, 'invalid_request_error', undefined, { Authorization: 'Bearer wrong' }],
  ['unknown route', '/v1/nothing', {}, 404, 'invalid_request_error'],
  ['detokenize id out of range', '/detokenize', { tokens: [-1] }, 400, 'invalid_request_error', 'tokens'],
  ['tokenize without prompt or messages', '/tokenize', {}, 400, 'invalid_request_error'],
];

test(`a table of ${BAD.length} bad requests, then the server still answers correctly`, { timeout: 300_000 }, async () => {
  assert.ok(BAD.length >= 40);
  const before = await client.completions.create({ model: 'tiny', prompt: 'Still alive?', max_tokens: 6, temperature: 0 });
  for (const [name, pathname, body, status, type, param, headers] of BAD) {
    const r = await post(pathname, body, headers || {});
    assert.equal(r.status, status, `${name}: status (body ${r.text.slice(0, 200)})`);
    assert.ok(r.json && r.json.error, `${name}: OpenAI error body`);
    const e = r.json.error;
    assert.equal(e.type, type, `${name}: type`);
    assert.equal(typeof e.message, 'string', `${name}: message`);
    assert.ok(e.message.length > 0, `${name}: message`);
    assert.ok('param' in e && 'code' in e, `${name}: param and code keys`);
    if (param !== undefined) assert.equal(e.param, param, `${name}: param (${e.message})`);
  }
  // The over-length message names the prompt's token count, max_tokens and max_model_len.
  const r = await post(C, { prompt: 'hello', max_tokens: 300 });
  const n = (await post('/tokenize', { prompt: 'hello' })).json.count;
  assert.equal(r.json.error.code, 'context_length_exceeded');
  assert.match(r.json.error.message, new RegExp(`\\b${n} in the prompt\\b`));
  assert.match(r.json.error.message, /\b300\b/);
  assert.match(r.json.error.message, /\b256\b/);
  // Another method on a known route: 405 with Allow.
  for (const [method, path, allow] of [['PUT', C, 'POST'], ['DELETE', CH, 'POST'], ['POST', '/v1/models', 'GET, HEAD']]) {
    const r = await fetch(URL_BASE + path, { method, headers: { 'Content-Type': 'application/json', ...AUTH }, body: '{}' });
    assert.equal(r.status, 405, `${method} ${path}`);
    assert.equal(r.headers.get('allow'), allow, `${method} ${path}: Allow`);
    assert.equal((await r.json()).error.code, 'method_not_allowed');
  }
  // A chunked upload is read (and answered like the same body with Content-Length)...
  const chunked = new ReadableStream({
    start(c) {
      const bytes = new TextEncoder().encode(JSON.stringify({ model: 'tiny', prompt: 'a', max_tokens: 2, temperature: 0 }));
      for (let i = 0; i < bytes.length; i += 7) c.enqueue(bytes.slice(i, i + 7));
      c.close();
    },
  });
  const rc = await fetch(URL_BASE + C, {
    method: 'POST', headers: { 'Content-Type': 'application/json', ...AUTH }, body: chunked, duplex: 'half',
  });
  assert.equal(rc.status, 200);
  const plain = await post(C, { model: 'tiny', prompt: 'a', max_tokens: 2, temperature: 0 });
  assert.equal((await rc.json()).choices[0].text, plain.json.choices[0].text);
  // ... and one that never ends but passes --max-request-bytes (1,000,000) is refused while it is
  // read: the answer (or the server closing) comes although the body never finishes.
  let stopUpload = false;
  const endless = new ReadableStream({
    async pull(c) {
      if (stopUpload) { c.close(); return; }
      await sleep(1);
      c.enqueue(new Uint8Array(65536).fill(32));
    },
  });
  const upload = fetch(URL_BASE + C, {
    method: 'POST', headers: { 'Content-Type': 'application/json', ...AUTH }, body: endless, duplex: 'half',
  }).then(async (r) => ({ status: r.status, json: await r.json() }), (e) => e);
  const settled = await Promise.race([upload, sleep(20_000).then(() => 'timeout')]);
  stopUpload = true;
  assert.notEqual(settled, 'timeout', 'the server waited for the endless body');
  if (!(settled instanceof Error)) {  // (the server may close before fetch has read the answer)
    assert.equal(settled.status, 400);
    assert.equal(settled.json.error.code, 'request_too_large');
  }
  // The openai client surfaces these as typed errors.
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'a', top_p: 7 }), (e) => e instanceof OpenAI.BadRequestError && e.status === 400);
  await assert.rejects(client.completions.create({ model: 'other', prompt: 'a' }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === 'model_not_found');
  const anon = new OpenAI({ baseURL: `${URL_BASE}/v1`, apiKey: 'bad-key', maxRetries: 0 });
  await assert.rejects(anon.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
  // Still serving, with the same answer as before.
  const after = await client.completions.create({ model: 'tiny', prompt: 'Still alive?', max_tokens: 6, temperature: 0 });
  assert.equal(after.choices[0].text, before.choices[0].text);
  const m = await metrics();
  assert.equal(gauge(m, 'num_requests_running'), 0);
  assert.equal(gauge(m, 'kv_cache_blocks_used'), 0);
});

test('/metrics parses as Prometheus text with the expected families', async () => {
  let m = await metrics();
  const expect = {
    'deepinfer_num_requests_running': 'gauge',
    'deepinfer_num_requests_waiting': 'gauge',
    'deepinfer_kv_cache_blocks_used': 'gauge',
    'deepinfer_kv_cache_blocks': 'gauge',
    'deepinfer_prompt_tokens_total': 'counter',
    'deepinfer_generation_tokens_total': 'counter',
    'deepinfer_request_success_total': 'counter',
    'deepinfer_time_to_first_token_seconds': 'histogram',
    'deepinfer_inter_token_latency_seconds': 'histogram',
    'deepinfer_e2e_request_latency_seconds': 'histogram',
  };
  for (const [name, type] of Object.entries(expect)) {
    assert.equal(m.types.get(name), type, name);
    assert.ok(m.byName.has(name), `${name} in the npm parser's output`);
    assert.equal(m.byName.get(name).type, type.toUpperCase());
  }
  assert.ok(gauge(m, 'kv_cache_blocks') > 0);
  assert.ok(m.samples.get(`deepinfer_prompt_tokens_total${L}`) > 0);
  assert.ok(m.samples.get(`deepinfer_generation_tokens_total${L}`) > 0);
  for (const h of ['time_to_first_token_seconds', 'inter_token_latency_seconds', 'e2e_request_latency_seconds']) {
    const fam = m.byName.get(`deepinfer_${h}`);
    // (JavaScript orders integer-like keys first, so sort by bound.)
    const buckets = Object.entries(fam.metrics[0].buckets)
      .map(([le, v]) => [le === '+Inf' ? Infinity : Number(le), Number(v)])
      .sort((a, b) => a[0] - b[0]);
    assert.ok(buckets.length >= 10, `${h}: buckets`);
    for (let i = 1; i < buckets.length; i++) {
      assert.ok(buckets[i][0] > buckets[i - 1][0], `${h}: distinct bounds`);
      assert.ok(buckets[i][1] >= buckets[i - 1][1], `${h}: cumulative counts`);
    }
    const count = m.samples.get(`deepinfer_${h}_count${L}`);
    assert.equal(buckets.at(-1)[0], Infinity);
    assert.equal(buckets.at(-1)[1], count, `${h}: +Inf bucket == count`);
    assert.ok(count > 0, `${h}: observed`);
    assert.ok(m.samples.get(`deepinfer_${h}_sum${L}`) > 0);
  }
  // A server run with --speculative-config (tests/cli/server_spec.sh sets DEEPINFER_EXPECT_SPEC=1):
  // the spec_decode families are there and drafts were verified and accepted. 'drafts' (the DSpark
  // run: the tiny model's random drafter is practically never right): verified, acceptance not required.
  const expectSpec = process.env.DEEPINFER_EXPECT_SPEC;
  if (expectSpec === '1' || expectSpec === 'drafts') {
    // The tiny model's text never repeats: logit_bias confines it to 3 ids, so n-gram drafts get accepted.
    const bias = { 1000: 100, 5000: 100, 20000: 100 };
    const a = await client.completions.create({ model: 'tiny', prompt: 'one two one two', max_tokens: 24, temperature: 0, logit_bias: bias });
    const b = await client.completions.create({ model: 'tiny', prompt: 'one two one two', max_tokens: 24, temperature: 0, logit_bias: bias, stream: false });
    assert.equal(a.choices[0].text, b.choices[0].text);
    m = await metrics();
    for (const name of ['deepinfer_spec_decode_num_drafts_total', 'deepinfer_spec_decode_num_draft_tokens_total',
      'deepinfer_spec_decode_num_accepted_tokens_total', 'deepinfer_spec_decode_num_accepted_tokens_per_pos_total']) {
      assert.equal(m.types.get(name), 'counter', name);
    }
    assert.equal(m.types.get('deepinfer_spec_decode_mean_accepted_length'), 'gauge');
    assert.ok(m.samples.get(`deepinfer_spec_decode_num_drafts_total${L}`) > 0, 'drafts verified');
    if (expectSpec === '1') {
      assert.ok(m.samples.get(`deepinfer_spec_decode_num_accepted_tokens_total${L}`) > 0, 'drafts accepted');
      assert.ok(m.samples.get('deepinfer_spec_decode_num_accepted_tokens_per_pos_total{model_name="tiny",position="0"}') > 0);
    }
  }
  // Every request so far finished (stop, length or abort); errors none.
  assert.equal(m.samples.get('deepinfer_request_success_total{model_name="tiny",finished_reason="error"}'), 0);
  // promtool (Debian's prometheus package, installed by scripts/setup.sh) must accept the text with no warning.
  let promtool = null;
  try { promtool = execFileSync('sh', ['-c', 'command -v promtool'], { encoding: 'utf8' }).trim(); } catch { /* absent */ }
  assert.ok(promtool, 'promtool is not installed: run scripts/setup.sh (package prometheus)');
  const text = await (await fetch(`${URL_BASE}/metrics`)).text();
  const out = execFileSync(promtool, ['check', 'metrics'], { input: text, encoding: 'utf8', stdio: ['pipe', 'pipe', 'pipe'] });
  assert.equal(out.trim(), '', `promtool: ${out}`);
});
