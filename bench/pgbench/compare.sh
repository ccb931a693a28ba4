#!/usr/bin/env bash
# The engine against the floor of its own SQL: `settled demo` and pgbench
# running the product's chunk statement (generated from the code by
# `settled lab pgbench-script`), back to back, on one server, same data size
# and concurrency. Prints each round and the medians and their ratio.
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/settled_bench bench/pgbench/compare.sh [ROUNDS] [CREATORS] [WORKERS] [LOOPS] [CHUNK]
#
# The database must exist; periods are taken fresh each round (going back in
# time), so it can be reused.
set -euo pipefail
ROUNDS=${1:-3}; CREATORS=${2:-100000}; WORKERS=${3:-4}; LOOPS=${4:-4}; CHUNK=${5:-100}
: "${DATABASE_URL:?set DATABASE_URL to the server to measure}"
here=$(cd "$(dirname "$0")" && pwd)
SETTLED=${SETTLED:-$here/../../target/release/settled}
CLIENTS=$((WORKERS * LOOPS))
# Enough chunk transactions for every item, plus slack for the empty claims at the end.
PER_CLIENT=$(( (CREATORS / CHUNK + CLIENTS) / CLIENTS + 2 ))
scripts=$(mktemp -d); trap 'rm -rf "$scripts"' EXIT
"$SETTLED" lab pgbench-script > "$scripts/settle_chunk.sql"

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
engine=(); floor=()
for round in $(seq 1 "$ROUNDS"); do
  rate=$("$SETTLED" demo --creators "$CREATORS" --workers "$WORKERS" --concurrency "$LOOPS" --chunk "$CHUNK" --json 2>/dev/null \
         | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["verified"]; print(d["creators_per_second"])')
  engine+=("$rate")

  period=$(psql "$DATABASE_URL" -Atc "SELECT min(period) - 1 FROM settlement.token_trade_volume")
  "$SETTLED" seed --period "$period" --creators "$CREATORS" --fee-bps 250 >/dev/null 2>&1
  run=$(psql "$DATABASE_URL" -qAtc "INSERT INTO settled_engine.runs (job, scope) VALUES ('creator-rewards', '$period') RETURNING id")
  start=$(date +%s.%N)
  pgbench -n -M prepared -c "$CLIENTS" -j 2 -t "$PER_CLIENT" -f "$scripts/settle_chunk.sql" \
          -D period="$period" -D run="$run" -D chunk="$CHUNK" "$DATABASE_URL" >/dev/null
  end=$(date +%s.%N)
  left=$(psql "$DATABASE_URL" -Atc "SELECT count(*) FROM settlement.token_trade_volume WHERE period = '$period' AND status <> 'settled'")
  [ "$left" = 0 ] || { echo "pgbench left $left items unsettled" >&2; exit 1; }
  psql "$DATABASE_URL" -qAtc "UPDATE settled_engine.runs SET state = 'finished', finished_at = now() WHERE id = $run"
  "$SETTLED" verify --period "$period" >/dev/null
  rate=$(python3 -c "print(int($CREATORS / ($end - $start)))")
  floor+=("$rate")
  echo "round $round: settled demo ${engine[-1]} creators/s, pgbench ${floor[-1]} creators/s"
done
e=$(printf '%s\n' "${engine[@]}" | median); f=$(printf '%s\n' "${floor[@]}" | median)
echo "median: settled $e creators/s, pgbench $f creators/s, ratio $(python3 -c "print(round($e / $f, 3))")"
