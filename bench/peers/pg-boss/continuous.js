// pg-boss on the continuous workload (see ../README.md and ../continuous.js).
// W workers are W work() calls with batchSize 1 and the fastest polling
// pg-boss allows (0.5 s). pg-boss 10 has no LISTEN: a worker that found
// nothing, or finished its job in under the interval, waits out the
// interval unless notified, so the producer (in the same process) calls
// notifyWorker() on every worker after each of its enqueue calls, the
// documented way to bypass the polling interval. Maintenance as shipped.
const PgBoss = require("pg-boss");
const version = require("pg-boss/package.json").version;
const { url, workers, work, runCase } = require("../continuous");
const QUEUE = "bench";

const boss = new PgBoss({ connectionString: url, max: workers + 4, schedule: false });
boss.on("error", (e) => console.error(e));
const ids = [];
const notifyAll = () => ids.forEach((id) => boss.notifyWorker(id));

runCase({
  version: `pg-boss ${version}`,
  settings: () =>
    `${workers} x work() (batchSize 1, pollingIntervalSeconds 0.5), notifyWorker() after each enqueue call; send() per job, insert() for bulk`,
  start: async () => {
    await boss.start();
    await boss.createQueue(QUEUE);
    for (let i = 0; i < workers; i++) {
      ids.push(
        await boss.work(QUEUE, { batchSize: 1, pollingIntervalSeconds: 0.5 }, async ([job]) => {
          await work(job.data);
        }),
      );
    }
  },
  one: async (payload) => {
    await boss.send(QUEUE, payload);
    notifyAll();
  },
  many: async (payloads) => {
    await boss.insert(payloads.map((data) => ({ name: QUEUE, data })));
    notifyAll();
  },
  stop: () => boss.stop({ graceful: true, wait: true, timeout: 10000 }),
}).catch((e) => {
  console.error(e);
  process.exit(1);
});
