"""PgQueuer on the continuous workload (see ../README.md).

One QueueManager on its own connection (LISTEN/NOTIFY wake-up, as shipped),
run(batch_size=W): W jobs per dequeue, the jobs of a batch run
concurrently. Its caps on jobs at once (an entrypoint's
concurrency_limit, run()'s max_concurrent_tasks) are enforced in its
dequeue query and cost it 5x to 10x its throughput here, so it runs
uncapped: at times more than W jobs at once. enqueue() per job on a pool driver, enqueue() with
lists for bulk. Each job: take the start time,
sleep BENCH_WORK_MS, write one row into bench.effects.
"""

import asyncio
import datetime
import json
import sys
import time
import urllib.parse

import asyncpg
import pgqueuer
from pgqueuer import AsyncpgDriver, AsyncpgPoolDriver, QueueManager
from pgqueuer.models import Job
from pgqueuer.queries import Queries

from common import URL, env

BULK_MAX = 500


def connect_args() -> dict:
    """asyncpg's keywords for BENCH_DATABASE_URL (a `host=` query names a
    socket directory, which asyncpg takes only as a keyword)."""
    parts = urllib.parse.urlsplit(URL)
    query = urllib.parse.parse_qs(parts.query)
    return {
        "host": query["host"][0] if "host" in query else parts.hostname,
        "port": parts.port or 5432,
        "user": parts.username,
        "password": parts.password,
        "database": parts.path.lstrip("/"),
    }


CONNECT = connect_args()
WORKERS = int(env("BENCH_WORKERS"))
PRODUCER = env("BENCH_PRODUCER")
DEPTH = int(env("BENCH_DEPTH"))
WORK_S = int(env("BENCH_WORK_MS")) / 1000.0
counts = {"enqueued": 0, "started": 0}


def now_us() -> int:
    return time.time_ns() // 1000


def next_payload() -> bytes:
    counts["enqueued"] += 1
    return json.dumps({"job": str(counts["enqueued"]), "enq_us": now_us()}).encode()


async def read_line(reader: asyncio.StreamReader) -> str | None:
    line = await reader.readline()
    return line.decode().strip() if line else None


async def main() -> None:
    setup = await asyncpg.connect(**CONNECT)
    await Queries(AsyncpgDriver(setup)).install()
    await setup.close()
    effects = await asyncpg.create_pool(**CONNECT, min_size=1, max_size=WORKERS + 2)
    producer_pool = await asyncpg.create_pool(**CONNECT, min_size=1, max_size=8)
    producer = Queries(AsyncpgPoolDriver(producer_pool))
    worker_conn = await asyncpg.connect(**CONNECT)
    qm = QueueManager(Queries(AsyncpgDriver(worker_conn)))

    @qm.entrypoint("bench")
    async def bench(job: Job) -> None:
        started_us = now_us()
        counts["started"] += 1
        payload = json.loads(job.payload)
        await asyncio.sleep(WORK_S)
        await effects.execute(
            "INSERT INTO bench.effects (job, enq_us, started_us) VALUES ($1, $2, $3)",
            payload["job"],
            payload["enq_us"],
            started_us,
        )

    running = asyncio.create_task(qm.run(dequeue_timeout=datetime.timedelta(seconds=1), batch_size=WORKERS))
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print("ready", flush=True)
    if await read_line(reader) != "GO":
        raise SystemExit("expected GO")
    stopped = False

    async def saturate() -> None:
        while PRODUCER == "saturation" and not stopped:
            backlog = counts["enqueued"] - counts["started"]
            if backlog >= DEPTH:
                await asyncio.sleep(0.002)
                continue
            n = min(DEPTH - backlog, BULK_MAX)
            payloads = [next_payload() for _ in range(n)]
            await producer.enqueue(["bench"] * n, payloads, [0] * n)

    saturating = asyncio.create_task(saturate())
    pending = set()
    while True:
        line = await read_line(reader)
        if line is None or line == "STOP":
            break
        if line.startswith("ENQUEUE "):
            for _ in range(int(line.split()[1])):
                task = asyncio.create_task(producer.enqueue("bench", next_payload(), 0))
                pending.add(task)
                task.add_done_callback(pending.discard)
    stopped = True
    await saturating
    if pending:
        await asyncio.gather(*pending)
    qm.shutdown.set()
    await asyncio.wait_for(running, timeout=30)
    await worker_conn.close()
    await producer_pool.close()
    await effects.close()
    settings = (
        f"1 QueueManager, run(batch_size={WORKERS}), no cap on jobs at once, LISTEN/NOTIFY; "
        "enqueue() per job, enqueue() with lists for bulk"
    )
    print(json.dumps({"version": f"pgqueuer {pgqueuer.__version__}", "settings": settings, "enqueued": counts["enqueued"]}))


asyncio.run(main())
