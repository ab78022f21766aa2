#!/usr/bin/env bash
# Load benchmark: duet against nginx, side by side in one run, on loopback.
#
#   benches/load.sh [REPETITIONS] [SECONDS]      (defaults: 5 repetitions of 8 s per proxy and scenario)
#   DUET_BASELINE=/path/to/older/duet benches/load.sh
#                                                also runs an older duet build in the same run and reports
#                                                this build against it (for a change's before and after)
#
# Installs nginx-light and wrk with apt if missing, builds duet in release mode, starts loopback backends
# (crates/testbed's duet-backend), and runs, alternating duet and nginx in each repetition:
#   throughput  two instant backends, 64 keep-alive connections: requests/s
#   slow        two 1 ms backends and one 10 ms backend, 32 connections: p99 latency
# Both proxies get one worker, pinned to CPU 0; wrk and the backends share CPU 1. nginx uses upstream
# keep-alive and `random two least_conn` (its P2C) for the slow scenario. The machine is noisy: the
# summary reports the median of the per-repetition ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}
SECONDS_PER_RUN=${2:-8}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

need() { command -v "$1" >/dev/null 2>&1; }
if ! need wrk || ! need nginx; then
  echo "== installing nginx-light and wrk"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light wrk >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

echo "== building duet (release)"
cargo build --release -q --bin duet --bin duet-backend

backend() { # port name delay_ms
  taskset -c 1 target/release/duet-backend --listen "127.0.0.1:$1" --name "$2" --delay-ms "$3" >/dev/null &
}
backend 19101 fast-1 0
backend 19102 fast-2 0
backend 19111 fast-1 1
backend 19112 fast-2 1
backend 19113 slow 10

cat > "$WORK/duet.yaml" <<YAML
workers: 1
listeners:
  - address: 127.0.0.1:18080
  - address: 127.0.0.1:18081
routes:
  - match: { host: "throughput" }
    cluster: throughput
  - match: { host: "slow" }
    cluster: slow
clusters:
  - name: throughput
    policy: p2c_peak_ewma
    backends: [ { address: 127.0.0.1:19101 }, { address: 127.0.0.1:19102 } ]
  - name: slow
    policy: p2c_peak_ewma
    backends: [ { address: 127.0.0.1:19111 }, { address: 127.0.0.1:19112 }, { address: 127.0.0.1:19113 } ]
YAML

mkdir -p "$WORK/nginx/logs"
cat > "$WORK/nginx/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  upstream throughput { server 127.0.0.1:19101; server 127.0.0.1:19102; keepalive 128; }
  upstream slow { random two least_conn; server 127.0.0.1:19111; server 127.0.0.1:19112; server 127.0.0.1:19113; keepalive 128; }
  server {
    listen 127.0.0.1:18090;
    location / { proxy_pass http://throughput; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
  server {
    listen 127.0.0.1:18091;
    location / { proxy_pass http://slow; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
CONF

RUST_LOG=warn taskset -c 0 target/release/duet run --config "$WORK/duet.yaml" 2>"$WORK/duet.log" &
BASELINE=${DUET_BASELINE:-}
if [ -n "$BASELINE" ]; then
  sed 's/1808\([01]\)/1818\1/' "$WORK/duet.yaml" >"$WORK/baseline.yaml"
  RUST_LOG=warn taskset -c 0 "$BASELINE" run --config "$WORK/baseline.yaml" 2>"$WORK/baseline.log" &
fi
taskset -c 0 "$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" 2>"$WORK/nginx.err" &
sleep 1
for url in "-H Host:throughput http://127.0.0.1:18080/" "http://127.0.0.1:18090/"; do
  curl -sf $url >/dev/null || { echo "a proxy is not answering: $url"; cat "$WORK"/*.log "$WORK"/*.err; exit 1; }
done

run_wrk() { # connections host url -> "rps p99_ms"
  taskset -c 1 wrk -t1 -c"$1" -d"${SECONDS_PER_RUN}s" --latency -H "Host: $2" "$3" | python3 -c '
import re, sys
text = sys.stdin.read()
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
m = re.search(r"99%\s+([\d.]+)(us|ms|s)\b", text)
scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
errors = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
print(rps, float(m.group(1)) * scale, errors.group(1) if errors else 0)'
}

printf "%-4s %-10s %12s %12s %10s %10s\n" rep scenario duet_rps nginx_rps duet_p99 nginx_p99
RESULTS="$WORK/results.txt"
for rep in $(seq 1 "$REPS"); do
  read -r d_rps d_p99 d_err <<<"$(run_wrk 64 throughput http://127.0.0.1:18080/)"
  read -r n_rps n_p99 n_err <<<"$(run_wrk 64 throughput http://127.0.0.1:18090/)"
  printf "%-4s %-10s %12.0f %12.0f %9.2fms %9.2fms\n" "$rep" throughput "$d_rps" "$n_rps" "$d_p99" "$n_p99"
  echo "throughput $d_rps $n_rps $d_p99 $n_p99 $d_err $n_err" >>"$RESULTS"
  read -r d_rps d_p99 d_err <<<"$(run_wrk 32 slow http://127.0.0.1:18081/)"
  read -r n_rps n_p99 n_err <<<"$(run_wrk 32 slow http://127.0.0.1:18091/)"
  printf "%-4s %-10s %12.0f %12.0f %9.2fms %9.2fms\n" "$rep" slow "$d_rps" "$n_rps" "$d_p99" "$n_p99"
  echo "slow $d_rps $n_rps $d_p99 $n_p99 $d_err $n_err" >>"$RESULTS"
  if [ -n "$BASELINE" ]; then
    read -r b_rps b_p99 b_err <<<"$(run_wrk 64 throughput http://127.0.0.1:18180/)"
    read -r d2_rps d2_p99 d2_err <<<"$(run_wrk 64 throughput http://127.0.0.1:18080/)"
    printf "%-4s %-10s %12.0f %12.0f (this build, baseline)\n" "$rep" throughput "$d2_rps" "$b_rps"
    echo "baseline $d2_rps $b_rps $d2_p99 $b_p99 $d2_err $b_err" >>"$RESULTS"
  fi
done

python3 - "$RESULTS" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
def median(scenario, f):
    return statistics.median(f(*map(float, r[1:])) for r in rows if r[0] == scenario)
print()
print("median throughput ratio duet/nginx (requests/s, higher is better): %.2f" % median("throughput", lambda d, n, dp, np_, de, ne: d / n))
print("median p99 ratio duet/nginx with one slow backend (lower is better): %.2f" % median("slow", lambda d, n, dp, np_, de, ne: dp / np_))
print("median requests/s ratio duet/nginx with one slow backend: %.2f" % median("slow", lambda d, n, dp, np_, de, ne: d / n))
if any(r[0] == "baseline" for r in rows):
    print("median throughput ratio this build/baseline build (requests/s): %.2f" % median("baseline", lambda d, b, dp, bp, de, be: d / b))
errors = sum(int(float(r[5])) + int(float(r[6])) for r in rows)
print("non-2xx responses across all runs: %d" % errors)
PY
