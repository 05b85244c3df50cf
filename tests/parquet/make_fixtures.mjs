// make_fixtures.mjs OUT_DIR: the small Parquet files the unit tests
// (tests/unit/test_sft.c) and the e2e test (tests/e2e/test_parquet.sh) read,
// written by the independent writer (parquet-wasm) as the hub's files are
// (snappy, dictionary, data page v1), with the same records as JSONL beside
// them:
//   chat-0000{0,1}-of-00002.parquet  chat.jsonl   tulu-shaped: id, messages, source
//   sharegpt.parquet  sharegpt.jsonl (the ShareGPT rows as `messages`)
//   nested.parquet    messages as list<list<string>>: a shape not read
// Committed under tests/parquet/fixtures (run by hand to remake them).
import * as arrow from 'apache-arrow';
import * as pq from 'parquet-wasm/esm';
import fs from 'fs';
import path from 'path';
import { fileURLToPath } from 'url';

pq.initSync({ module: fs.readFileSync(fileURLToPath(import.meta.resolve('parquet-wasm/esm/parquet_wasm_bg.wasm'))) });
const out = process.argv[2];
fs.mkdirSync(out, { recursive: true });
const props = () => new pq.WriterPropertiesBuilder().setCompression(pq.Compression.SNAPPY)
    .setDictionaryEnabled(true).setWriterVersion(pq.WriterVersion.V1).setMaxRowGroupSize(4).build();
const str = (rows, k) => arrow.vectorFromArray(rows.map((r) => r[k]), new arrow.Utf8());
const turnsT = (a, b) => new arrow.List(new arrow.Field('item', new arrow.Struct(
    [new arrow.Field(a, new arrow.Utf8(), true), new arrow.Field(b, new arrow.Utf8(), true)]), true));
const write = (file, cols) => fs.writeFileSync(path.join(out, file),
    pq.writeParquet(pq.Table.fromIPCStream(arrow.tableToIPC(new arrow.Table(cols), 'stream')), props()));

const topics = ['the sea', 'Zürich', 'prime numbers', '東京', 'bread', 'the moon ☾', 'rivers', 'chess', 'tea', 'owls'];
const chat = topics.map((t, i) => ({
    id: `ex-${i}`,
    messages: [
        ...(i % 3 === 0 ? [{ role: 'system', content: 'You are brief.' }] : []),
        { role: 'user', content: `Tell me about ${t}.` },
        { role: 'assistant', content: `${t} is a fine subject; here is one fact about ${t}.` },
        ...(i % 2 === 0 ? [{ role: 'user', content: 'More?' }, { role: 'assistant', content: `No more on ${t}.` }] : []),
    ],
    source: i % 2 ? 'flan' : 'oasst',
}));
for (const [k, rows] of [[0, chat.slice(0, 6)], [1, chat.slice(6)]])
    write(`chat-0000${k}-of-00002.parquet`,
          { id: str(rows, 'id'), messages: arrow.vectorFromArray(rows.map((r) => r.messages), turnsT('role', 'content')),
            source: str(rows, 'source') });
fs.writeFileSync(path.join(out, 'chat.jsonl'), chat.map((r) => JSON.stringify(r)).join('\n') + '\n');

const from = { system: 'system', user: 'human', assistant: 'gpt' };
const share = chat.slice(0, 5).map((r) => ({ id: r.id, conversations: r.messages.map((m) => ({ from: from[m.role], value: m.content })) }));
write('sharegpt.parquet', { id: str(share, 'id'),
                            conversations: arrow.vectorFromArray(share.map((r) => r.conversations), turnsT('from', 'value')) });
fs.writeFileSync(path.join(out, 'sharegpt.jsonl'),
                 chat.slice(0, 5).map((r) => JSON.stringify({ messages: r.messages })).join('\n') + '\n');
// a messages column of a shape the reader leaves out (a list of lists)
const nested = [{ messages: [['user', 'hi'], ['assistant', 'hello']] }];
write('nested.parquet', { messages: arrow.vectorFromArray(nested.map((r) => r.messages),
    new arrow.List(new arrow.Field('item', new arrow.List(new arrow.Field('item', new arrow.Utf8(), true)), true))) });
console.log('fixtures written');
