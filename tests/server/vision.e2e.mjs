// Images in chat requests through the official `openai` npm client (run by
// tests/cli/vision_e2e.sh against `deepinfer serve` on the tiny vision model).
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';

const require = createRequire(path.join(process.env.DEEPINFER_NPM_DIR, 'package.json'));
const { default: OpenAI } = await import(require.resolve('openai'));

const URL_BASE = process.env.DEEPINFER_URL;
const API_KEY = process.env.DEEPINFER_API_KEY;
const DATA = process.env.VISION_DATA;
const EXPECTED = JSON.parse(process.env.VISION_EXPECTED_TEXT);
const PROMPT_TOKENS = Number(process.env.VISION_PROMPT_TOKENS);
const client = new OpenAI({ baseURL: `${URL_BASE}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 300_000 });

const dataUrl = (file) => `data:image/png;base64,${fs.readFileSync(path.join(DATA, file)).toString('base64')}`;
const imageMsg = (url, text = 'Describe this image.') => [
  { role: 'user', content: [{ type: 'image_url', image_url: { url } }, { type: 'text', text }] },
];

before(async () => {
  const deadline = Date.now() + 180_000;
  while (Date.now() < deadline) {
    try {
      if ((await fetch(`${URL_BASE}/health`)).status === 200) return;
    } catch { /* not listening yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('the server did not become ready');
});

test('image chat, not streaming: generate\'s text and the expanded prompt_tokens', async () => {
  const r = await client.chat.completions.create({
    model: 'tiny', messages: imageMsg(dataUrl('image0.png')), max_tokens: 8, temperature: 0,
  });
  assert.equal(r.choices[0].message.content, EXPECTED);
  assert.equal(r.usage.prompt_tokens, PROMPT_TOKENS);
  assert.ok(PROMPT_TOKENS > 10, 'the image span (10 tokens) is counted');
});

test('image chat, streaming: the same text', async () => {
  const stream = await client.chat.completions.create({
    model: 'tiny', messages: imageMsg(dataUrl('image0.png')), max_tokens: 8, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  for await (const c of stream) {
    if (c.choices.length) text += c.choices[0].delta.content ?? '';
    if (c.usage) usage = c.usage;
  }
  assert.equal(text, EXPECTED);
  assert.equal(usage.prompt_tokens, PROMPT_TOKENS);
});

test('another image gives another answer; the same image again hits the prefix cache only as far as it matches', async () => {
  const a = await client.chat.completions.create({
    model: 'tiny', messages: imageMsg(dataUrl('image1.png')), max_tokens: 8, temperature: 0,
  });
  assert.notEqual(a.choices[0].message.content, EXPECTED);
  // image1 after image0 (same text, same span length): no cached block may be shared
  assert.equal(a.usage.prompt_tokens_details.cached_tokens, 0);
  const b = await client.chat.completions.create({
    model: 'tiny', messages: imageMsg(dataUrl('image1.png')), max_tokens: 8, temperature: 0,
  });
  assert.equal(b.choices[0].message.content, a.choices[0].message.content);
  assert.ok(b.usage.prompt_tokens_details.cached_tokens > 0, 'the same image is cached');
});

test('/tokenize counts the expanded span', async () => {
  const r = await fetch(`${URL_BASE}/tokenize`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${API_KEY}` },
    body: JSON.stringify({ model: 'tiny', messages: imageMsg(dataUrl('image0.png')) }),
  });
  assert.equal(r.status, 200);
  assert.equal((await r.json()).count, PROMPT_TOKENS);
});

async function expect400(messages, want) {
  await assert.rejects(
    client.chat.completions.create({ model: 'tiny', messages, max_tokens: 2 }),
    (e) => {
      assert.equal(e.status, 400, String(e));
      assert.match(e.message, want);
      return true;
    });
}

test('bad images are 400s naming the problem', async () => {
  await expect400(imageMsg('https://example.com/cat.png'), /messages\[0\]\.content\[0\]\.image_url\.url: only data: URLs/);
  await expect400(imageMsg('/etc/passwd'), /only data: URLs/);
  await expect400(imageMsg('data:image/png;base64,AAAAAAAAAAAA'), /unsupported format/);
  await expect400(imageMsg('data:image/png;base64,%%%'), /invalid base64/);
  await expect400(imageMsg(dataUrl('bad_zero.png')), /PNG/);
  await expect400(imageMsg(dataUrl('bad_huge.png')), /more than the limit/);
  const png = fs.readFileSync(path.join(DATA, 'image0.png'));
  await expect400(imageMsg(`data:image/png;base64,${png.subarray(0, 400).toString('base64')}`), /undecodable PNG/);
  const many = [{ role: 'user', content: Array.from({ length: 17 }, () => ({ type: 'image_url', image_url: { url: dataUrl('image1.png') } })) }];
  await expect400(many, /too many images/);
});

test('text-only requests are bit-identical with and without an image request in the batch', async () => {
  const texts = ['Hello there', 'The quick brown fox', 'One two three four'];
  const run = (t) => client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: t }], max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 3,
  });
  const alone = await Promise.all(texts.map(run));
  const mixed = await Promise.all([
    client.chat.completions.create({ model: 'tiny', messages: imageMsg(dataUrl('image0.png')), max_tokens: 12, temperature: 0 }),
    ...texts.map(run),
  ]);
  for (let i = 0; i < texts.length; ++i) {
    assert.equal(mixed[i + 1].choices[0].message.content, alone[i].choices[0].message.content);
    assert.deepEqual(mixed[i + 1].choices[0].logprobs, alone[i].choices[0].logprobs);
  }
  assert.equal(mixed[0].choices[0].message.content.startsWith(EXPECTED.slice(0, 1)), true);
});
