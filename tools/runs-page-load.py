#!/usr/bin/env python3
"""Costly pages against payouts (see docs/api.md, "Hostile clients").

READERS threads fetch GET /runs/{id} in a loop (a fresh connection each),
while one client makes payouts one after another (new Idempotency-Key each)
and another asks /healthz every 0.2 s, for SECONDS seconds. Prints the
latencies (p50/p99/max) and answers of each. Standard library only.

  tools/runs-page-load.py --base http://127.0.0.1:8080 --run-id 1 \
      --creator 0x... --token "$SETTLED_API_TOKEN"
"""
import argparse
import json
import threading
import time
import urllib.error
import urllib.request
import uuid


def timed(request, timeout=60):
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    except Exception:
        status = 0
    return time.monotonic() - t0, status


def summary(name, samples):
    lat = sorted(s[0] for s in samples)
    if not lat:
        return f"{name}: none"
    q = lambda x: lat[min(len(lat) - 1, int(x * len(lat)))] * 1000
    statuses = {}
    for _, st in samples:
        statuses[st] = statuses.get(st, 0) + 1
    return f"{name}: {len(lat)} requests, answers {dict(sorted(statuses.items()))}, p50 {q(0.5):.1f} ms, p99 {q(0.99):.1f} ms, max {lat[-1]*1000:.1f} ms"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base", default="http://127.0.0.1:8080")
    p.add_argument("--run-id", type=int, required=True)
    p.add_argument("--creator", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--readers", type=int, default=100)
    p.add_argument("--seconds", type=float, default=30)
    a = p.parse_args()
    stop = threading.Event()
    pages, payouts, health = [], [], []

    def reader():
        while not stop.is_set():
            pages.append(timed(f"{a.base}/runs/{a.run_id}"))

    def payer():
        while not stop.is_set():
            body = json.dumps({"creator": a.creator, "amount": "1"}).encode()
            req = urllib.request.Request(f"{a.base}/v1/payouts", data=body, method="POST", headers={
                "Authorization": f"Bearer {a.token}", "Content-Type": "application/json",
                "Idempotency-Key": str(uuid.uuid4())})
            payouts.append(timed(req))

    def prober():
        while not stop.is_set():
            health.append(timed(f"{a.base}/healthz"))
            time.sleep(0.2)

    threads = [threading.Thread(target=reader) for _ in range(a.readers)]
    threads += [threading.Thread(target=payer), threading.Thread(target=prober)]
    for t in threads:
        t.start()
    time.sleep(a.seconds)
    stop.set()
    for t in threads:
        t.join()
    print(f"{a.readers} readers of /runs/{a.run_id} for {a.seconds:.0f} s")
    print(summary("GET /runs/{id}", pages))
    print(summary("POST /v1/payouts", payouts))
    print(summary("GET /healthz", health))


if __name__ == "__main__":
    main()
