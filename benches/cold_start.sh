#!/usr/bin/env bash
# A cold cluster (issue #43, item 5): the share of a fresh duet's first 600 requests that goes to the
# slow one of three loopback backends of 2, 2 and 20 ms, 8 at a time: one HTTP/2 connection
# (h2load -c1 -m8) and eight HTTP/1.1 connections (h2load --h1 -c8), each run against a new duet
# process, counted from duet's own duet_backend_picks_total.
#
#   benches/cold_start.sh [REPETITIONS] [DUET_BINARY]
#   (defaults: 5 repetitions, target/release/duet; POLICY=p2c_inflight (or any) in the environment
#   changes the cluster's policy, WORKERS=N its workers, DELAY=S waits S seconds before the load)
# Needs h2load (nghttp2-client) and curl; builds duet-backend in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}
DUET=${2:-target/release/duet}
POLICY=${POLICY:-p2c_peak_ewma}
WORKERS=${WORKERS:-1}
cargo build --release -q --bin duet-backend
W=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$W"' EXIT
for spec in 18710:2:a 18711:2:b 18712:20:slow; do
  IFS=: read -r port delay name <<<"$spec"
  target/release/duet-backend --listen "127.0.0.1:$port" --name "$name" --delay-ms "$delay" >/dev/null &
  pids+=($!)
done
cat >"$W/duet.yaml" <<YAML
workers: $WORKERS
listeners:
  - { address: 127.0.0.1:18700 }
admin: { address: 127.0.0.1:18709 }
routes:
  - match: { path_prefix: / }
    cluster: app
clusters:
  - name: app
    policy: $POLICY
    backends: [ { address: 127.0.0.1:18710 }, { address: 127.0.0.1:18711 }, { address: 127.0.0.1:18712 } ]
YAML
sleep 0.5
for mode in h2 h1; do
  shares=()
  for _ in $(seq "$REPS"); do
    RUST_LOG=warn "$DUET" run --config "$W/duet.yaml" >/dev/null 2>"$W/err" &
    duet=$!
    for _ in $(seq 500); do curl -s -o /dev/null http://127.0.0.1:18709/healthz && break; sleep 0.01; done
    sleep "${DELAY:-0}"
    if [ "$mode" = h2 ]; then
      h2load -n600 -c1 -m8 http://127.0.0.1:18700/x >/dev/null
    else
      h2load --h1 -n600 -c8 -m1 http://127.0.0.1:18700/x >/dev/null
    fi
    picks=$(curl -s http://127.0.0.1:18709/metrics | grep '^duet_backend_picks_total')
    slow=$(echo "$picks" | grep 18712 | awk '{s += $NF} END {print s}')
    all=$(echo "$picks" | awk '{s += $NF} END {print s}')
    shares+=("$(awk -v s="$slow" -v a="$all" 'BEGIN {printf "%.1f", 100 * s / a}')")
    kill "$duet"
    wait "$duet" 2>/dev/null || true
  done
  echo "$mode $POLICY workers=$WORKERS: the 20 ms backend's share of the first 600 requests (%): ${shares[*]}"
done
