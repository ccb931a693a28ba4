// pg-boss doing settled's per-creator work (see ../README.md).
// pg-boss 10 has no teamSize: W concurrent jobs are W calls of work().
// defaults: batchSize 1, polling every 2 s (as shipped).
// tuned: batchSize 1000 per fetch, polling every 0.5 s (the smallest allowed);
// a worker waits out the interval after every fetch, so at batchSize 100 it
// would be capped at 200 jobs/s.
const fs = require("fs");
const path = require("path");
const { Pool } = require("pg");
const PgBoss = require("pg-boss");
const version = require("pg-boss/package.json").version;

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
const url = env("BENCH_DATABASE_URL");
const period = env("BENCH_PERIOD");
const runId = env("BENCH_RUN_ID");
const workers = Number(env("BENCH_WORKERS"));
const tuned = env("BENCH_CONFIG") === "tuned";
const limitSeconds = Number(env("BENCH_TIME_LIMIT_SECONDS"));
const SETTLE = fs.readFileSync(path.join(__dirname, "..", "settle_one.sql"), "utf8");
const QUEUE = "settle";

async function main() {
  const pool = new Pool({ connectionString: url, max: workers + 2 });
  const boss = new PgBoss({ connectionString: url, max: workers + 4, supervise: false, schedule: false });
  boss.on("error", (e) => console.error(e));
  await boss.start();
  await boss.createQueue(QUEUE);
  const creators = (await pool.query("SELECT creator FROM settlement.token_trade_volume WHERE period = $1 ORDER BY creator", [period])).rows.map((r) => r.creator);
  const left = async () =>
    Number((await pool.query("SELECT count(*) AS n FROM settlement.token_trade_volume WHERE period = $1 AND status <> 'settled'", [period])).rows[0].n);

  const started = process.hrtime.bigint();
  for (let i = 0; i < creators.length; i += 5000) {
    await boss.insert(creators.slice(i, i + 5000).map((creator) => ({ name: QUEUE, data: { creator } })));
  }
  const enqueued = process.hrtime.bigint();

  const options = tuned ? { batchSize: 1000, pollingIntervalSeconds: 0.5 } : {};
  const handler = async (jobs) => {
    for (const job of jobs) {
      await pool.query(SETTLE, [period, job.data.creator, runId]);
    }
  };
  for (let i = 0; i < workers; i++) await boss.work(QUEUE, options, handler);
  // Until every item is settled, or the time limit (then the rate is of what got done).
  let remaining = await left();
  while (remaining > 0 && Number(process.hrtime.bigint() - started) / 1e9 < limitSeconds) {
    await new Promise((r) => setTimeout(r, 20));
    remaining = await left();
  }
  const drained = process.hrtime.bigint();
  await boss.stop({ graceful: false, wait: false });
  await pool.end();
  const settings = tuned
    ? `${workers} x work(), batchSize 1000, pollingIntervalSeconds 0.5, insert() in batches of 5000`
    : `${workers} x work(), defaults otherwise (batchSize 1, polling 2 s), insert() in batches of 5000`;
  console.log(JSON.stringify({
    enqueue_seconds: Number(enqueued - started) / 1e9,
    drain_seconds: Number(drained - enqueued) / 1e9,
    settled: creators.length - remaining,
    version,
    settings,
  }));
  process.exit(0);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
