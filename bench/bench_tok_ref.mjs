// Hugging Face's tokenizers (the Rust library, through its Node binding) on
// the same corpus as bench_tok, one text at a time on one thread
// (TOKENIZERS_PARALLELISM=false), median of `runs`, MB/s.
// Usage: TOK_NODE_MODULES=DIR node bench_tok_ref.mjs TOKENIZER_JSON CORPUS.jsonl [runs]
import { createRequire } from 'node:module';
import fs from 'node:fs';
const require = createRequire(process.env.TOK_NODE_MODULES + '/');
const { Tokenizer } = require('tokenizers');

const t0 = performance.now();
const tok = Tokenizer.fromFile(process.argv[2]);
const load = (performance.now() - t0) / 1000;
const texts = fs.readFileSync(process.argv[3], 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l).text);
const bytes = texts.reduce((s, t) => s + Buffer.byteLength(t), 0);
const runs = Number(process.argv[4] || 5);
const secs = [];
let tokens = 0;
for (let r = 0; r < runs; r++) {
  const s0 = performance.now();
  tokens = 0;
  for (const t of texts) tokens += (await tok.encode(t, null, { addSpecialTokens: false })).getIds().length;
  secs.push((performance.now() - s0) / 1000);
}
secs.sort((a, b) => a - b);
const med = secs[Math.floor(runs / 2)];
console.log(JSON.stringify({ tokenizer: process.argv[2], reference: 'huggingface tokenizers (node)', load_s: +load.toFixed(3), bytes, tokens, threads: 1, seconds: +med.toFixed(4), mb_per_s: +(bytes / med / 1e6).toFixed(2) }));
