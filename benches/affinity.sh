#!/usr/bin/env bash
# Affinity under a hot key through the release binary (2 workers), beside HAProxy and nginx on the
# same machine in the same run (issue #48's side by side).
#
#   benches/affinity.sh [SECONDS] [CONCURRENCY]        (defaults: 15, 64)
#
# Five loopback backends (duet-backend, each answering after 2 ms, at most 8 at once: finite
# capacity, so a backend sent more than its share queues and its queue shows in the p99). The client is benches/affinity_client.py: CONCURRENCY keep-alive
# connections, closed loop, every request `x-user: KEY` from one seeded stream in which the key `hot`
# takes 30% of the requests and the rest are uniform over 2,000 users. Each proxy gets the same
# stream, one after another. Per proxy: the share of each key's requests on its home (the backend
# that served most of that key's requests there), the hot key's own share on its home and how many
# backends served it, the busiest backend's requests over the mean, and the p50/p99; then duet's
# figures as ratios of HAProxy's and nginx's.
#   duet              policy: hash, hash: { key: header:x-user, bound: 1.25, walk: p2c } (and walk: next)
#   haproxy           balance hdr(x-user), hash-type consistent, hash-balance-factor 125
#   nginx             hash $http_x_user consistent (no bound: plain consistent hashing)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-15}
CONC=${2:-64}
USERS=2000
HOT=0.3
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
ulimit -n "$(ulimit -Hn)"

echo "== building duet (release)"
[ -n "${NO_BUILD:-}" ] || cargo build --release -q --bin duet --bin duet-backend
BACKENDS=(19711 19712 19713 19714 19715)
for port in "${BACKENDS[@]}"; do
  target/release/duet-backend --listen "127.0.0.1:$port" --name "b$port" --delay-ms 2 --max-concurrency 8 >/dev/null &
done

cat >"$WORK/duet.yaml" <<YAML
workers: 2
listeners:
  - { address: 127.0.0.1:18700, name: p2c }
  - { address: 127.0.0.1:18701, name: next }
routes:
  - { name: p2c, listeners: [p2c], cluster: p2c }
  - { name: next, listeners: [next], cluster: next }
clusters:
$(for walk in p2c next; do
  echo "  - name: $walk"
  echo "    policy: hash"
  echo "    hash: { key: 'header:x-user', bound: 1.25, walk: $walk }"
  echo "    backends:"
  for port in "${BACKENDS[@]}"; do echo "      - { address: 127.0.0.1:$port }"; done
done)
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
  upstream app {
    hash \$http_x_user consistent;
$(for port in "${BACKENDS[@]}"; do echo "    server 127.0.0.1:$port;"; done)
    keepalive 256;
  }
  server {
    listen 127.0.0.1:18710;
    keepalive_requests 100000000;
    location / {
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
frontend affinity
  bind 127.0.0.1:18720
  default_backend app
backend app
  balance hdr(x-user)
  hash-type consistent
  hash-balance-factor 125
  http-reuse always
$(for port in "${BACKENDS[@]}"; do echo "  server b$port 127.0.0.1:$port"; done)
CONF
haproxy -f "$WORK/haproxy.cfg" >"$WORK/haproxy.log" 2>&1 &
sleep 2

for proxy in duet_p2c:18700 duet_next:18701 haproxy:18720 nginx:18710; do
  name=${proxy%%:*} port=${proxy##*:}
  python3 benches/affinity_client.py 127.0.0.1 "$port" "$CONC" "$SECS" "$USERS" "$HOT" >"$WORK/$name.json"
done

python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
r = {n: json.load(open(f"{work}/{n}.json")) for n in ("duet_p2c", "duet_next", "haproxy", "nginx")}
print(f"{'proxy':<10} {'requests':>8} {'home share':>10} {'hot home':>9} {'hot on':>6} "
      f"{'busiest/mean':>12} {'p50 ms':>7} {'p99 ms':>7}")
for name, x in r.items():
    print(f"{name:<10} {x['requests']:>8} {x['home_share']:>10.4f} {x['hot_home_share']:>9.4f} "
          f"{x['hot_backends']:>6} {x['busiest_over_mean']:>12.3f} {x['p50_ms']:>7.2f} {x['p99_ms']:>7.2f}")
for duet in ("duet_p2c", "duet_next"):
    for anchor in ("haproxy", "nginx"):
        a, b = r[duet], r[anchor]
        print(f"{duet} / {anchor}: home share {a['home_share'] / b['home_share']:.3f}, "
              f"p99 {a['p99_ms'] / b['p99_ms']:.3f}, busiest/mean "
              f"{a['busiest_over_mean'] / b['busiest_over_mean']:.3f}")
PY
