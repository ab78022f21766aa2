#!/usr/bin/env bash
# What a rate limit costs per request, in user-space instructions (valgrind's callgrind, the figure a
# noisy 2-core machine reproduces): one duet worker, access log off, wrk -c8 on one route, the same
# route (same path, same place in the table) in three configs: without a limit, with
# `rate_limit: { key: client_ip }` and with `key: route`, at a rate no request reaches (every request
# is judged and allowed), each in its own callgrind run of the same binary. Two rounds, interleaved.
#
#   benches/rate_limit_cost.sh [SECONDS]    (default: 6 s counted; NO_BUILD=1 uses target/release;
#                                            DUET=path measures another binary)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-6}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
[ -n "${NO_BUILD:-}" ] || cargo build --release -q --bin duet --bin duet-backend
target/release/duet-backend --listen 127.0.0.1:19801 --name b >/dev/null &
DUET=${DUET:-target/release/duet}
config() { # name, rate_limit (or nothing)
  cat >"$WORK/$1.yaml" <<YAML
workers: 1
listeners: [ { address: 127.0.0.1:18800 } ]
routes:
  - { name: other, match: { path_prefix: /other }, cluster: app }
  - { name: app, match: { path_prefix: /app }, cluster: app$2 }
clusters:
  - { name: app, backends: [ { address: 127.0.0.1:19801 } ] }
limits: { keepalive_requests: 100000000 }
YAML
}
config none ""
config client_ip ", rate_limit: { rate: 1000000000/s, key: client_ip }"
config route ", rate_limit: { rate: 1000000000/s, key: route }"

count() { # config
  local pid requests total
  rm -f "$WORK"/callgrind.out.*
  RUST_LOG=warn valgrind --tool=callgrind --log-file="$WORK/valgrind.log" \
    --callgrind-out-file="$WORK/callgrind.out.%p" "$DUET" run --config "$WORK/$1.yaml" \
    2>/dev/null &
  pid=$!
  for _ in $(seq 1 300); do (exec 3<>/dev/tcp/127.0.0.1/18800) 2>/dev/null && break; sleep 0.1; done
  wrk -t1 -c8 -d2 "http://127.0.0.1:18800/app" >/dev/null
  callgrind_control -z "$pid" >/dev/null
  requests=$(wrk -t1 -c8 -d"$SECS" "http://127.0.0.1:18800/app" | awk '/requests in/ { print $1 }')
  kill "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  total=$(callgrind_annotate "$WORK"/callgrind.out.* 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
  printf '  %-10s %8d requests  %7d instructions/request\n' "$1" "$requests" $((total / requests))
}

echo "== user-space instructions per request (callgrind, wrk -c8, ${SECS} s counted)"
for variant in none client_ip route none client_ip route; do
  count "$variant"
done
