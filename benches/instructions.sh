#!/usr/bin/env bash
# Instructions per proxied request, duet against HAProxy, counted by valgrind's callgrind: the one CPU
# figure a noisy 2-core virtual machine reproduces to within a percent or two, where req/s moves by 30%.
#
#   benches/instructions.sh [SECONDS]       (default: 6 s of measured traffic per run)
#
# Installs valgrind, haproxy and wrk with apt if missing and builds duet in release mode. Four instant
# loopback backends; wrk -c8 (callgrind runs a program ~50x slower, so the proxy is the bottleneck).
# Each proxy runs under callgrind with one worker; after 2 s of warm-up its counters are zeroed
# (callgrind_control -z), then SECONDS of traffic are counted: user-space instructions of the whole
# process (the kernel's share, the same TCP work for every proxy, is not counted).
#   duet      the record configuration of benches/record.sh (p2c_peak_ewma, retries, admin listener), its
#             access log off (RUST_LOG=warn) and on (its default, RUST_LOG=info, to a file)
#   haproxy   balance leastconn, http-reuse always, no log
# Set DUET=/path/to/duet to count another build (a before/after pair).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-6}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

if ! command -v valgrind >/dev/null 2>&1 || [ ! -x /usr/sbin/haproxy ] || ! command -v wrk >/dev/null 2>&1; then
  echo "== installing valgrind, haproxy and wrk"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind haproxy wrk >/dev/null
fi
echo "== building duet (release)"
cargo build --release -q --bin duet --bin duet-backend
DUET=${DUET:-target/release/duet}
for port in 19501 19502 19503 19504; do
  target/release/duet-backend --listen "127.0.0.1:$port" --name "b$port" >/dev/null &
done

cat >"$WORK/duet.yaml" <<YAML
workers: 1
listeners: [ { address: 127.0.0.1:18500 } ]
admin: { address: 127.0.0.1:18509 }
routes:
  - match: { path_prefix: / }
    cluster: app
clusters:
  - name: app
    policy: p2c_peak_ewma
    backends: [ { address: 127.0.0.1:19501 }, { address: 127.0.0.1:19502 }, { address: 127.0.0.1:19503 }, { address: 127.0.0.1:19504 } ]
    retries: { attempts: 3, budget_percent: 20%, min_retries_per_second: 10 }
YAML
cat >"$WORK/haproxy.cfg" <<CONF
global
  nbthread 1
defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 30s
  http-reuse always
frontend app
  bind 127.0.0.1:18520
  default_backend app
backend app
  balance leastconn
  server b1 127.0.0.1:19501
  server b2 127.0.0.1:19502
  server b3 127.0.0.1:19503
  server b4 127.0.0.1:19504
CONF

wait_for() { # port
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "nothing listening on $1" >&2
  return 1
}

count() { # label port stop-signal command...
  local label=$1 port=$2 signal=$3
  shift 3
  rm -f "$WORK"/callgrind.out.*
  valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out.%p" "$@" >/dev/null 2>"$WORK/valgrind.err" &
  local pid=$!
  wait_for "$port"
  wrk -t1 -c8 -d2 "http://127.0.0.1:$port/" >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  local requests
  requests=$(wrk -t1 -c8 -d"$SECS" "http://127.0.0.1:$port/" | awk '/requests in/ {print $1}')
  kill "-$signal" "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  local total
  total=$(callgrind_annotate "$WORK"/callgrind.out.* 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  printf '  %-22s %8d requests  %7d instructions/request\n' "$label" "$requests" $((total / requests))
}

echo "== user-space instructions per request (callgrind, wrk -c8, ${SECS} s counted)"
RUST_LOG=warn count "duet (log off)" 18500 INT "$DUET" run --config "$WORK/duet.yaml"
RUST_LOG=info count "duet (log on)" 18500 INT "$DUET" run --config "$WORK/duet.yaml"
count "haproxy leastconn" 18520 TERM /usr/sbin/haproxy -f "$WORK/haproxy.cfg" -db
