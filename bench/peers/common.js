// What the Node peers share: the case settled bench describes in the
// environment (see README.md), the one-creator settlement, the wait for the
// period to be settled (or the time limit), and the JSON line they print.
const fs = require("fs");
const path = require("path");

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};

const seconds = (from, to) => Number(to - from) / 1e9;

module.exports = {
  url: env("BENCH_DATABASE_URL"),
  period: env("BENCH_PERIOD"),
  runId: env("BENCH_RUN_ID"),
  workers: Number(env("BENCH_WORKERS")),
  tuned: env("BENCH_CONFIG") === "tuned",
  limitSeconds: Number(env("BENCH_TIME_LIMIT_SECONDS")),
  SETTLE: fs.readFileSync(path.join(__dirname, "settle_one.sql"), "utf8"),
  COUNT_LEFT: "SELECT count(*) AS n FROM settlement.token_trade_volume WHERE period = $1 AND status <> 'settled'",

  // Polls `left()` until nothing is left or the limit (from `started`) passes.
  async waitSettled(left, started) {
    let remaining = await left();
    while (remaining > 0 && seconds(started, process.hrtime.bigint()) < module.exports.limitSeconds) {
      await new Promise((r) => setTimeout(r, 20));
      remaining = await left();
    }
    return remaining;
  },

  report({ started, enqueued, drained, creators, remaining, version, settings }) {
    console.log(JSON.stringify({
      enqueue_seconds: seconds(started, enqueued),
      drain_seconds: seconds(enqueued, drained),
      settled: creators - remaining,
      version,
      settings,
    }));
  },
};
