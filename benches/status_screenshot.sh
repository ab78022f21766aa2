#!/usr/bin/env bash
# The status page's screenshot in the book (docs/src/figures/status-over-time.png): a minute of mixed
# traffic through duet, then headless Chromium's picture of /status.
#
#   benches/status_screenshot.sh [SECONDS]        (default 60)
#
# Two clusters on loopback backends (crates/testbed's duet-backend): `web`, PeakEWMA over a 1 ms, a
# 5 ms and a 20 ms backend, the 20 ms one killed halfway (its health checks then fail); `api`, two
# 2 ms backends. A paced Python client (about 100 requests/s on 4 threads) sends 85% `/`, 5%
# `/status/500`, 5% `/sleep/30` and 5% `/api/x`. The admin listener keeps 2 s buckets, so a minute
# fills the plots' 30.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_SECONDS=${1:-60}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
command -v chromium >/dev/null || { echo "needs Debian's chromium" >&2; exit 1; }

cargo build -q --bin duet --bin duet-backend
backend() { # port name delay_ms
  target/debug/duet-backend --listen "127.0.0.1:$1" --name "$2" --delay-ms "$3" >/dev/null &
}
backend 19301 web-fast 1
backend 19302 web-mid 5
backend 19303 web-slow 20
SLOW=$!
backend 19311 api-1 2
backend 19312 api-2 2

cat >"$WORK/duet.yaml" <<YAML
workers: 2
listeners: [ { address: 127.0.0.1:19300 } ]
admin: { address: 127.0.0.1:19399, status_bucket: 2s }
routes:
  - { name: api, match: { path_prefix: /api }, cluster: api }
  - { name: web, match: { path_prefix: / }, cluster: web }
clusters:
  - name: web
    policy: p2c_peak_ewma
    health_check: { path: /healthz, interval: 1s }
    backends: [ { address: 127.0.0.1:19301 }, { address: 127.0.0.1:19302 }, { address: 127.0.0.1:19303 } ]
  - name: api
    backends: [ { address: 127.0.0.1:19311 }, { address: 127.0.0.1:19312 } ]
YAML
RUST_LOG=warn target/debug/duet run --config "$WORK/duet.yaml" 2>"$WORK/duet.log" &
sleep 2

python3 - "$RUN_SECONDS" <<'PY' &
import http.client, random, sys, threading, time
seconds = float(sys.argv[1])
end = time.monotonic() + seconds
def client():
    conn = http.client.HTTPConnection("127.0.0.1", 19300, timeout=5)
    while time.monotonic() < end:
        r = random.random()
        path = "/" if r < .85 else "/status/500" if r < .90 else "/sleep/30" if r < .95 else "/api/x"
        try:
            conn.request("GET", path)
            conn.getresponse().read()
        except Exception:
            conn = http.client.HTTPConnection("127.0.0.1", 19300, timeout=5)
        time.sleep(0.04)
threads = [threading.Thread(target=client) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
PY
CLIENT=$!
sleep "$((RUN_SECONDS / 2))"
kill "$SLOW"
wait "$CLIENT"
sleep 2

chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-dev-shm-usage \
  --user-data-dir="$WORK/chromium" --hide-scrollbars --window-size=1400,1000 \
  --screenshot="$PWD/docs/src/figures/status-over-time.png" http://127.0.0.1:19399/status 2>/dev/null
echo "wrote docs/src/figures/status-over-time.png"
