#!/usr/bin/env bash
# What the parts of the chunk statement cost: the same million settled by
# variants of the product's statement, each from four pgbench clients alone
# on their key ranges, and by the set-based floor (statement-cost/floor.sql)
# in one transaction, in rounds with the order rotating, every case copied
# from one vacuumed template. Prints each case's seconds and the medians.
# `product` is the statement a worker sends inside a key range on the
# period's partition, generated from the code (`settled lab pgbench-script
# --range`); the other forms are made from it here: `upsert` credits the
# balances with one INSERT ... ON CONFLICT (creator) DO UPDATE, as the
# statement did before 2026-12-03; `no-lock` leaves out the claim's FOR NO
# KEY UPDATE ... SKIP LOCKED (for measurement only: without the lock two
# workers could take the same row; each client here is alone on its range).
#
#   PGHOST=127.0.0.1 PGPORT=5432 PGUSER=postgres bench/pgbench/statement-cost.sh [ROUNDS] [CREATORS] [CHUNK]
#
# Creates the databases statement_cost_tpl and statement_cost_run on that
# server and drops them at the end. Needs psql, pgbench and a release build
# of settled (SETTLED= to point elsewhere).
set -euo pipefail
ROUNDS=${1:-3}; CREATORS=${2:-1000000}; CHUNK=${3:-5000}; CLIENTS=4
PERIOD=2026-12-01
here=$(cd "$(dirname "$0")" && pwd)
SETTLED=${SETTLED:-$here/../../target/release/settled}
VARIANTS=(product upsert no-lock)
tpl=statement_cost_tpl; db=statement_cost_run
base="postgres://${PGUSER:-postgres}@${PGHOST:-127.0.0.1}:${PGPORT:-5432}"
cleanup() { psql -qd postgres -c "DROP DATABASE IF EXISTS $db" -c "DROP DATABASE IF EXISTS $tpl" 2>/dev/null || true; }
trap cleanup EXIT

cleanup
psql -qd postgres -c "CREATE DATABASE $tpl"
DATABASE_URL="$base/$tpl" "$SETTLED" seed --period "$PERIOD" --creators "$CREATORS" >/dev/null
run=$(DATABASE_URL="$base/$tpl" "$SETTLED" run --period "$PERIOD" | sed -n 's/^started run \([0-9]*\) .*/\1/p')
[ -n "$run" ] || { echo "no run started" >&2; exit 1; }
psql -qd "$tpl" -c "VACUUM ANALYZE"
# Each client's upper key: the period's key quantiles.
mapfile -t uppers < <(psql -Atd "$tpl" -c "SELECT max(creator) FROM (SELECT creator, ntile($CLIENTS) OVER (ORDER BY creator) AS n
                                                       FROM settlement.token_trade_volume WHERE period = '$PERIOD') r
                                           GROUP BY n ORDER BY n")
per_client=$(( CREATORS / CLIENTS / CHUNK + 2 ))
scripts=$(mktemp -d); trap 'cleanup; rm -rf "$scripts"' EXIT
DATABASE_URL="$base/$tpl" "$SETTLED" lab pgbench-script --range --period "$PERIOD" > "$scripts/product.sql"
perl -0pe 's/\n\s*FOR NO KEY UPDATE OF t SKIP LOCKED\)/)/' "$scripts/product.sql" > "$scripts/no-lock.sql"
perl -0pe 's/\n\s*raised AS \(.*?\n\s*effects AS \(SELECT creator FROM raised UNION ALL SELECT creator FROM opened\)\n/
 effects AS (
   INSERT INTO settlement.creator_balance AS b (creator, balance)
   SELECT creator, amount FROM credited ORDER BY creator
   ON CONFLICT (creator) DO UPDATE
   SET balance = b.balance + EXCLUDED.balance, updated_at = now()
   RETURNING creator)
/s' "$scripts/product.sql" > "$scripts/upsert.sql"
! grep -q "SKIP LOCKED" "$scripts/no-lock.sql" || { echo "no-lock.sql still locks" >&2; exit 1; }
grep -q "ON CONFLICT (creator)" "$scripts/upsert.sql" || { echo "upsert.sql was not made" >&2; exit 1; }

fresh() {
  psql -qd postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db TEMPLATE $tpl"
  psql -qd "$db" -c "VACUUM ANALYZE"
  psql -qd postgres -c "CHECKPOINT"
}
settled_all() {
  local left; left=$(psql -Atd "$db" -c "SELECT count(*) FROM settlement.token_trade_volume WHERE period = '$PERIOD' AND status <> 'settled'")
  [ "$left" = 0 ] || { echo "$1 left $left items unsettled" >&2; exit 1; }
}
case_seconds() { # variant
  fresh
  local start end lo=0x pids=()
  start=$(date +%s.%N)
  if [ "$1" = floor ]; then
    psql -qd "$db" -v ON_ERROR_STOP=1 -v period="$PERIOD" -v run="$run" -f "$here/statement-cost/floor.sql" >/dev/null
  else
    for hi in "${uppers[@]}"; do
      pgbench -n -M prepared -c 1 -t "$per_client" -f "$scripts/$1.sql" \
        -D period="$PERIOD" -D run="$run" -D chunk="$CHUNK" -D lo="$lo" -D hi="$hi" "$db" >/dev/null &
      pids+=($!); lo=$hi
    done
    for pid in "${pids[@]}"; do wait "$pid"; done
  fi
  end=$(date +%s.%N)
  settled_all "$1"
  python3 -c "print(f'{$end - $start:.2f}')"
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
cases=(floor "${VARIANTS[@]}")
declare -A times
for round in $(seq 1 "$ROUNDS"); do
  line="round $round:"
  for i in "${!cases[@]}"; do
    c=${cases[$(( (i + round - 1) % ${#cases[@]} ))]}
    s=$(case_seconds "$c"); times[$c]+="$s "; line+=" $c $s s,"
  done
  echo "${line%,}"
done
floor=$(echo ${times[floor]} | tr ' ' '\n' | median)
for c in "${cases[@]}"; do
  m=$(echo ${times[$c]} | tr ' ' '\n' | median)
  python3 -c "print(f'$c: median $m s, {$floor / $m:.3f} of the floor\'s speed')"
done
