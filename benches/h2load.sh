#!/usr/bin/env bash
# HTTP/2 from clients (issue #28): h2load against duet, nginx and HAProxy side by side in one run, each
# speaking h2 to the client, as h2c (prior knowledge) and over TLS (ALPN h2, TLS 1.3, one self-signed
# P-256 certificate shared by all three), and HTTP/1.1 to the same four loopback backends, at 1 and at
# 10 and 100 streams per connection.
#
#   benches/h2load.sh [REPETITIONS] [SECONDS] [SCHEMES]
#   (defaults: 3 repetitions of 10 s per proxy and run; SCHEMES "h2c tls", or either alone;
#   OFFSET=N in the environment moves every port by N; STREAMS="1 10 100" the streams per connection;
#   PROXIES="duet haproxy nginx" a subset; DUET=path another duet build; DUET_B=path adds "duet-b", a
#   second duet build run beside the first in every repetition: an interleaved A/B, its ratio to
#   "duet" reported; BARE_H2=path another build of the floors' bare_h2, below)
#
# Installs nginx-light, haproxy and nghttp2-client (h2load) with apt if missing and builds duet in release
# mode. Each proxy gets one worker pinned to CPU 0, access log off; four duet-backend processes and h2load
# share CPU 1.
#   duet     workers 1, p2c_peak_ewma, retries, admin listener (metrics) on, RUST_LOG=warn; its plain
#            listener serves a connection opening with the h2 preface as h2c
#   HAProxy  nbthread 1, balance leastconn, http-reuse always; `bind ... proto h2`
#   nginx    worker_processes 1, least_conn, upstream keepalive 64; `listen ... http2` (nginx 1.22 has no
#            `http2 on`; a plain http2 listener is h2c prior knowledge only); keepalive_requests raised
#            on both sides: its default of 1,000 ends each h2 connection after 1,000 streams, and h2load
#            does not reconnect (the run would measure 16,000 requests and then errors)
# In each repetition, for -m 1, 10 and 100, the proxies run in turn, each a fresh process:
#   h2load -t1 -c16 -m M -D SECONDS: requests/s and CPU µs per request (the proxy's utime + stime from
#   /proc over the run, over the requests h2load saw succeed)
# Reported: medians, and the medians of per-repetition ratios of duet to nginx and to HAProxy.
#
# Floors (issue #50), in PROXIES only when named, h2c only (skipped for tls): servers that answer every
# request themselves with what the backends answer (200, 3 fields, 6-byte body), no proxying:
#   bare-hyper-h2   crates/proxy/examples/bare_h2.rs hyper: hyper's HTTP/2 server, one task per stream
#   bare-h2         bare_h2.rs h2: the h2 crate driven directly, one task per stream (as Pingora)
#   bare-h2-inline  bare_h2.rs h2-inline: the h2 crate, each stream answered in the connection's task
#   haproxy-return  HAProxy's h2 frontend answering `http-request return` (200, x-backend, body)
# and the floor of a proxy on hyper and h2, forwarding to the four backends like bare_hyper.rs (round
# robin, a pool of hyper HTTP/1.1 client connections, nothing of duet's):
#   bare-hyper-h2-proxy   bare_h2.rs hyper BACKEND...: hyper's HTTP/2 server
#   bare-h2-proxy         bare_h2.rs h2 BACKEND...: the h2 crate, one task per stream
# (built with `cargo build --release -p duet-proxy --example bare_h2` when PROXIES names one)
#
#   COUNT=instructions benches/h2load.sh [REQUESTS] [STREAMS] [SCHEMES]
#   (defaults: 20000 requests, streams "1 10 100", scheme h2c; PROXIES="duet" for fewer, KEEP=DIR
#   keeps each callgrind output for callgrind_annotate)
# counts instead of timing (issue #50): each proxy runs under valgrind's callgrind; after 2,000
# requests of warm-up its counters are zeroed, then h2load -c16 -m M -n REQUESTS: user-space
# instructions per request, the figure a loaded machine reproduces (req/s under callgrind means nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${COUNT:-time}
if [ "$COUNT" = instructions ]; then
  REQUESTS=${1:-20000}
  STREAMS=${2:-1 10 100}
  SCHEMES=${3:-h2c}
  REPS=1
else
  REPS=${1:-3}
  SECS=${2:-10}
  SCHEMES=${3:-h2c tls}
  STREAMS=${STREAMS:-1 10 100}
fi
# Every port moves by OFFSET, for a machine where another run holds the defaults.
OFFSET=${OFFSET:-0}
WORK=$(mktemp -d)
# A proxy is started in a command substitution, so it is not one of our jobs: its pid is kept to stop it.
PROXY_PID=""
trap 'kill $(jobs -p) $PROXY_PID 2>/dev/null || true; rm -rf "$WORK"' EXIT
LAUNCH=${LAUNCH:-taskset -c 0}
if [ "$COUNT" = instructions ]; then
  command -v valgrind >/dev/null 2>&1 ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null; }
  LAUNCH="valgrind --tool=callgrind --log-file=$WORK/valgrind.%p.log --callgrind-out-file=$WORK/callgrind.out.%p"
fi

if [ ! -x /usr/sbin/nginx ] || [ ! -x /usr/sbin/haproxy ] || ! command -v h2load >/dev/null 2>&1; then
  echo "== installing nginx-light, haproxy and nghttp2-client"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light haproxy nghttp2-client >/dev/null
fi
[ -n "${NO_BUILD:-}" ] || echo "== building duet (release)"
[ -n "${NO_BUILD:-}" ] || cargo build --release -q --bin duet --bin duet-backend
case " ${PROXIES:-} " in
  *" bare-"*) [ -n "${NO_BUILD:-}" ] || cargo build --release -q -p duet-proxy --example bare_h2 ;;
esac
source "$(dirname "$0")/proc_cpu.sh"
for port in 18400 18401 18409 18410 18411 18420 18421 18422 18423 18440 18442 18444 18446 18448 19301 19302 19303 19304; do refuse_taken $((port + OFFSET)); done
# One certificate for every proxy's TLS listener: h2load does not verify it.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=localhost \
  -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null
cat "$WORK/cert.pem" "$WORK/key.pem" >"$WORK/haproxy.pem"
for port in $((19301 + OFFSET)) $((19302 + OFFSET)) $((19303 + OFFSET)) $((19304 + OFFSET)); do
  taskset -c 1 target/release/duet-backend --listen "127.0.0.1:$port" --name "b$port" >/dev/null &
done
wait_for $((19304 + OFFSET))

cat >"$WORK/duet.yaml" <<YAML
workers: 1
listeners:
  - { address: 127.0.0.1:$((18400 + OFFSET)) }
  - { address: 127.0.0.1:$((18401 + OFFSET)), tls: { cert: $WORK/cert.pem, key: $WORK/key.pem } }
admin: { address: 127.0.0.1:$((18409 + OFFSET)) }
routes:
  - match: { path_prefix: / }
    cluster: app
clusters:
  - name: app
    policy: p2c_peak_ewma
    backends: [ { address: 127.0.0.1:$((19301 + OFFSET)) }, { address: 127.0.0.1:$((19302 + OFFSET)) }, { address: 127.0.0.1:$((19303 + OFFSET)) }, { address: 127.0.0.1:$((19304 + OFFSET)) } ]
    retries: { attempts: 3, budget_percent: 20%, min_retries_per_second: 10 }
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
  keepalive_requests 100000000;
  upstream app {
    least_conn;
    server 127.0.0.1:$((19301 + OFFSET)); server 127.0.0.1:$((19302 + OFFSET)); server 127.0.0.1:$((19303 + OFFSET)); server 127.0.0.1:$((19304 + OFFSET));
    keepalive 64;
    keepalive_requests 100000000;
  }
  server {
    listen 127.0.0.1:$((18410 + OFFSET)) http2;
    listen 127.0.0.1:$((18411 + OFFSET)) ssl http2;
    ssl_certificate $WORK/cert.pem;
    ssl_certificate_key $WORK/key.pem;
    ssl_protocols TLSv1.3;
    location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
CONF
cat >"$WORK/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 4096
defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 30s
  http-reuse always
frontend app
  bind 127.0.0.1:$((18420 + OFFSET)) proto h2
  bind 127.0.0.1:$((18421 + OFFSET)) ssl crt $WORK/haproxy.pem alpn h2 ssl-min-ver TLSv1.3
  default_backend app
backend app
  balance leastconn
  server b1 127.0.0.1:$((19301 + OFFSET))
  server b2 127.0.0.1:$((19302 + OFFSET))
  server b3 127.0.0.1:$((19303 + OFFSET))
  server b4 127.0.0.1:$((19304 + OFFSET))
CONF
# HAProxy's floor: its h2 frontend answering itself, the backends' answer (status, 3 fields, 6 bytes).
sed -n '1,/^frontend/p' "$WORK/haproxy.cfg" >"$WORK/haproxy-return.cfg"
cat >>"$WORK/haproxy-return.cfg" <<CONF
  bind 127.0.0.1:$((18422 + OFFSET)) proto h2
  bind 127.0.0.1:$((18423 + OFFSET)) ssl crt $WORK/haproxy.pem alpn h2 ssl-min-ver TLSv1.3
  http-request return status 200 content-type text/plain string b$((19301 + OFFSET)) hdr x-backend b$((19301 + OFFSET))
CONF

start() { # proxy -> pid (its output never to our stdout)
  case $1 in
    duet | duet-b)
      local binary=${DUET:-target/release/duet}
      [ "$1" = duet-b ] && binary=$DUET_B
      RUST_LOG=warn $LAUNCH "$binary" run --config "$WORK/duet.yaml" >/dev/null 2>"$WORK/duet.err" &
      echo $! ;;
    nginx)
      $LAUNCH /usr/sbin/nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" >/dev/null 2>"$WORK/nginx.err" &
      echo $! ;;
    haproxy | haproxy-return)
      $LAUNCH /usr/sbin/haproxy -f "$WORK/$1.cfg" -db >"$WORK/$1.err" 2>&1 &
      echo $! ;;
    bare-*)
      local mode=${1#bare-} answer="b$((19301 + OFFSET))"
      case $1 in *-proxy) mode=${mode%-proxy} answer=$(printf "127.0.0.1:%s " $((19301 + OFFSET)) $((19302 + OFFSET)) $((19303 + OFFSET)) $((19304 + OFFSET))) ;; esac
      # shellcheck disable=SC2086 # the backends, one word each
      $LAUNCH "${BARE_H2:-target/release/examples/bare_h2}" "${mode%-h2}" "127.0.0.1:$(port "$1" h2c)" $answer \
        >/dev/null 2>"$WORK/$1.err" &
      echo $! ;;
  esac
}
port() { # proxy scheme
  local base
  case $1 in duet | duet-b) base=$((18400 + OFFSET)) ;; nginx) base=$((18410 + OFFSET)) ;; haproxy) base=$((18420 + OFFSET)) ;;
    haproxy-return) base=$((18422 + OFFSET)) ;; bare-hyper-h2) base=$((18440 + OFFSET)) ;;
    bare-h2) base=$((18442 + OFFSET)) ;; bare-h2-inline) base=$((18444 + OFFSET)) ;;
    bare-hyper-h2-proxy) base=$((18446 + OFFSET)) ;; bare-h2-proxy) base=$((18448 + OFFSET)) ;; esac
  if [ "$2" = tls ]; then echo $((base + 1)); else echo "$base"; fi
}
url() { # proxy scheme
  if [ "$2" = tls ]; then echo "https://127.0.0.1:$(port "$1" tls)/x"; else echo "http://127.0.0.1:$(port "$1" h2c)/x"; fi
}

measure() { # proxy streams pid scheme -> "rps cpu_us_per_request failed succeeded"
  local before after out
  before=$(cpu_ticks "$3")
  out=$(taskset -c 1 timeout $((SECS + 30)) h2load -t1 -c16 -m"$2" -D "$SECS" "$(url "$1" "$4")")
  after=$(cpu_ticks "$3")
  python3 -c '
import re, sys
text = sys.stdin.read()
before, after = [int(x) for x in sys.argv[1].split()], [int(x) for x in sys.argv[2].split()]
ticks = after[0] - before[0] + after[1] - before[1]
m = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", text)
done, ok, failed, errored = (int(x) for x in m.groups())
rps = float(re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", text).group(1))
codes = re.search(r"status codes: (\d+) 2xx", text)
print(rps, ticks / 100 * 1e6 / max(ok, 1), failed + errored + (ok - int(codes.group(1))), ok)' "$before" "$after" <<<"$out"
}

count() { # proxy streams pid scheme -> "instructions_per_request failed succeeded"
  local out total
  taskset -c 1 h2load -t1 -c16 -m"$2" -n 2000 "$(url "$1" "$4")" >/dev/null
  callgrind_control -z "$3" >/dev/null 2>&1
  out=$(taskset -c 1 timeout 600 h2load -t1 -c16 -m"$2" -n "$REQUESTS" "$(url "$1" "$4")")
  stop "$3"
  total=$(callgrind_annotate "$WORK"/callgrind.out.* 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP" && cat "$WORK"/callgrind.out.* >"$KEEP/$1-$4-m$2.out"
  fi
  rm -f "$WORK"/callgrind.out.*
  python3 -c '
import re, sys
m = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", sys.stdin.read())
done, ok, failed, errored = (int(x) for x in m.groups())
print(int(sys.argv[1]) // max(ok, 1), failed + errored, ok)' "$total" <<<"$out"
}

if [ "$COUNT" = instructions ]; then
  sed -i '1i master_process off;' "$WORK/nginx/nginx.conf"   # callgrind follows one process
  echo "== user-space instructions per request (callgrind; h2load -c16 -n $REQUESTS after 2,000 of warm-up)"
  for scheme in $SCHEMES; do
    for streams in $STREAMS; do
      for proxy in ${PROXIES:-duet haproxy nginx}; do
        [ "$scheme" = tls ] && [ "${proxy#bare-}" != "$proxy" ] && continue   # h2c only
        refuse_taken "$(port "$proxy" h2c)"; refuse_taken "$(port "$proxy" tls)"
        pid=$(start "$proxy")
        PROXY_PID=$pid
        wait_for "$(port "$proxy" "$scheme")"
        read -r per bad ok <<<"$(count "$proxy" "$streams" "$pid" "$scheme")"
        printf "  %-4s -m%-4s %-14s %8d instructions/request  (%d requests, %d failed)\n" \
          "$scheme" "$streams" "$proxy" "$per" "$ok" "$bad"
      done
    done
  done
  exit 0
fi

RESULTS="$WORK/results.txt"
PROXIES=${PROXIES:-duet haproxy nginx}
[ -z "${DUET_B:-}" ] || PROXIES="$PROXIES duet-b"
printf "%-4s %-6s %-8s %-8s %10s %12s %8s\n" rep scheme streams proxy req/s "CPU us/req" errors
for rep in $(seq 1 "$REPS"); do
 for scheme in $SCHEMES; do
  for streams in $STREAMS; do
    for proxy in $PROXIES; do
      [ "$scheme" = tls ] && [ "${proxy#bare-}" != "$proxy" ] && continue   # h2c only
      # another benchmark on the same ports would share the traffic
      refuse_taken "$(port "$proxy" h2c)"; refuse_taken "$(port "$proxy" tls)"
      pid=$(start "$proxy")
      PROXY_PID=$pid
      wait_for "$(port "$proxy" "$scheme")"
      if [ "$scheme" = tls ]; then h2flag=--http2; else h2flag=--http2-prior-knowledge; fi
      [ "$(curl -sk "$h2flag" -o /dev/null -w '%{http_version} %{http_code}' "$(url "$proxy" "$scheme")")" = "2 200" ] ||
        { echo "$proxy is not answering $scheme"; tail "$WORK"/*.err "$WORK"/*/logs/error.log; exit 1; }
      read -r rps cpu bad ok <<<"$(measure "$proxy" "$streams" "$pid" "$scheme")"
      printf "%-4s %-6s %-8s %-8s %10.0f %12.1f %8s\n" "$rep" "$scheme" "$streams" "$proxy" "$rps" "$cpu" "$bad"
      echo "$rep $scheme $streams $proxy $rps $cpu $bad" >>"$RESULTS"
      stop "$pid"
    done
  done
 done
done

python3 - "$RESULTS" "$PROXIES" <<'PY'
import collections, statistics, sys
proxies = sys.argv[2].split()
data = collections.defaultdict(dict)  # (rep, scheme, streams) -> proxy -> (rps, cpu)
bad = 0
for line in open(sys.argv[1]):
    rep, scheme, streams, proxy, rps, cpu, b = line.split()
    data[(rep, scheme, streams)][proxy] = (float(rps), float(cpu))
    bad += int(b)
print()
for scheme, streams in sorted({(k[1], k[2]) for k in data}, key=lambda k: (k[0], int(k[1]))):
    runs = [v for (r, sc, s), v in data.items() if (sc, s) == (scheme, streams)]
    med = lambda proxy, i: statistics.median(v[proxy][i] for v in runs)
    ratio = lambda f: statistics.median(f(v) for v in runs)
    print(f"h2load -c16 -m{streams} ({scheme}):")
    for proxy in proxies:
        if any(proxy not in v for v in runs):
            continue  # the floors run h2c only
        print(f"  {proxy:<8} {med(proxy, 0):>8.0f} req/s  {med(proxy, 1):6.1f} us CPU per request")
    pairs = [("duet", other) for other in ("nginx", "haproxy") if "duet" in proxies and other in proxies]
    pairs += [("duet-b", "duet")] if "duet-b" in proxies and "duet" in proxies else []
    for mine, other in pairs:
        print(f"  {mine} / {other:<8} req/s {ratio(lambda v: v[mine][0] / v[other][0]):.2f}"
              f"   CPU per request {ratio(lambda v: v[mine][1] / v[other][1]):.2f}")
print(f"errors (failed, errored or non-2xx streams) across all runs: {bad}")
PY
