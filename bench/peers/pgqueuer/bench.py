"""PgQueuer doing settled's per-creator work (see ../README.md).

W workers are W QueueManagers (each with its own connection, as W worker
processes would have), and the jobs' statements share a pool of W connections.
defaults: run() as shipped (batch_size 10; jobs of a batch run concurrently).
tuned: batch_size 100 per dequeue.
"""

import asyncio
import datetime
import json
import pathlib
import time

import asyncpg
import pgqueuer
from pgqueuer import AsyncpgDriver, QueueManager
from pgqueuer.models import Job
from pgqueuer.queries import Queries

from common import URL, env


PERIOD = datetime.date.fromisoformat(env("BENCH_PERIOD"))
RUN_ID = int(env("BENCH_RUN_ID"))
WORKERS = int(env("BENCH_WORKERS"))
TUNED = env("BENCH_CONFIG") == "tuned"
LIMIT_SECONDS = float(env("BENCH_TIME_LIMIT_SECONDS"))
SETTLE = (pathlib.Path(__file__).parent.parent / "settle_one.sql").read_text()
BATCH = 100 if TUNED else 10


async def main() -> None:
    conn = await asyncpg.connect(URL)
    queries = Queries(AsyncpgDriver(conn))
    await queries.install()
    pool = await asyncpg.create_pool(URL, min_size=WORKERS, max_size=WORKERS + 1)
    creators = [
        r["creator"]
        for r in await pool.fetch(
            "SELECT creator FROM settlement.token_trade_volume WHERE period = $1 ORDER BY creator", PERIOD
        )
    ]

    async def left() -> int:
        return await pool.fetchval(
            "SELECT count(*) FROM settlement.token_trade_volume WHERE period = $1 AND status <> 'settled'", PERIOD
        )

    started = time.perf_counter()
    for i in range(0, len(creators), 5000):
        part = creators[i : i + 5000]
        await queries.enqueue(["settle"] * len(part), [c.encode() for c in part], [0] * len(part))
    enqueued = time.perf_counter()

    async def settle(job: Job) -> None:
        await pool.execute(SETTLE, PERIOD, job.payload.decode(), RUN_ID)

    worker_conns = [await asyncpg.connect(URL) for _ in range(WORKERS)]
    managers = []
    for c in worker_conns:
        qm = QueueManager(Queries(AsyncpgDriver(c)))
        qm.entrypoint("settle")(settle)
        managers.append(qm)

    running = [
        asyncio.create_task(qm.run(batch_size=BATCH, dequeue_timeout=datetime.timedelta(seconds=1))) for qm in managers
    ]
    remaining = await left()
    while remaining > 0 and time.perf_counter() - started < LIMIT_SECONDS:
        await asyncio.sleep(0.02)
        remaining = await left()
    drained = time.perf_counter()
    for qm in managers:
        qm.shutdown.set()
    await asyncio.wait_for(asyncio.gather(*running), timeout=30)
    await pool.close()
    await conn.close()
    for c in worker_conns:
        await c.close()
    settings = f"{WORKERS} QueueManagers, run(batch_size={BATCH}), job statements on a pool of {WORKERS}, enqueue() in batches of 5000"
    print(
        json.dumps(
            {
                "enqueue_seconds": enqueued - started,
                "drain_seconds": drained - enqueued,
                "settled": len(creators) - remaining,
                "version": pgqueuer.__version__,
                "settings": settings,
            }
        )
    )


asyncio.run(main())
