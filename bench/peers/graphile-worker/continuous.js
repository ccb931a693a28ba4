// graphile-worker on the continuous workload (see ../README.md and
// ../continuous.js): concurrentJobs = W, LISTEN/NOTIFY wake-up as shipped,
// a logger that keeps warnings and errors, addJob() per job, addJobs() for
// bulk.
const { run, makeWorkerUtils, Logger } = require("graphile-worker");
const version = require("graphile-worker/package.json").version;
const { url, workers, work, runCase } = require("../continuous");

let utils;
let runner;
// Warnings and errors to stderr; its default logs every job at INFO on
// stdout, which would cost it a line per job.
const logger = new Logger(() => (level, message) => {
  if (level === "warning" || level === "error") console.error(`[${level}] ${message}`);
});

runCase({
  version: `graphile-worker ${version}`,
  settings: () =>
    `concurrentJobs ${workers}, defaults otherwise (LISTEN/NOTIFY), warnings-only logger; addJob() per job, addJobs() for bulk`,
  start: async () => {
    utils = await makeWorkerUtils({ connectionString: url, logger });
    await utils.migrate();
    runner = await run({
      noHandleSignals: true,
      logger,
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
