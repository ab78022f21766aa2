#!/usr/bin/env bash
# Rate-limit accuracy through the release binary (2 workers), beside nginx `limit_req` and HAProxy's
# stick tables, on the same machine in the same run.
#
#   benches/rate_limit.sh [SECONDS]        (default: 10)
#
# Every proxy: one instant loopback backend (duet-backend), a route limited to 200/s with a burst of
# 200, keyed by the client address. The clients are duet-open-loop (crates/testbed): open loop
# (requests sent on schedule whatever the answers, each timed from its write to the end of its
# answer), each from its own loopback source address.
#   one     one client (127.0.0.2) offers 1,000/s for SECONDS
#   two     two clients (127.0.0.3, 127.0.0.4) offer 1,000/s each at once: each should get its own 200/s
#   quiet   (duet) a client at 100/s (127.0.0.6) beside a 1,000/s one (127.0.0.5): no 429, and its
#           p99 beside the same client on a route without a limit (/free, 127.0.0.8 beside 127.0.0.7),
#           ROUNDS rounds (default 3) alternating the two, so the machine's noise falls on both
# "accepted/s" is the mean of the 200s per second after the first second (the burst is spent in the
# first quarter second: 200 extra at 800/s over the refill); "total" counts every 200.
#   duet              rate_limit: { rate: 200/s, burst: 200, key: client_ip }
#   nginx             limit_req_zone $binary_remote_addr rate=200r/s; limit_req burst=200 nodelay
#   haproxy           stick table of the source, gpc0_rate(1s) counting accepted requests: deny when
#                     200 were accepted in the sliding second
#   haproxy_req_rate  the usual recipe, deny if sc_http_req_rate(0) gt 200: denied requests count too,
#                     so a client that keeps offering 1,000/s is refused nearly everything after its
#                     first 200
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
ulimit -n "$(ulimit -Hn)"

echo "== building duet (release)"
[ -n "${NO_BUILD:-}" ] || cargo build --release -q -p duet -p duet-testbed \
  --bin duet --bin duet-backend --bin duet-open-loop
target/release/duet-backend --listen 127.0.0.1:19601 --name b >/dev/null &

cat >"$WORK/duet.yaml" <<YAML
workers: 2
listeners: [ { address: 127.0.0.1:18600 } ]
routes:
  - { name: free, match: { path_prefix: /free }, cluster: app }
  - { name: limited, cluster: app, rate_limit: { rate: 200/s, burst: 200, key: client_ip } }
clusters:
  - { name: app, backends: [ { address: 127.0.0.1:19601 } ] }
limits: { keepalive_requests: 100000000 }
YAML
RUST_LOG=warn target/release/duet run --config "$WORK/duet.yaml" 2>"$WORK/duet.log" &

mkdir -p "$WORK/nginx/logs"
cat >"$WORK/nginx/nginx.conf" <<CONF
worker_processes 2;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  limit_req_zone \$binary_remote_addr zone=per_ip:10m rate=200r/s;
  upstream app { server 127.0.0.1:19601; keepalive 64; }
  server {
    listen 127.0.0.1:18610;
    keepalive_requests 100000000;
    location / {
      limit_req zone=per_ip burst=200 nodelay;
      limit_req_status 429;
      proxy_pass http://app;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
CONF
nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" &

cat >"$WORK/haproxy.cfg" <<CONF
global
  nbthread 2
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
frontend accepted
  bind 127.0.0.1:18620
  stick-table type ip size 100k expire 30s store gpc0_rate(1s)
  http-request track-sc0 src
  http-request deny deny_status 429 if { sc0_gpc0_rate ge 200 }
  http-request sc-inc-gpc0(0)
  default_backend app
frontend req_rate
  bind 127.0.0.1:18621
  stick-table type ip size 100k expire 30s store http_req_rate(1s)
  http-request track-sc0 src
  http-request deny deny_status 429 if { sc_http_req_rate(0) gt 200 }
  default_backend app
backend app
  http-reuse always
  server b 127.0.0.1:19601
CONF
haproxy -f "$WORK/haproxy.cfg" >"$WORK/haproxy.log" 2>&1 &
sleep 2

client() { # port path rate source
  target/release/duet-open-loop 127.0.0.1 "$1" "$2" "$3" "$SECS" "$4"
}

summary() { # label json
  python3 - "$1" "$2" <<'PY'
import json, sys
label, r = sys.argv[1], json.loads(sys.argv[2])
ok = r["ok_per_second"]
steady = sum(ok[1:]) / max(1, len(ok) - 1)
print(f"{label:<34} accepted/s {steady:7.1f} ({(steady / 200 - 1) * 100:+5.1f}% of 200)  "
      f"total 200s {r['statuses'].get('200', 0):5}  429s {r['statuses'].get('429', 0):5}  "
      f"other {sum(v for k, v in r['statuses'].items() if k not in ('200', '429')):3}  "
      f"per second {ok}")
PY
}

for proxy in duet:18600 nginx:18610 haproxy:18620 haproxy_req_rate:18621; do
  name=${proxy%%:*} port=${proxy##*:}
  echo "== $name"
  summary "$name one client" "$(client "$port" / 1000 127.0.0.2)"
  client "$port" / 1000 127.0.0.3 >"$WORK/a.json" &
  client "$port" / 1000 127.0.0.4 >"$WORK/b.json"
  wait %%
  summary "$name two clients: 127.0.0.3" "$(cat "$WORK/a.json")"
  summary "$name two clients: 127.0.0.4" "$(cat "$WORK/b.json")"
done

echo "== duet: a quiet client beside a 1,000/s one (limited route, then the same without a limit)"
quiet() { # path loud quiet
  client 18600 "$1" 1000 "$2" >/dev/null &
  local loud=$!
  client 18600 "$1" 100 "$3"
  wait "$loud"
}
for round in $(seq 1 "${ROUNDS:-3}"); do
  python3 - "$round" "$(quiet / 127.0.0.5 127.0.0.6)" "$(quiet /free 127.0.0.7 127.0.0.8)" <<'PY'
import json, sys
round, limited, free = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
for label, r in (("limited route", limited), ("route without a limit", free)):
    print(f"round {round}: quiet client, {label:<22} statuses {r['statuses']}  "
          f"p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms")
print(f"round {round}: p99 difference (limited - without): {limited['p99_ms'] - free['p99_ms']:+.3f} ms")
PY
done
