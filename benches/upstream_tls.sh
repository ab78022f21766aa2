#!/usr/bin/env bash
# What TLS to backends costs per request (issue #32): duet and nginx, each proxying to plain and to TLS
# backends, side by side in one run, on loopback.
#
#   benches/upstream_tls.sh [REPETITIONS] [SECONDS]   (defaults: 3 repetitions of 10 s per proxy)
#   RUNS="nginx-tls" benches/upstream_tls.sh 1 2       one run alone, to try a configuration (no ratios)
#
# Installs nginx-light, haproxy, wrk and openssl with apt if missing and builds duet in release mode.
# Certificates (a test CA and a P-256 server certificate for backend.test) are made by openssl in a
# scratch directory removed at the end.
#   backends  one nginx (worker_processes 1, CPU 1) answering every request with the same 13-byte body
#             from `return 200`: plain on 19301-19304, TLS (TLS 1.3, session cache) on 19311-19314.
#             Its keepalive_requests is raised so that no backend ever closes a pooled connection: the
#             handshakes counted are the proxy's pool filling, not the backend's policy.
#   duet      workers 1, p2c_peak_ewma, retries, admin listener (metrics) on, access log off
#             (RUST_LOG=warn); TLS: `tls: { ca, server_name: backend.test }` (verified)
#   nginx     worker_processes 1, least_conn, upstream keepalive 64, access log off; TLS: proxy_pass
#             https:// with proxy_ssl_protocols TLSv1.3 (1.22 offers up to 1.2 by default), proxy_ssl_verify on, proxy_ssl_trusted_certificate, proxy_ssl_name,
#             proxy_ssl_session_reuse on; keepalive_requests raised on both sides (its default of 1,000
#             would close every pooled backend connection after 1,000 requests and handshake again,
#             which duet does not do)
# Each proxy is pinned to CPU 0; the backends and wrk share CPU 1. In each repetition the four runs
# (duet plain, duet TLS, nginx plain, nginx TLS) go in turn, each a fresh process: wrk -t1 -c64 for
# SECONDS, closed loop. CPU is the proxy's own (utime + stime from /proc, before and after). Reported:
# medians of req/s and CPU µs per request, the medians of per-repetition ratios, and duet's pool reuse
# (requests over duet_upstream_tls_handshakes_total, from its /metrics after each TLS run).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
SECS=${2:-10}
WORK=$(mktemp -d)
# A proxy is started in a command substitution, so it is not one of our jobs: its pid is kept to stop it.
PROXY_PID=""
trap 'kill $(jobs -p) $PROXY_PID 2>/dev/null || true; rm -rf "$WORK"' EXIT
LAUNCH=${LAUNCH:-taskset -c 0}

if [ ! -x /usr/sbin/nginx ] || ! command -v wrk >/dev/null 2>&1 || ! command -v openssl >/dev/null 2>&1; then
  echo "== installing nginx-light, haproxy, wrk and openssl"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light haproxy wrk openssl >/dev/null
fi
echo "== building duet (release)"
cargo build --release -q --bin duet
source "$(dirname "$0")/proc_cpu.sh"
for port in 18400 18409 18410 19301 19302 19303 19304 19311 19312 19313 19314; do refuse_taken "$port"; done

echo "== test CA and backend certificate (openssl, in $WORK)"
(
  cd "$WORK"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=bench-ca \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign \
    -keyout ca.key -out ca.pem 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=backend.test \
    -keyout server.key -out server.csr 2>/dev/null
  printf 'subjectAltName=DNS:backend.test\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n' >server.ext
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext \
    -out server.pem 2>/dev/null
)

mkdir -p "$WORK/backend/logs"
cat >"$WORK/backend/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $WORK/backend/nginx.pid;
error_log $WORK/backend/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 100000000;
  keepalive_timeout 600s;
  default_type text/plain;
  server {
    listen 127.0.0.1:19301; listen 127.0.0.1:19302; listen 127.0.0.1:19303; listen 127.0.0.1:19304;
    location / { return 200 "hello, bench\n"; }
  }
  server {
    listen 127.0.0.1:19311 ssl; listen 127.0.0.1:19312 ssl; listen 127.0.0.1:19313 ssl; listen 127.0.0.1:19314 ssl;
    ssl_certificate $WORK/server.pem;
    ssl_certificate_key $WORK/server.key;
    ssl_protocols TLSv1.3;
    ssl_session_cache shared:bench:1m;
    location / { return 200 "hello, bench\n"; }
  }
}
CONF
taskset -c 1 /usr/sbin/nginx -p "$WORK/backend" -c "$WORK/backend/nginx.conf" >/dev/null 2>"$WORK/backend.err" &
wait_for 19314

write_configs() { # the four proxies' configurations: duet-plain.yaml, duet-tls.yaml, nginx-{plain,tls}
  local tls base
  for tls in plain tls; do
    base=1930
    [ $tls = tls ] && base=1931
    cat >"$WORK/duet-$tls.yaml" <<YAML
workers: 1
listeners: [ { address: 127.0.0.1:18400 } ]
admin: { address: 127.0.0.1:18409 }
routes:
  - match: { path_prefix: / }
    cluster: app
clusters:
  - name: app
    policy: p2c_peak_ewma
    backends: [ { address: 127.0.0.1:${base}1 }, { address: 127.0.0.1:${base}2 }, { address: 127.0.0.1:${base}3 }, { address: 127.0.0.1:${base}4 } ]
    retries: { attempts: 3, budget_percent: 20%, min_retries_per_second: 10 }
YAML
    [ $tls = tls ] && printf '    tls: { ca: %s, server_name: backend.test }\n' "$WORK/ca.pem" >>"$WORK/duet-tls.yaml"
    local scheme=http ssl=""
    if [ $tls = tls ]; then
      scheme=https
      ssl="proxy_ssl_protocols TLSv1.3; proxy_ssl_verify on; proxy_ssl_trusted_certificate $WORK/ca.pem; proxy_ssl_name backend.test;
      proxy_ssl_server_name on; proxy_ssl_session_reuse on;"
    fi
    mkdir -p "$WORK/nginx-$tls/logs"
    cat >"$WORK/nginx-$tls/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $WORK/nginx-$tls/nginx.pid;
error_log $WORK/nginx-$tls/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 100000000;
  upstream app {
    least_conn;
    server 127.0.0.1:${base}1; server 127.0.0.1:${base}2; server 127.0.0.1:${base}3; server 127.0.0.1:${base}4;
    keepalive 64;
    keepalive_requests 100000000;
  }
  server {
    listen 127.0.0.1:18410;
    location / {
      proxy_pass $scheme://app; proxy_http_version 1.1; proxy_set_header Connection "";
      $ssl
    }
  }
}
CONF
  done
}

start() { # run(duet-plain|duet-tls|nginx-plain|nginx-tls) -> pid (its output never to our stdout)
  case $1 in
    duet-*)
      RUST_LOG=warn $LAUNCH target/release/duet run --config "$WORK/$1.yaml" >/dev/null 2>"$WORK/$1.err" &
      echo $! ;;
    nginx-*)
      $LAUNCH /usr/sbin/nginx -p "$WORK/$1" -c "$WORK/$1/nginx.conf" >/dev/null 2>"$WORK/$1.err" &
      echo $! ;;
  esac
}
port() { case $1 in duet-*) echo 18400 ;; nginx-*) echo 18410 ;; esac; }

measure() { # run pid -> "rps cpu_us_per_request non2xx requests"
  local before after out
  before=$(cpu_ticks "$2")
  out=$(taskset -c 1 timeout $((SECS + 30)) wrk -t1 -c64 -d"${SECS}s" "http://127.0.0.1:$(port "$1")/x")
  after=$(cpu_ticks "$2")
  python3 -c '
import re, sys
text = sys.stdin.read()
before, after = [int(x) for x in sys.argv[1].split()], [int(x) for x in sys.argv[2].split()]
ticks = after[0] - before[0] + after[1] - before[1]
total = int(re.search(r"(\d+) requests in", text).group(1))
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
print(rps, ticks / 100 * 1e6 / max(total, 1), (int(bad.group(1)) if bad else 0) + (sum(map(int, errors.groups())) if errors else 0), total)' "$before" "$after" <<<"$out"
}

reuse() { # -> "requests handshakes" from duet's /metrics
  curl -sf http://127.0.0.1:18409/metrics | awk '
    /^duet_requests_total/ { requests += $NF }
    /^duet_upstream_tls_handshakes_total/ { handshakes += $NF }
    END { print requests + 0, handshakes + 0 }'
}

write_configs
RUNS=${RUNS:-duet-plain duet-tls nginx-plain nginx-tls}
RESULTS="$WORK/results.txt"
printf "%-4s %-12s %10s %12s %8s %22s\n" rep run req/s "CPU us/req" errors "requests/handshakes"
for rep in $(seq 1 "$REPS"); do
  for run in $RUNS; do
    refuse_taken "$(port "$run")" # another benchmark on the same ports would share the traffic
    pid=$(start "$run")
    PROXY_PID=$pid
    wait_for "$(port "$run")"
    curl -sf "http://127.0.0.1:$(port "$run")/x" >/dev/null || { echo "$run is not answering"; tail "$WORK"/*.err "$WORK"/*/logs/error.log; exit 1; }
    read -r rps cpu bad total <<<"$(measure "$run" "$pid")"
    pool="-"
    if [ "$run" = duet-tls ]; then
      read -r requests handshakes <<<"$(reuse)"
      pool="$requests/$handshakes"
    fi
    printf "%-4s %-12s %10.0f %12.1f %8s %22s\n" "$rep" "$run" "$rps" "$cpu" "$bad" "$pool"
    echo "$rep $run $rps $cpu $bad $pool" >>"$RESULTS"
    stop "$pid"
  done
done

python3 - "$RESULTS" <<'PY'
import collections, statistics, sys
data = collections.defaultdict(dict)  # rep -> run -> (rps, cpu)
pools, bad = [], 0
for line in open(sys.argv[1]):
    rep, run, rps, cpu, b, pool = line.split()
    data[rep][run] = (float(rps), float(cpu))
    bad += int(b)
    if pool != "-":
        requests, handshakes = (int(x) for x in pool.split("/"))
        pools.append((requests, handshakes))
if any(len(v) < 4 for v in data.values()):
    sys.exit("(RUNS left some of the four runs out: no ratios)")
med = lambda run, i: statistics.median(v[run][i] for v in data.values())
ratio = lambda f: statistics.median(f(v) for v in data.values())
print()
for run in ("duet-plain", "duet-tls", "nginx-plain", "nginx-tls"):
    print(f"  {run:<12} {med(run, 0):>8.0f} req/s  {med(run, 1):6.1f} us CPU per request")
print(f"  TLS over plain, CPU per request:  duet {ratio(lambda v: v['duet-tls'][1] / v['duet-plain'][1]):.2f}"
      f"   nginx {ratio(lambda v: v['nginx-tls'][1] / v['nginx-plain'][1]):.2f}")
print(f"  TLS over plain, req/s:            duet {ratio(lambda v: v['duet-tls'][0] / v['duet-plain'][0]):.2f}"
      f"   nginx {ratio(lambda v: v['nginx-tls'][0] / v['nginx-plain'][0]):.2f}")
print(f"  duet / nginx, CPU per request:    plain {ratio(lambda v: v['duet-plain'][1] / v['nginx-plain'][1]):.2f}"
      f"   TLS {ratio(lambda v: v['duet-tls'][1] / v['nginx-tls'][1]):.2f}")
print(f"  duet / nginx, req/s:              plain {ratio(lambda v: v['duet-plain'][0] / v['nginx-plain'][0]):.2f}"
      f"   TLS {ratio(lambda v: v['duet-tls'][0] / v['nginx-tls'][0]):.2f}")
print(f"  TLS's added CPU per request, duet / nginx: "
      f"{ratio(lambda v: (v['duet-tls'][1] - v['duet-plain'][1]) / (v['nginx-tls'][1] - v['nginx-plain'][1])):.2f}")
for requests, handshakes in pools:
    print(f"  duet's pool: {requests} requests over {handshakes} TLS handshakes: "
          f"{requests / max(handshakes, 1):.0f} requests per handshake ({1 - handshakes / max(requests, 1):.4%} reused)")
print(f"  errors (non-2xx and socket errors) across all runs: {bad}")
PY
