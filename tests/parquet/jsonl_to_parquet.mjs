// jsonl_to_parquet.mjs IN.jsonl OUT_DIR NAME SHARDS: chat records (id,
// messages [{role, content}], source) written as the hub serves a dataset
// split, by the independent writer (parquet-wasm; snappy, dictionary, data
// page v1, 16 rows a row group): OUT_DIR/NAME-0000k-of-0000SHARDS.parquet,
// the records in order, split into SHARDS nearly equal shards.
import * as arrow from 'apache-arrow';
import * as pq from 'parquet-wasm/esm';
import fs from 'fs';
import path from 'path';
import { fileURLToPath } from 'url';

pq.initSync({ module: fs.readFileSync(fileURLToPath(import.meta.resolve('parquet-wasm/esm/parquet_wasm_bg.wasm'))) });
const [input, out, name, shardsArg] = process.argv.slice(2);
const shards = Number(shardsArg);
if (!input || !out || !name || !(shards >= 1 && shards < 10)) {
    console.error('usage: jsonl_to_parquet.mjs IN.jsonl OUT_DIR NAME SHARDS (1-9)');
    process.exit(2);
}
const rows = fs.readFileSync(input, 'utf8').split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));
const props = () => new pq.WriterPropertiesBuilder().setCompression(pq.Compression.SNAPPY)
    .setDictionaryEnabled(true).setWriterVersion(pq.WriterVersion.V1).setMaxRowGroupSize(16).build();
const str = (rs, k) => arrow.vectorFromArray(rs.map((r) => r[k] ?? null), new arrow.Utf8());
const turns = new arrow.List(new arrow.Field('item', new arrow.Struct(
    [new arrow.Field('role', new arrow.Utf8(), true), new arrow.Field('content', new arrow.Utf8(), true)]), true));
fs.mkdirSync(out, { recursive: true });
const per = Math.ceil(rows.length / shards);
for (let k = 0; k < shards; k++) {
    const rs = rows.slice(k * per, (k + 1) * per);
    const cols = { id: str(rs, 'id'), messages: arrow.vectorFromArray(rs.map((r) => r.messages), turns),
                   source: str(rs, 'source') };
    const table = pq.Table.fromIPCStream(arrow.tableToIPC(new arrow.Table(cols), 'stream'));
    fs.writeFileSync(path.join(out, `${name}-0000${k}-of-0000${shards}.parquet`), pq.writeParquet(table, props()));
}
