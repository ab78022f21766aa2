#!/usr/bin/env bash
# Full TLS handshakes on one worker (issue #45): duet and nginx terminating TLS 1.3 with the same ECDSA
# P-256 certificate, side by side in one run, on loopback.
#
#   benches/tls_handshakes.sh [REPETITIONS] [SECONDS]   (defaults: 5 repetitions of 10 s per server)
#   NO_BUILD=1 benches/tls_handshakes.sh                uses target/release/duet as it is
#
# Installs nginx-light and openssl with apt if missing and builds duet in release mode. The certificate
# (self-signed, P-256) is made by openssl in a scratch directory removed at the end.
#   duet   workers 1, one listener with `tls: { cert, key, min_version: "1.3" }`, admin listener on,
#          access log off (RUST_LOG=warn)
#   nginx  worker_processes 1, `ssl_protocols TLSv1.3`, no session cache and no tickets, access log off
#   client `openssl s_time -new -tls1_3` for SECONDS: a new connection and a full handshake each time
#          (no resumption, no request), key exchange as OpenSSL offers it first (X25519)
# Each server is pinned to CPU 0 and the client to CPU 1; in each repetition duet and nginx go in turn,
# each a fresh process. One s_time client is about as busy as the server it talks to, so handshakes per
# second says as much of the client as of the server: the server's own CPU per handshake (utime + stime
# from /proc, before and after) is the figure to compare. Reported: per run, handshakes/s and the
# server's CPU µs per handshake; then the medians, and the medians of the per-repetition ratios
# duet/nginx. duet's handshakes are checked against its duet_tls_handshakes_total (success + closed).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}
SECS=${2:-10}
WORK=$(mktemp -d)
SERVER_PID=""
trap 'kill $(jobs -p) $SERVER_PID 2>/dev/null || true; rm -rf "$WORK"' EXIT

if [ ! -x /usr/sbin/nginx ] || ! command -v openssl >/dev/null 2>&1; then
  echo "== installing nginx-light and openssl"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light openssl >/dev/null
fi
if [ -z "${NO_BUILD:-}" ]; then
  echo "== building duet (release)"
  cargo build --release -q --bin duet
fi
source "$(dirname "$0")/proc_cpu.sh"
for port in 18420 18429 18430; do refuse_taken "$port"; done

echo "== P-256 certificate (openssl, in $WORK)"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=bench.test \
  -addext subjectAltName=DNS:bench.test -keyout "$WORK/site.key" -out "$WORK/site.pem" 2>/dev/null

cat >"$WORK/duet.yaml" <<YAML
workers: 1
listeners:
  - address: 127.0.0.1:18420
    tls: { cert: $WORK/site.pem, key: $WORK/site.key, min_version: "1.3" }
admin: { address: 127.0.0.1:18429 }
routes: [ { cluster: app } ]
clusters:
  - name: app
    backends: [ { address: 127.0.0.1:9 } ]
YAML
mkdir -p "$WORK/nginx/logs"
cat >"$WORK/nginx/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  server {
    listen 127.0.0.1:18430 ssl;
    ssl_certificate $WORK/site.pem;
    ssl_certificate_key $WORK/site.key;
    ssl_protocols TLSv1.3;
    ssl_session_cache off;
    ssl_session_tickets off;
    location / { return 200 "hello, bench\n"; }
  }
}
CONF

start() { # duet|nginx -> pid (its output never to our stdout)
  case $1 in
    duet)
      RUST_LOG=warn taskset -c 0 target/release/duet run --config "$WORK/duet.yaml" >/dev/null 2>"$WORK/duet.err" &
      echo $! ;;
    nginx)
      taskset -c 0 /usr/sbin/nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" >/dev/null 2>"$WORK/nginx.err" &
      echo $! ;;
  esac
}
port() { case $1 in duet) echo 18420 ;; nginx) echo 18430 ;; esac; }

measure() { # server pid -> "handshakes/s cpu_us_per_handshake handshakes"
  local before after out
  before=$(cpu_ticks "$2")
  out=$(taskset -c 1 timeout $((SECS + 30)) openssl s_time -connect "127.0.0.1:$(port "$1")" -new -tls1_3 \
    -time "$SECS" 2>&1)
  after=$(cpu_ticks "$2")
  python3 -c '
import re, sys
text = sys.stdin.read()
before, after = [int(x) for x in sys.argv[1].split()], [int(x) for x in sys.argv[2].split()]
ticks = after[0] - before[0] + after[1] - before[1]
found = re.search(r"(\d+) connections in ([\d.]+) real seconds", text)
if not found:
    sys.exit("no s_time summary in: " + text)
total, seconds = int(found.group(1)), float(found.group(2))
print(total / seconds, ticks / 100 * 1e6 / max(total, 1), total)' "$before" "$after" <<<"$out"
}

counted() { # -> the handshakes duet answered, from its /metrics: s_time closes as soon as it has the
  # server's Finished, often before duet has read the client's, so most count as `closed` (duet's work,
  # the signature and the key exchange, was done all the same)
  curl -sf http://127.0.0.1:18429/metrics |
    awk '/^duet_tls_handshakes_total/ && /result="(success|closed)"/ { n += $NF } END { print n + 0 }'
}

RESULTS="$WORK/results.txt"
printf "%-4s %-6s %14s %18s %12s\n" rep server handshakes/s "CPU us/handshake" handshakes
for rep in $(seq 1 "$REPS"); do
  for server in duet nginx; do
    refuse_taken "$(port "$server")"
    pid=$(start "$server")
    SERVER_PID=$pid
    wait_for "$(port "$server")"
    read -r rate cpu total <<<"$(measure "$server" "$pid")"
    if [ "$server" = duet ]; then
      seen=$(counted)
      # The readiness probe above is one more `closed`.
      [ "$seen" -ge "$total" ] || { echo "duet counted $seen handshakes, s_time made $total" >&2; exit 1; }
    fi
    printf "%-4s %-6s %14.0f %18.1f %12s\n" "$rep" "$server" "$rate" "$cpu" "$total"
    echo "$rep $server $rate $cpu" >>"$RESULTS"
    stop "$pid"
  done
done

python3 - "$RESULTS" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    rep, server, rate, cpu = line.split()
    runs.setdefault(rep, {})[server] = (float(rate), float(cpu))
for i, name in [(0, "handshakes/s"), (1, "CPU us/handshake")]:
    per = {s: statistics.median(r[s][i] for r in runs.values()) for s in ("duet", "nginx")}
    ratio = statistics.median(r["duet"][i] / r["nginx"][i] for r in runs.values())
    print(f"median {name}: duet {per['duet']:.1f}, nginx {per['nginx']:.1f}; "
          f"median of per-repetition ratios duet/nginx {ratio:.2f}")
PY
