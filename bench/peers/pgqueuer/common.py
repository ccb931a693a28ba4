"""What the PgQueuer peer's programs (bench.py, continuous.py) share: the
bench's settings, read from the environment."""

import os


def env(key: str) -> str:
    value = os.environ.get(key)
    if not value:
        raise SystemExit(f"{key} is not set")
    return value


URL = env("BENCH_DATABASE_URL")
