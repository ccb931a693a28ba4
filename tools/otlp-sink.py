#!/usr/bin/env python3
"""An OTLP/HTTP trace receiver that keeps nothing: it answers every
`POST /v1/traces` with 200 and an empty ExportTraceServiceResponse, and on
SIGINT or SIGTERM prints how many export requests and bytes it took. For
measuring what exporting spans costs settled (docs/operations.md, "Traces"):

    tools/otlp-sink.py --port 4318 &
    settled --otlp-endpoint http://127.0.0.1:4318 bench --payouts ...
"""

import argparse
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

counts = {"requests": 0, "bytes": 0}
lock = threading.Lock()


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        self.rfile.read(length)
        if self.path != "/v1/traces":
            self.send_response(404)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        with lock:
            counts["requests"] += 1
            counts["bytes"] += length
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=4318)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Sink)

    def stop(*_):
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve_forever()
    print(f"otlp-sink: {counts['requests']} export requests, {counts['bytes']} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
