// The reference: Hugging Face's tokenizers (the Rust library transformers
// uses, through its Node binding) on each line of a JSONL file, printing
// what tok_dump prints. Usage: node tok_ref.mjs TOKENIZER_JSON INPUT.jsonl
import { createRequire } from 'node:module';
import fs from 'node:fs';
import readline from 'node:readline';
const require = createRequire(process.env.TOK_NODE_MODULES + '/');
const { Tokenizer } = require('tokenizers');

const tok = Tokenizer.fromFile(process.argv[2]);
const rl = readline.createInterface({ input: fs.createReadStream(process.argv[3]), crlfDelay: Infinity });
const out = [];
for await (const line of rl) {
  if (!line) continue;
  const text = JSON.parse(line).text;
  const a = await tok.encode(text, null, { addSpecialTokens: false });
  const b = await tok.encode(text, null, { addSpecialTokens: true });
  const ids = Array.from(a.getIds());
  const decoded = await tok.decode(ids, false);
  out.push(JSON.stringify({ ids, ids_special: Array.from(b.getIds()), decoded }));
}
process.stdout.write(out.join('\n') + '\n');
