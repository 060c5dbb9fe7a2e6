// Structured outputs and tool calling through the official `openai` npm client
// (run by tests/cli/structured_e2e.sh against `deepinfer serve` on the tiny
// model, random weights: the grammar does all the work). Validation is
// independent of the server: ajv for JSON Schema, zod for zodResponseFormat.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.join(process.env.DEEPINFER_NPM_DIR, 'package.json'));
const { default: OpenAI } = await import(require.resolve('openai'));
const { zodResponseFormat } = await import(require.resolve('openai/helpers/zod'));
const { z } = require('zod');
const Ajv = require('ajv').default;
const addFormats = require('ajv-formats').default;

const URL_BASE = process.env.DEEPINFER_URL;
const API_KEY = process.env.DEEPINFER_API_KEY;
const client = new OpenAI({ baseURL: `${URL_BASE}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 300_000 });
const ajv = new Ajv({ strict: true });
addFormats(ajv);
const msgs = [{ role: 'user', content: 'Give me the data.' }];

before(async () => {  // the server answers 503 until the model is loaded
  const deadline = Date.now() + 180_000;
  while (Date.now() < deadline) {
    try {
      if ((await fetch(`${URL_BASE}/health`)).status === 200) return;
    } catch { /* not listening yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('the server did not become ready');
});

async function post(pathname, body) {
  const r = await fetch(URL_BASE + pathname, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${API_KEY}` },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, json, text };
}

const personSchema = {
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 10 },
    age: { type: 'integer' },
    role: { enum: ['admin', 'user', 'guest'] },
    emails: { type: 'array', items: { type: 'string', format: 'email' }, maxItems: 2 },
    manager: { anyOf: [{ type: 'null' }, { $ref: '#/$defs/ref' }] },
  },
  required: ['name', 'age', 'role', 'emails', 'manager'],
  additionalProperties: false,
  $defs: { ref: { type: 'object', properties: { id: { type: 'integer' } }, required: ['id'], additionalProperties: false } },
};

test('response_format json_schema: every output parses and validates (stream and not)', async () => {
  const validate = ajv.compile(personSchema);
  for (let seed = 0; seed < 8; ++seed) {
    const req = {
      model: 'tiny', messages: msgs, seed, temperature: 1, max_tokens: 400,
      response_format: { type: 'json_schema', json_schema: { name: 'person', schema: personSchema, strict: true } },
    };
    const r = await client.chat.completions.create(req);
    assert.equal(r.choices[0].finish_reason, 'stop');
    const v = JSON.parse(r.choices[0].message.content);
    assert.ok(validate(v), `${r.choices[0].message.content}: ${ajv.errorsText(validate.errors)}`);
    // The stream concatenates to the same text.
    let text = '';
    for await (const chunk of await client.chat.completions.create({ ...req, stream: true }))
      text += chunk.choices[0]?.delta?.content ?? '';
    assert.equal(text, r.choices[0].message.content);
  }
});

test('response_format json_object and vLLM guided_* / structured_outputs', async () => {
  const obj = await client.chat.completions.create({
    model: 'tiny', messages: msgs, seed: 3, max_tokens: 60, response_format: { type: 'json_object' },
  });
  // Random weights rarely close an unconstrained object within 60 tokens; what was written is a JSON object prefix.
  assert.equal(obj.choices[0].message.content[0], '{');
  const choice = await client.completions.create({ model: 'tiny', prompt: 'Pick:', seed: 1, max_tokens: 20, guided_choice: ['alpha', 'beta', 'gamma'] });
  assert.ok(['alpha', 'beta', 'gamma'].includes(choice.choices[0].text));
  assert.equal(choice.choices[0].finish_reason, 'stop');
  const re = await client.completions.create({ model: 'tiny', prompt: 'Phone:', seed: 2, max_tokens: 30, guided_regex: '\\(\\d{3}\\) \\d{3}-\\d{4}' });
  assert.match(re.choices[0].text, /^\(\d{3}\) \d{3}-\d{4}$/);
  const so = await client.chat.completions.create({ model: 'tiny', messages: msgs, seed: 4, max_tokens: 40, structured_outputs: { grammar: 'root ::= "v" [0-9]{1,2} ("." [0-9]{1,2}){2}' } });
  assert.match(so.choices[0].message.content, /^v[0-9]{1,2}(\.[0-9]{1,2}){2}$/);
  const gj = await client.completions.create({ model: 'tiny', prompt: 'x', seed: 5, max_tokens: 50, guided_json: { type: 'array', items: { type: 'boolean' }, minItems: 1, maxItems: 3 } });
  const arr = JSON.parse(gj.choices[0].text);
  assert.ok(Array.isArray(arr) && arr.length >= 1 && arr.length <= 3 && arr.every((b) => typeof b === 'boolean'));
});

test('zodResponseFormat with chat.completions.parse', async () => {
  const Event = z.object({
    title: z.string().max(12),
    day: z.enum(['mon', 'tue', 'wed']),
    attendees: z.array(z.object({ name: z.string().max(6), vip: z.boolean() })).max(2),
    priority: z.number().int(),
  });
  for (let seed = 0; seed < 4; ++seed) {
    const r = await client.chat.completions.parse({
      model: 'tiny', messages: msgs, seed, max_tokens: 300, response_format: zodResponseFormat(Event, 'event'),
    });
    assert.equal(r.choices[0].finish_reason, 'stop');
    const parsed = r.choices[0].message.parsed;
    assert.ok(parsed, 'parsed is set');
    Event.parse(parsed);  // throws if it does not validate
  }
});

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Weather for a city',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string', minLength: 1, maxLength: 12 },
        days: { type: 'integer' },
        unit: { enum: ['c', 'f'] },
      },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
    strict: true,
  },
};
const timeTool = {
  type: 'function',
  function: { name: 'get_time', parameters: { type: 'object', properties: { zone: { type: 'string', maxLength: 8 } }, required: ['zone'] } },
};

async function streamedToolCalls(req) {
  const calls = [];
  let finish = null, content = '';
  for await (const chunk of await client.chat.completions.create({ ...req, stream: true })) {
    const c = chunk.choices[0];
    if (!c) continue;
    content += c.delta?.content ?? '';
    for (const tc of c.delta?.tool_calls ?? []) {
      calls[tc.index] ??= { id: '', name: '', arguments: '' };
      if (tc.id) calls[tc.index].id = tc.id;
      if (tc.function?.name) calls[tc.index].name += tc.function.name;
      if (tc.function?.arguments) calls[tc.index].arguments += tc.function.arguments;
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { calls, finish, content };
}

test('tools: tool_choice required and a named tool; arguments validate; stream == non-stream', async () => {
  const validators = { get_weather: ajv.compile(weatherTool.function.parameters), get_time: ajv.compile(timeTool.function.parameters) };
  const choices = ['required', { type: 'function', function: { name: 'get_time' } }];
  for (const tool_choice of choices) {
    for (let seed = 0; seed < 4; ++seed) {
      const req = { model: 'tiny', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools: [weatherTool, timeTool], tool_choice, seed, max_tokens: 600 };
      const r = await client.chat.completions.create(req);
      const ch = r.choices[0];
      assert.equal(ch.finish_reason, 'tool_calls', JSON.stringify(ch));
      assert.ok(ch.message.tool_calls.length >= 1);
      for (const tc of ch.message.tool_calls) {
        assert.equal(tc.type, 'function');
        assert.match(tc.id, /^call_[0-9a-f]{24}$/);
        if (typeof tool_choice === 'object') assert.equal(tc.function.name, 'get_time');
        const args = JSON.parse(tc.function.arguments);
        const v = validators[tc.function.name];
        assert.ok(v(args), `${tc.function.arguments}: ${ajv.errorsText(v.errors)}`);
      }
      const s = await streamedToolCalls(req);
      assert.equal(s.finish, 'tool_calls');
      assert.deepEqual(s.calls.map((c) => [c.name, c.arguments]), ch.message.tool_calls.map((c) => [c.function.name, c.function.arguments]));
      assert.ok(s.calls.every((c) => /^call_[0-9a-f]{24}$/.test(c.id)));
    }
  }
});

test('tools with tool_choice auto and none: output without DSML is content', async () => {
  const r = await client.chat.completions.create({ model: 'tiny', messages: msgs, tools: [weatherTool], seed: 1, max_tokens: 8, temperature: 0 });
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.deepEqual(r.choices[0].message.tool_calls, []);
  const n = await client.chat.completions.create({ model: 'tiny', messages: msgs, tools: [weatherTool], tool_choice: 'none', seed: 1, max_tokens: 8, temperature: 0 });
  assert.equal(n.choices[0].message.content, r.choices[0].message.content);
});

test('bad structured-output requests are 400s naming the field; a 1 MB schema is refused fast', async () => {
  const bad = [
    [{ messages: msgs, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: '(a' } } } }, 'response_format', /pattern/],
    [{ messages: msgs, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', patternProperties: {} } } } }, 'response_format', /unsupported JSON Schema keyword "patternProperties"/],
    [{ messages: msgs, guided_regex: '(?<=a)b' }, 'guided_regex', /lookaround/],
    [{ messages: msgs, guided_grammar: 'root ::= root "a"' }, 'guided_grammar', /left-recursive/],
    [{ messages: msgs, tools: [weatherTool], tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice', /unknown tool "nope"/],
    [{ messages: msgs, tools: [{ type: 'function', function: { name: 'f', parameters: [1] } }] }, 'tools', /parameters must be an object/],
    [{ messages: msgs, tools: [weatherTool], tool_choice: 'required', guided_regex: 'a' }, 'tool_choice', /cannot be combined/],
    [{ messages: msgs, guided_choice: ['a'], guided_regex: 'a' }, 'guided_choice', /only one/],
    [{ messages: msgs, tool_choice: 'sometimes' }, 'tool_choice', /tool_choice/],
  ];
  for (const [body, param, re] of bad) {
    const r = await post('/v1/chat/completions', { model: 'tiny', max_tokens: 5, ...body });
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.param, param, r.text);
    assert.match(r.json.error.message, re);
  }
  const huge = { type: 'object', properties: {}, additionalProperties: false };
  for (let i = 0; i < 20000; ++i) huge.properties[`property_number_${i}`] = { type: 'string', maxLength: 10 };
  const body = JSON.stringify({ model: 'tiny', messages: msgs, max_tokens: 5, response_format: { type: 'json_schema', json_schema: { name: 'h', schema: huge } } });
  assert.ok(body.length > 1_000_000);
  const r = await post('/v1/chat/completions', body);
  assert.equal(r.status, 400, r.text.slice(0, 300));
  assert.equal(r.json.error.param, 'response_format');
  assert.match(r.json.error.message, /more than the \d+ allowed/);
  // A large schema under the limit compiles and runs.
  const big = { type: 'object', properties: {}, required: [], additionalProperties: false };
  for (let i = 0; i < 3000; ++i) big.properties[`p${i}`] = { enum: [i] };
  big.required = ['p0'];
  const ok = await client.completions.create({ model: 'tiny', prompt: 'x', max_tokens: 30, seed: 1, guided_json: big });
  assert.match(ok.choices[0].text, /^\{"p0": 0/);
  const alive = await client.completions.create({ model: 'tiny', prompt: 'Still alive?', max_tokens: 4, temperature: 0 });
  assert.ok(alive.choices[0].text.length > 0);
});
