#!/usr/bin/env python3
"""Runs `settled lab harness-adapter` in the public job-queue benchmark's
long-horizon shape, paced by this script as the benchmark's runner paces it
(`ENQUEUE n` lines on stdin, PRODUCER_PACING=harness), on a fresh database
of its own, and prints what the adapter reported after a warm-up: the
median completion rate (and its share of the offered rate) and the median
and largest claim p99 over the samples.

    tools/harness-shape.py --settled target/release/settled --mode leased \\
        --rate 2000 --workers 16 --seconds 60

One line of JSON on stdout; the adapter's samples with --samples. The
database is made on DATABASE_URL's server (default: the local one) and
dropped at the end; only processes this script started are stopped.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid


def admin_psql(base_url, sql):
    subprocess.run(["psql", "-q", "-X", base_url, "-c", sql], check=True, stdout=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settled", default="target/release/settled")
    ap.add_argument("--mode", choices=["tx", "leased"], required=True)
    ap.add_argument("--rate", type=int, required=True, help="jobs offered per second")
    ap.add_argument("--workers", type=int, required=True, help="WORKER_COUNT")
    ap.add_argument("--seconds", type=int, default=60, help="run length, warm-up included")
    ap.add_argument("--warmup", type=int, default=15, help="seconds of samples left out")
    ap.add_argument("--batch", type=int, help="SETTLED_BATCH (unset: the adapter's default)")
    ap.add_argument("--ticks", type=int, default=50, help="ENQUEUE lines per second")
    ap.add_argument("--samples", action="store_true", help="print every sample to stderr")
    args = ap.parse_args()

    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    name = "harness_shape_" + uuid.uuid4().hex[:10]
    parts = urllib.parse.urlsplit(base)
    url = urllib.parse.urlunsplit(parts._replace(path="/" + name))
    admin_psql(base, f"CREATE DATABASE {name}")
    env = dict(os.environ)
    env.update(
        DATABASE_URL=url,
        PRODUCER_PACING="harness",
        PRODUCER_MODE="fixed",
        PRODUCER_RATE=str(args.rate),
        PRODUCER_BATCH_MAX=str(max(1, args.rate)),
        WORKER_COUNT=str(args.workers),
        JOB_WORK_MS="1",
        SAMPLE_EVERY_S="5",
        SETTLED_LOG="warn",
    )
    env.pop("SETTLED_BATCH", None)
    if args.batch:
        env["SETTLED_BATCH"] = str(args.batch)
    proc = subprocess.Popen(
        [args.settled, "lab", "harness-adapter", "--mode", args.mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    samples = []
    started = time.monotonic()

    def read():
        for line in proc.stdout:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if doc.get("metric"):
                samples.append((time.monotonic() - started, doc["metric"], doc.get("value")))
                if args.samples:
                    print(line.strip(), file=sys.stderr)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    per_tick = args.rate / args.ticks
    owed = 0.0
    next_at = time.monotonic()
    try:
        while time.monotonic() - started < args.seconds:
            owed += per_tick
            n = int(owed)
            owed -= n
            if n:
                proc.stdin.write(f"ENQUEUE {n}\n")
                proc.stdin.flush()
            next_at += 1.0 / args.ticks
            time.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
        admin_psql(base, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def values(metric):
        return [v for (t, m, v) in samples if m == metric and t >= args.warmup and v is not None]

    done = values("completion_rate")
    p99 = values("claim_p99_ms")
    depth = values("queue_depth")
    report = {
        "mode": args.mode,
        "offered_per_s": args.rate,
        "workers": args.workers,
        "batch": args.batch or "default",
        "samples": len(done),
        "completion_median_per_s": round(statistics.median(done), 1) if done else None,
        "completion_share": round(statistics.median(done) / args.rate, 3) if done else None,
        "claim_p99_median_ms": round(statistics.median(p99), 1) if p99 else None,
        "claim_p99_max_ms": round(max(p99), 1) if p99 else None,
        "depth_last": depth[-1] if depth else None,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
