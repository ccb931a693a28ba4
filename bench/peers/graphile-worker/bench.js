// graphile-worker doing settled's per-creator work (see ../README.md).
// defaults: concurrentJobs = W, everything else as shipped.
// tuned: also localQueue (batch fetch of 100 jobs) and a 100 ms poll interval.
const { run, makeWorkerUtils } = require("graphile-worker");
const version = require("graphile-worker/package.json").version;
const { url, period, runId, workers, tuned, SETTLE, COUNT_LEFT, waitSettled, report } = require("../common");

async function main() {
  const utils = await makeWorkerUtils({ connectionString: url });
  await utils.migrate();
  const creators = await utils.withPgClient(async (c) =>
    (await c.query("SELECT creator FROM settlement.token_trade_volume WHERE period = $1 ORDER BY creator", [period])).rows.map((r) => r.creator),
  );
  const left = async () => utils.withPgClient(async (c) => Number((await c.query(COUNT_LEFT, [period])).rows[0].n));

  const started = process.hrtime.bigint();
  for (let i = 0; i < creators.length; i += 5000) {
    await utils.addJobs(creators.slice(i, i + 5000).map((creator) => ({ identifier: "settle", payload: { creator } })));
  }
  const enqueued = process.hrtime.bigint();

  const worker = { connectionString: url, concurrentJobs: workers, maxPoolSize: Math.max(10, workers + 2) };
  if (tuned) {
    worker.localQueue = { size: 100 };
    worker.pollInterval = 100;
  }
  const runner = await run({
    noHandleSignals: true,
    preset: { worker },
    taskList: {
      settle: async (payload, helpers) => {
        await helpers.withPgClient((c) => c.query(SETTLE, [period, payload.creator, runId]));
      },
    },
  });
  const remaining = await waitSettled(left, started);
  const drained = process.hrtime.bigint();
  await runner.stop();
  await utils.release();
  const settings = tuned
    ? `concurrentJobs ${workers}, localQueue.size 100, pollInterval 100 ms, addJobs in batches of 5000`
    : `concurrentJobs ${workers}, defaults otherwise, addJobs in batches of 5000`;
  report({ started, enqueued, drained, creators: creators.length, remaining, version, settings });
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
