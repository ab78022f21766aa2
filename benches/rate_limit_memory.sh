#!/usr/bin/env bash
# Memory of a rate limit's keys: duet (release, 1 worker) behind a "trusted proxy" (wrk on
# 127.0.0.1, listed in trusted_proxies) that sends every request with a new X-Forwarded-For address,
# on a route keyed by client_ip with a rate no request reaches. For each max_keys, the resident set
# before the load and after SECONDS of it (wrk -t1 -c16: every request a new key, far more keys than
# the cap), and the keys evicted (duet_rate_limit_keys_evicted_total). Bytes per key: the difference of
# the two caps' growth over the difference of the caps.
#
#   benches/rate_limit_memory.sh [SECONDS]      (default: 10; NO_BUILD=1 uses target/release as is)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
[ -n "${NO_BUILD:-}" ] || cargo build --release -q --bin duet --bin duet-backend
target/release/duet-backend --listen 127.0.0.1:19701 --name b >/dev/null &

cat >"$WORK/xff.lua" <<'LUA'
local n = 0
request = function()
  n = n + 1
  -- LuaJIT (wrk's): no bitwise operators.
  local address = string.format("10.%d.%d.%d", math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256)
  return wrk.format("GET", "/", { ["X-Forwarded-For"] = address })
end
LUA

rss_kib() { awk '/VmRSS/ { print $2 }' "/proc/$1/status"; }

for cap in 10000 100000; do
  cat >"$WORK/duet.yaml" <<YAML
workers: 1
listeners: [ { address: 127.0.0.1:18700, trusted_proxies: [127.0.0.1] } ]
admin: { address: 127.0.0.1:18709 }
routes:
  - { name: keyed, cluster: app, rate_limit: { rate: 1000000/s, key: client_ip, max_keys: $cap } }
clusters:
  - { name: app, backends: [ { address: 127.0.0.1:19701 } ] }
limits: { keepalive_requests: 100000000 }
YAML
  RUST_LOG=warn target/release/duet run --config "$WORK/duet.yaml" 2>"$WORK/duet.log" &
  pid=$!
  sleep 1
  before=$(rss_kib "$pid")
  sent=$(wrk -t1 -c16 -d"${SECS}s" -s "$WORK/xff.lua" http://127.0.0.1:18700/ | awk '/requests in/ { print $1 }')
  after=$(rss_kib "$pid")
  evicted=$(curl -s http://127.0.0.1:18709/metrics | awk '/^duet_rate_limit_keys_evicted_total/ { s += $2 } END { print s + 0 }')
  echo "max_keys $cap: $sent requests (each a new key), evicted $evicted, RSS $before KiB -> $after KiB (+$((after - before)) KiB)"
  echo "$cap $before $after" >>"$WORK/rss"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
done
awk '{ cap[NR] = $1; growth[NR] = $3 - $2 } END {
  printf "bytes per key: %.0f (growth difference over cap difference)\n",
    (growth[2] - growth[1]) * 1024 / (cap[2] - cap[1]) }' "$WORK/rss"
