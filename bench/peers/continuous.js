// What the Node peers' `continuous` scripts share (see README.md): the
// case in the environment, the stdin protocol (GO, ENQUEUE n, STOP), the
// two producers, and the job's work: take the start time, sleep, write one
// row into bench.effects (which has no unique key, so a repeat is counted).
const readline = require("readline");
// The peer's own copy of node-postgres (the script runs in the peer's directory).
const { Pool } = require(require.resolve("pg", { paths: [process.cwd()] }));

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};

const url = env("BENCH_DATABASE_URL");
const workers = Number(env("BENCH_WORKERS"));
const producer = env("BENCH_PRODUCER");
const depth = Number(env("BENCH_DEPTH"));
const workMs = Number(env("BENCH_WORK_MS"));
// The saturating producer's largest bulk enqueue.
const BULK_MAX = 500;

// Microseconds since the epoch (the host's clock, as the server's).
const nowUs = () => Math.round((performance.timeOrigin + performance.now()) * 1000);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const effects = new Pool({ connectionString: url, max: workers + 2 });
const counts = { enqueued: 0, started: 0 };

// The handler's body, given the job's payload.
async function work(payload) {
  const startedUs = nowUs();
  counts.started += 1;
  await sleep(workMs);
  await effects.query("INSERT INTO bench.effects (job, enq_us, started_us) VALUES ($1, $2, $3)", [
    payload.job,
    payload.enq_us,
    startedUs,
  ]);
}

const nextPayload = () => {
  counts.enqueued += 1;
  return { job: String(counts.enqueued), enq_us: nowUs() };
};

// Runs the case: `start()` installs the peer and starts W workers calling
// `work(payload)`; `one(payload)` and `many(payloads)` are the peer's own
// enqueue calls; `stop()` stops its workers.
async function runCase({ start, one, many, stop, version, settings }) {
  await start();
  console.log("ready");
  const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  const first = await lines.next();
  if (first.done || first.value.trim() !== "GO") throw new Error(`expected GO, got ${first.value}`);
  let stopped = false;
  const pending = new Set();
  const saturating = (async () => {
    while (producer === "saturation" && !stopped) {
      const backlog = counts.enqueued - counts.started;
      if (backlog >= depth) {
        await sleep(2);
        continue;
      }
      const n = Math.min(depth - backlog, BULK_MAX);
      await many(Array.from({ length: n }, nextPayload));
    }
  })();
  for (;;) {
    const { value, done } = await lines.next();
    if (done || value.trim() === "STOP") break;
    const m = /^ENQUEUE (\d+)$/.exec(value.trim());
    if (!m) continue;
    for (let i = 0; i < Number(m[1]); i++) {
      const p = one(nextPayload());
      pending.add(p);
      p.finally(() => pending.delete(p));
    }
  }
  stopped = true;
  await saturating;
  await Promise.all([...pending]);
  await stop();
  await effects.end();
  console.log(JSON.stringify({ version, settings: settings(), enqueued: counts.enqueued }));
  process.exit(0);
}

module.exports = { url, workers, producer, work, runCase };
