// make_parquet.mjs OUT_DIR: Parquet files written by an independent writer
// (parquet-wasm: the Rust `parquet` crate of Apache Arrow, compiled to
// WebAssembly; the rows built as Arrow tables with apache-arrow) and, beside
// each NAME.parquet, NAME.jsonl: the rows the writer was given, one JSON
// object a line, as accumd's reader must give them back.
// Files: {chat, prompt_completion, text} x {none, snappy, gzip, zstd} x
// {dictionary, plain} x {data page v1, v2}, 64 rows a row group, pages of at
// most 512 bytes written 16 values at a time (so every column has several
// row groups and pages), with nulls, empty lists, null list elements and
// structs, and non-ASCII text (2-, 3- and 4-byte UTF-8).
import * as arrow from 'apache-arrow';
import * as pq from 'parquet-wasm/esm';
import fs from 'fs';
import path from 'path';
import { fileURLToPath } from 'url';

pq.initSync({ module: fs.readFileSync(fileURLToPath(import.meta.resolve('parquet-wasm/esm/parquet_wasm_bg.wasm'))) });

const out = process.argv[2];
let seed = 12345;
const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
const words = ['hello', 'héllo', 'wörld', '✓ done', '中文文本', 'emoji 😀🎉', 'tab\there', 'line\nbreak',
               'quote "q"', 'back\\slash', 'Ω≈ç√', 'plain', 'ascii text', 'zürich', ''];
const sentence = (n) => Array.from({ length: n }, () => words[rnd(words.length)]).join(' ');
const N = 300;

function chatRows() {
    const rows = [];
    for (let i = 0; i < N; i++) {
        let messages;
        const k = rnd(20);
        if (k === 0) messages = null;
        else if (k === 1) messages = [];
        else {
            messages = [];
            const turns = 1 + rnd(4);
            if (rnd(3) === 0) messages.push({ role: 'system', content: sentence(3) });
            for (let t = 0; t < turns; t++) {
                messages.push({ role: 'user', content: sentence(1 + rnd(8)) });
                messages.push({ role: 'assistant', content: k === 2 && t === 0 ? null : sentence(1 + rnd(30)) });
            }
            if (k === 3) messages.push(null);
        }
        rows.push({
            id: rnd(10) === 0 ? null : `row-${i}`,
            messages,
            source: rnd(7) === 0 ? null : ['tulu', 'flan', 'oasst', 'sharegpt'][rnd(4)],
            turns: messages ? messages.length : null,
            tokens: rnd(5) === 0 ? null : 2 ** 40 + i * 7,
            score: rnd(6) === 0 ? null : (rnd(1000) - 500) / 8,
            ok: rnd(4) === 0 ? null : rnd(2) === 1,
            tags: rnd(5) === 0 ? null : Array.from({ length: rnd(4) }, () => (rnd(6) === 0 ? null : words[rnd(5)])),
        });
    }
    return rows;
}

function chatTable(rows) {
    const msgT = new arrow.Struct([new arrow.Field('role', new arrow.Utf8(), true),
                                   new arrow.Field('content', new arrow.Utf8(), true)]);
    return new arrow.Table({
        id: arrow.vectorFromArray(rows.map((r) => r.id), new arrow.Utf8()),
        messages: arrow.vectorFromArray(rows.map((r) => r.messages), new arrow.List(new arrow.Field('item', msgT, true))),
        source: arrow.vectorFromArray(rows.map((r) => r.source), new arrow.Utf8()),
        turns: arrow.vectorFromArray(rows.map((r) => r.turns), new arrow.Int32()),
        tokens: arrow.vectorFromArray(rows.map((r) => (r.tokens === null ? null : BigInt(r.tokens))), new arrow.Int64()),
        score: arrow.vectorFromArray(rows.map((r) => r.score), new arrow.Float64()),
        ok: arrow.vectorFromArray(rows.map((r) => r.ok), new arrow.Bool()),
        tags: arrow.vectorFromArray(rows.map((r) => r.tags), new arrow.List(new arrow.Field('item', new arrow.Utf8(), true))),
    });
}

function pcRows() {
    return Array.from({ length: N }, (_, i) => ({
        prompt: sentence(1 + rnd(10)),
        completion: rnd(15) === 0 ? null : sentence(1 + rnd(40)),
        weight: rnd(3) === 0 ? null : rnd(64) / 4,
    }));
}

function pcTable(rows) {
    return new arrow.Table({
        prompt: arrow.vectorFromArray(rows.map((r) => r.prompt), new arrow.Utf8()),
        completion: arrow.vectorFromArray(rows.map((r) => r.completion), new arrow.Utf8()),
        weight: arrow.vectorFromArray(rows.map((r) => r.weight), new arrow.Float32()),
    });
}

function textRows() {
    return Array.from({ length: N }, () => ({ text: rnd(12) === 0 ? null : sentence(1 + rnd(60)) }));
}

function textTable(rows) {
    return new arrow.Table({ text: arrow.vectorFromArray(rows.map((r) => r.text), new arrow.Utf8()) });
}

const sets = [['chat', chatRows(), chatTable], ['prompt_completion', pcRows(), pcTable], ['text', textRows(), textTable]];
const codecs = [['none', pq.Compression.UNCOMPRESSED], ['snappy', pq.Compression.SNAPPY],
                ['gzip', pq.Compression.GZIP], ['zstd', pq.Compression.ZSTD]];
fs.mkdirSync(out, { recursive: true });
let files = 0;
for (const [name, rows, table] of sets) {
    const ipc = arrow.tableToIPC(table(rows), 'stream');
    const lines = rows.map((r) => JSON.stringify(r)).join('\n') + '\n';
    for (const [cname, codec] of codecs)
        for (const dict of [true, false])
            for (const [vname, version] of [['v1', pq.WriterVersion.V1], ['v2', pq.WriterVersion.V2]]) {
                // plain: PLAIN values, spelled out (with data page v2 the
                // writer's own fallback would be the DELTA encodings)
                let b = new pq.WriterPropertiesBuilder();
                if (!dict) b = b.setEncoding(pq.Encoding.PLAIN);
                const props = b
                    .setCompression(codec)
                    .setDictionaryEnabled(dict)
                    .setWriterVersion(version)
                    .setMaxRowGroupSize(64)
                    .setDataPageSizeLimit(512)
                    .setWriteBatchSize(16)
                    .build();
                const base = path.join(out, `${name}-${cname}-${dict ? 'dict' : 'plain'}-${vname}`);
                fs.writeFileSync(base + '.parquet', pq.writeParquet(pq.Table.fromIPCStream(ipc), props));
                fs.writeFileSync(base + '.jsonl', lines);
                files++;
            }
}
console.log(`${files} files`);
