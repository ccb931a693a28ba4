// pg-boss doing settled's per-creator work (see ../README.md).
// pg-boss 10 has no teamSize: W concurrent jobs are W calls of work().
// defaults: batchSize 1, polling every 2 s (as shipped).
// tuned: batchSize 1000 per fetch, polling every 0.5 s (the smallest allowed);
// a worker waits out the interval after every fetch, so at batchSize 100 it
// would be capped at 200 jobs/s.
const { Pool } = require("pg");
const PgBoss = require("pg-boss");
const version = require("pg-boss/package.json").version;
const { url, period, runId, workers, tuned, SETTLE, COUNT_LEFT, waitSettled, report } = require("../common");
const QUEUE = "settle";

async function main() {
  const pool = new Pool({ connectionString: url, max: workers + 2 });
  const boss = new PgBoss({ connectionString: url, max: workers + 4, supervise: false, schedule: false });
  boss.on("error", (e) => console.error(e));
  await boss.start();
  await boss.createQueue(QUEUE);
  const creators = (await pool.query("SELECT creator FROM settlement.token_trade_volume WHERE period = $1 ORDER BY creator", [period])).rows.map((r) => r.creator);
  const left = async () => Number((await pool.query(COUNT_LEFT, [period])).rows[0].n);

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
  const remaining = await waitSettled(left, started);
  const drained = process.hrtime.bigint();
  await boss.stop({ graceful: false, wait: false });
  await pool.end();
  const settings = tuned
    ? `${workers} x work(), batchSize 1000, pollingIntervalSeconds 0.5, insert() in batches of 5000`
    : `${workers} x work(), defaults otherwise (batchSize 1, polling 2 s), insert() in batches of 5000`;
  report({ started, enqueued, drained, creators: creators.length, remaining, version, settings });
  process.exit(0);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
