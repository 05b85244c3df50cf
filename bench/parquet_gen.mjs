// parquet_gen.mjs OUT SIZE_MB: a tulu-shaped chat Parquet file of about
// SIZE_MB megabytes (id, messages list<struct<role, content>>, source),
// written by parquet-wasm's streaming writer (snappy, dictionary where it
// pays, row groups of 16384 rows) one Arrow record batch at a time, so the
// writer never holds the file. Contents are random letters: snappy leaves
// them about their size, so the file is about SIZE_MB.
import * as arrow from 'apache-arrow';
import * as pq from 'parquet-wasm/esm';
import fs from 'fs';
import { fileURLToPath } from 'url';

pq.initSync({ module: fs.readFileSync(fileURLToPath(import.meta.resolve('parquet-wasm/esm/parquet_wasm_bg.wasm'))) });
const [out, sizeMb] = [process.argv[2], Number(process.argv[3] || 1024)];
let seed = 7; // xorshift32 (exact in 32-bit integers, unlike an LCG in doubles)
const rnd = (n) => { seed ^= seed << 13; seed ^= seed >>> 17; seed ^= seed << 5; return (seed >>> 0) % n; };
// texts are slices of one pool of random letters at random places: snappy
// finds no repeats within its 64 KiB blocks
const letters = 'abcdefghijklmnopqrstuvwxyz      ';
const POOL = 1 << 24;
const pool = Array.from({ length: POOL / 4096 }, () =>
    Array.from({ length: 4096 }, () => letters[rnd(letters.length)]).join('')).join('');
const text = (n) => { const at = rnd(POOL - n); return pool.slice(at, at + n); };
const msgT = new arrow.List(new arrow.Field('item', new arrow.Struct(
    [new arrow.Field('role', new arrow.Utf8(), true), new arrow.Field('content', new arrow.Utf8(), true)]), true));
const ROWS = 4096;
let row = 0, bytes = 0;
const target = sizeMb * 1e6;
const batches = new ReadableStream({
    pull(ctrl) {
        if (bytes >= target) { ctrl.close(); return; }
        const rows = [];
        for (let i = 0; i < ROWS; i++, row++) {
            const m = [{ role: 'user', content: text(100 + rnd(200)) }, { role: 'assistant', content: text(200 + rnd(600)) }];
            bytes += m[0].content.length + m[1].content.length + 24;
            rows.push({ id: `row-${row}`, messages: m, source: ['tulu', 'flan', 'oasst'][rnd(3)] });
        }
        const t = new arrow.Table({
            id: arrow.vectorFromArray(rows.map((r) => r.id), new arrow.Utf8()),
            messages: arrow.vectorFromArray(rows.map((r) => r.messages), msgT),
            source: arrow.vectorFromArray(rows.map((r) => r.source), new arrow.Utf8()),
        });
        ctrl.enqueue(pq.Table.fromIPCStream(arrow.tableToIPC(t, 'stream')).recordBatch(0));
    },
});
const props = new pq.WriterPropertiesBuilder().setCompression(pq.Compression.SNAPPY).setMaxRowGroupSize(16384).build();
const stream = await pq.transformParquetStream(batches, props);
const fd = fs.openSync(out, 'w');
for await (const chunk of stream) fs.writeSync(fd, chunk);
fs.closeSync(fd);
console.log(`${row} rows, ${fs.statSync(out).size} bytes`);
