// graphile-worker on the continuous workload (see ../README.md and
// ../continuous.js): concurrentJobs = W, LISTEN/NOTIFY wake-up as shipped,
// addJob() per job, addJobs() for bulk.
const { run, makeWorkerUtils } = require("graphile-worker");
const version = require("graphile-worker/package.json").version;
const { url, workers, work, runCase } = require("../continuous");

let utils;
let runner;

runCase({
  version: `graphile-worker ${version}`,
  settings: () => `concurrentJobs ${workers}, defaults otherwise (LISTEN/NOTIFY); addJob() per job, addJobs() for bulk`,
  start: async () => {
    utils = await makeWorkerUtils({ connectionString: url });
    await utils.migrate();
    runner = await run({
      noHandleSignals: true,
      preset: { worker: { connectionString: url, concurrentJobs: workers, maxPoolSize: Math.max(10, workers + 2) } },
      taskList: { bench: async (payload) => work(payload) },
    });
  },
  one: (payload) => utils.addJob("bench", payload),
  many: (payloads) => utils.addJobs(payloads.map((payload) => ({ identifier: "bench", payload }))),
  stop: async () => {
    await runner.stop();
    await utils.release();
  },
}).catch((e) => {
  console.error(e);
  process.exit(1);
});
