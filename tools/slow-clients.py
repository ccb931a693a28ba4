#!/usr/bin/env python3
"""Slow clients against `settled serve` (see docs/api.md, "Hostile clients").

Opens CONNECTIONS connections that each send a request head one byte every
INTERVAL seconds, for SECONDS seconds; a connection the server cuts is
opened again at once, so the attack stays at full strength. Meanwhile
/healthz is asked every 0.5 s on a fresh connection and the server's RSS is
read from /proc. Then, with the attack still on, SIGTERM is sent and the time
to exit measured. Standard library only.

  tools/slow-clients.py --base http://127.0.0.1:8080 --pid $(pgrep -f 'settled serve')
"""
import argparse
import os
import signal
import socket
import statistics
import threading
import time
import urllib.request

HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 4000 + b"\r\n\r\n"


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base", default="http://127.0.0.1:8080")
    p.add_argument("--pid", type=int, required=True, help="the serve process")
    p.add_argument("--connections", type=int, default=300)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--interval", type=float, default=3)
    a = p.parse_args()
    host, port = a.base.removeprefix("http://").split(":")
    stop = threading.Event()
    cuts = [0]
    lock = threading.Lock()

    def attacker():
        while not stop.is_set():
            try:
                s = socket.create_connection((host, int(port)), timeout=10)
            except OSError:
                time.sleep(0.1)
                continue
            s.settimeout(a.interval)
            i = 0
            try:
                while not stop.is_set() and i < len(HEAD) - 2:
                    s.send(HEAD[i : i + 1])
                    i += 1
                    try:
                        if s.recv(4096) == b"":
                            break  # the server closed it
                    except socket.timeout:
                        pass
            except OSError:
                pass
            finally:
                s.close()
            if not stop.is_set():
                with lock:
                    cuts[0] += 1

    threads = [threading.Thread(target=attacker, daemon=True) for _ in range(a.connections)]
    for t in threads:
        t.start()
    latencies, failures, peak = [], 0, rss_kib(a.pid)
    start = time.monotonic()
    while time.monotonic() - start < a.seconds:
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(f"{a.base}/healthz", timeout=10) as r:
                ok = r.status == 200
        except Exception:
            ok = False
        latencies.append(time.monotonic() - t0)
        failures += 0 if ok else 1
        peak = max(peak, rss_kib(a.pid))
        time.sleep(max(0, 0.5 - (time.monotonic() - t0)))
    latencies.sort()
    q = lambda x: latencies[min(len(latencies) - 1, int(x * len(latencies)))] * 1000
    print(f"slow connections: {a.connections}, one byte every {a.interval} s, for {a.seconds:.0f} s; cut and reopened: {cuts[0]}")
    print(f"/healthz: {len(latencies)} probes, {failures} failed, p50 {q(0.5):.1f} ms, p99 {q(0.99):.1f} ms, max {latencies[-1]*1000:.1f} ms")
    print(f"server RSS: peak {peak / 1024:.1f} MiB")
    t0 = time.monotonic()
    os.kill(a.pid, signal.SIGTERM)
    while True:
        try:
            os.kill(a.pid, 0)
            with open(f"/proc/{a.pid}/stat") as f:
                if f.read().split()[2] == "Z":
                    break
        except (ProcessLookupError, FileNotFoundError):
            break
        if time.monotonic() - t0 > 120:
            print("SIGTERM: still running after 120 s")
            return 1
        time.sleep(0.01)
    print(f"SIGTERM with {a.connections} slow connections open: exited after {time.monotonic() - t0:.2f} s")
    stop.set()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
