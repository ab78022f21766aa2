#!/usr/bin/env bash
# gRPC unary calls through duet and HAProxy side by side (issue #50): h2load sends gRPC-framed POSTs
# (`/bench.Echo/Unary`, a 100-byte message, `content-type: application/grpc`, `te: trailers`) over h2c to
# each proxy, which speaks h2 to the same four python3-grpcio backends (benches/grpc_backend.py, an echo
# through grpcio's C core). Calls per second and the proxy's CPU per call (its utime + stime from /proc
# over the run, over the calls h2load saw answered 200).
#
#   benches/grpc_unary.sh [REPETITIONS] [SECONDS] [STREAMS]     (defaults: 3, 5, 10)
#   OFFSET=N moves every port by N; DUET=path another duet build.
#
#   duet     workers 1, p2c_peak_ewma, `protocol: h2` to the backends, access log off, RUST_LOG=warn
#   HAProxy  nbthread 1, balance leastconn, http-reuse always, `bind ... proto h2`, `server ... proto h2`
# Each proxy is pinned to CPU 0; the backends and h2load (-t1 -c8 -m STREAMS) share CPU 1, so the
# backends, not the proxy, bound the rate: compare CPU per call. In each repetition duet and HAProxy
# run in turn, each a fresh process; one call through each is checked first with python3-grpcio's
# client (the echo must come back whole).
#
# Needs haproxy, nghttp2-client (h2load) and python3-grpcio (apt).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}; SECS=${2:-5}; STREAMS=${3:-10}; OFFSET=${OFFSET:-0}
DUET=${DUET:-target/release/duet}
[ -x "$DUET" ] || cargo build --release -q --bin duet
WORK=$(mktemp -d)
PROXY_PID=""
trap 'kill $(jobs -p) $PROXY_PID 2>/dev/null || true; rm -rf "$WORK"' EXIT
BACKENDS=""
for i in 1 2 3 4; do
  port=$((19350 + i + OFFSET))
  taskset -c 1 python3 benches/grpc_backend.py "127.0.0.1:$port" >/dev/null 2>&1 &
  BACKENDS="$BACKENDS $port"
done
python3 -c "import struct, sys; sys.stdout.buffer.write(b'\x00' + struct.pack('>I', 100) + b'x' * 100)" >"$WORK/call.bin"
cat >"$WORK/check.py" <<'PY'
import sys, grpc
channel = grpc.insecure_channel(sys.argv[1])
call = channel.unary_unary("/bench.Echo/Unary", request_serializer=lambda b: b, response_deserializer=lambda b: b)
assert call(b"duet" * 25, timeout=5) == b"duet" * 25
PY
{
  echo "workers: 1"
  echo "listeners: [ { address: 127.0.0.1:$((18450 + OFFSET)) } ]"
  echo "routes: [ { cluster: grpc } ]"
  echo "clusters:"
  echo "  - name: grpc"
  echo "    protocol: h2"
  echo "    policy: p2c_peak_ewma"
  echo "    backends:"
  for port in $BACKENDS; do echo "      - { address: 127.0.0.1:$port }"; done
} >"$WORK/duet.yaml"
{
  printf 'global\n  nbthread 1\n  maxconn 4096\ndefaults\n  mode http\n  timeout connect 1s\n'
  printf '  timeout client 30s\n  timeout server 30s\n  http-reuse always\nfrontend grpc\n'
  printf '  bind 127.0.0.1:%s proto h2\n  default_backend grpc\nbackend grpc\n  balance leastconn\n' $((18460 + OFFSET))
  for port in $BACKENDS; do printf '  server b%s 127.0.0.1:%s proto h2\n' "$port" "$port"; done
} >"$WORK/haproxy.cfg"
sleep 2
port() { case $1 in duet) echo $((18450 + OFFSET)) ;; haproxy) echo $((18460 + OFFSET)) ;; esac; }
start() {
  case $1 in
    duet) RUST_LOG=warn taskset -c 0 "$DUET" run --config "$WORK/duet.yaml" >/dev/null 2>"$WORK/duet.err" & ;;
    haproxy) taskset -c 0 haproxy -f "$WORK/haproxy.cfg" -db >/dev/null 2>"$WORK/haproxy.err" & ;;
  esac
  PROXY_PID=$!
  for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$(port "$1")") 2>/dev/null && return; sleep 0.1; done
  echo "$1 did not start" >&2; exit 1
}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
for rep in $(seq "$REPS"); do
  for proxy in duet haproxy; do
    start "$proxy"
    python3 "$WORK/check.py" "127.0.0.1:$(port "$proxy")"
    before=$(ticks "$PROXY_PID")
    out=$(taskset -c 1 h2load -t1 -c8 -m "$STREAMS" -D "$SECS" -d "$WORK/call.bin" \
      -H 'content-type: application/grpc' -H 'te: trailers' "http://127.0.0.1:$(port "$proxy")/bench.Echo/Unary")
    after=$(ticks "$PROXY_PID")
    kill "$PROXY_PID"; wait "$PROXY_PID" 2>/dev/null || true; PROXY_PID=""
    ok=$(sed -n 's/^status codes: \([0-9]*\) 2xx.*/\1/p' <<<"$out")
    failed=$(sed -n 's/^requests: .* \([0-9]*\) failed.*/\1/p' <<<"$out")
    echo "$rep $proxy $ok $failed $(( (after - before) ))" >>"$WORK/runs"
    awk -v r="$rep" -v p="$proxy" -v ok="$ok" -v f="$failed" -v t=$((after - before)) -v hz="$hz" -v s="$SECS" \
      'BEGIN { printf "rep %s %-8s %8.0f calls/s  %6.1f µs CPU per call  (%s failed)\n", r, p, ok / s, t / hz * 1e6 / ok, f }'
  done
done
python3 - "$WORK/runs" "$hz" "$SECS" "$STREAMS" <<'PY'
import sys, statistics
hz, secs = float(sys.argv[2]), float(sys.argv[3])
runs = {}
for line in open(sys.argv[1]):
    rep, proxy, ok, failed, ticks = line.split()
    runs.setdefault(rep, {})[proxy] = (int(ok) / secs, int(ticks) / hz * 1e6 / int(ok))
print(f"== medians over {len(runs)} repetitions, h2load -c8 -m {sys.argv[4]}")
for proxy in ("duet", "haproxy"):
    rate = statistics.median(r[proxy][0] for r in runs.values())
    cpu = statistics.median(r[proxy][1] for r in runs.values())
    print(f"{proxy:8} {rate:8.0f} calls/s  {cpu:6.1f} µs CPU per call")
rate = statistics.median(r["duet"][0] / r["haproxy"][0] for r in runs.values())
cpu = statistics.median(r["duet"][1] / r["haproxy"][1] for r in runs.values())
print(f"duet / HAProxy (median of per-repetition ratios): calls/s {rate:.2f}x, CPU per call {cpu:.2f}x")
PY
