#!/usr/bin/env bash
# duet's image, built and run for real: three backend containers and duet on a private Docker network,
# backends given by container name (Docker's resolver), traffic through a port published on 127.0.0.1.
#
#   tests/container.sh            (needs a Docker engine; builds the musl binaries and the image)
#
# Checks: the image is small and has no shell; duet runs as uid 10001; the HEALTHCHECK turns healthy;
# requests reach every backend; `docker kill` of a backend during a keep-alive load costs no client error;
# `docker network disconnect` of another (packets vanish) gets it ejected within the configured bounds;
# `docker stop` of duet during a keep-alive load drains with zero failed requests. Every load is bounded
# in count and time; every container and the network are removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG="duet-ci-$$"
NET="duet-ci-$$"
WORK=$(mktemp -d)
cleanup() {
  if [ -n "${COMPOSE_UP:-}" ]; then
    DUET_IMAGE="$TAG" DUET_BACKEND_IMAGE="$TAG-backend" docker-compose -f deploy/compose.yaml -p "$TAG" down -t 2 >/dev/null 2>&1 || true
  fi
  docker rm -f "$TAG-duet" "$TAG-b1" "$TAG-b2" "$TAG-b3" >/dev/null 2>&1 || true
  docker network rm "$NET" >/dev/null 2>&1 || true
  docker image rm -f "$TAG" "$TAG-backend" "$TAG-binaries" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; docker logs "$TAG-duet" 2>&1 | tail -n 30 || true; exit 1; }

echo "== static binaries (x86_64-unknown-linux-musl)"
rustup target add x86_64-unknown-linux-musl >/dev/null 2>&1 || true
if ! rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl; then
  echo "!! the musl target cannot be installed here: container tests SKIPPED"
  exit 0
fi
if ! command -v musl-gcc >/dev/null 2>&1 || ! command -v curl >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq musl-tools curl >/dev/null
fi
cargo build --profile dist --locked --quiet --target x86_64-unknown-linux-musl --bin duet --bin duet-backend

echo "== image (deploy/Dockerfile over binaries compiled on the host: nothing pulled)"
docker build --quiet -f deploy/host-binaries.Dockerfile -t "$TAG-binaries" . >/dev/null
docker build --quiet -f deploy/Dockerfile --build-arg BINARIES="$TAG-binaries" -t "$TAG" . >/dev/null
docker build --quiet -f deploy/Dockerfile --build-arg BINARIES="$TAG-binaries" --target backend \
  -t "$TAG-backend" . >/dev/null
size=$(docker image inspect --format '{{.Size}}' "$TAG")
echo "image size: $((size / 1024)) KiB"
[ "$size" -le $((15 * 1024 * 1024)) ] || fail "image is $size bytes, over 15 MB"
user=$(docker image inspect --format '{{.Config.User}}' "$TAG")
[ "$user" = "10001:10001" ] || fail "image user is '$user'"
if docker run --rm --entrypoint /bin/sh "$TAG" -c true >/dev/null 2>&1; then
  fail "the image has a shell"
fi
if docker run --rm --entrypoint /usr/local/bin/duet-backend "$TAG" --help >/dev/null 2>&1; then
  fail "duet's image holds the demo backend"
fi

echo "== three backends and duet on network $NET"
docker network create "$NET" >/dev/null
for b in b1 b2 b3; do
  docker run -d --name "$TAG-$b" --network "$NET" "$TAG-backend" \
    --listen 0.0.0.0:9000 --name "$b" >/dev/null
done
cat >"$WORK/duet.yaml" <<YAML
workers: 2
listeners: [ { address: 0.0.0.0:8080 } ]
admin: { address: 0.0.0.0:9901 }
routes: [ { cluster: app } ]
clusters:
  - name: app
    policy: p2c_inflight
    backends:
      - address: $TAG-b1:9000
      - address: $TAG-b2:9000
      - address: $TAG-b3:9000
    dns_refresh: 1s
    timeouts: { connect: 300ms, response_headers: 1s, idle: 4s }
    outlier_detection: { consecutive_failures: 3, base_ejection_time: 30s, max_ejection_time: 60s, max_ejection_percent: 67% }
    retries: { attempts: 3, budget_percent: 100%, min_retries_per_second: 100 }
# As in the Kubernetes manifest: /ready turns 503 at SIGTERM while duet keeps serving for drain_delay.
shutdown: { drain_delay: 2s, drain_timeout: 10s }
YAML
chmod 644 "$WORK/duet.yaml"
docker run -d --name "$TAG-duet" --network "$NET" -p 127.0.0.1::8080 -p 127.0.0.1::9901 \
  -v "$WORK/duet.yaml:/etc/duet/duet.yaml:ro" "$TAG" >/dev/null
PORT=$(docker port "$TAG-duet" 8080/tcp | head -n 1 | sed 's/.*://')
ADMIN=$(docker port "$TAG-duet" 9901/tcp | head -n 1 | sed 's/.*://')

for _ in $(seq 1 50); do
  curl -fsS "http://127.0.0.1:$ADMIN/ready" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "http://127.0.0.1:$ADMIN/ready" >/dev/null || fail "duet never became ready"

uid=$(docker top "$TAG-duet" -eo pid,uid,comm | awk '$3 == "duet" { print $2 }' | head -n 1)
echo "duet runs as uid $uid"
[ "$uid" = "10001" ] || fail "duet runs as uid '$uid'"

health=""
for _ in $(seq 1 40); do
  health=$(docker inspect --format '{{.State.Health.Status}}' "$TAG-duet")
  [ "$health" = "healthy" ] && break
  sleep 0.5
done
echo "HEALTHCHECK (duet probe): $health"
[ "$health" = "healthy" ] || fail "HEALTHCHECK says '$health'"

echo "== every backend reached, by container name"
seen=$(for _ in $(seq 1 60); do
  curl -fsS -D - -o /dev/null "http://127.0.0.1:$PORT/" | tr -d '\r' | awk -F': ' 'tolower($1) == "x-backend" { print $2 }'
done | sort | uniq -c)
echo "$seen"
for b in b1 b2 b3; do
  echo "$seen" | grep -qw "$b" || fail "backend $b was never reached"
done

# A keep-alive load: REQUESTS GETs over CLIENTS connections, at most SECONDS; prints "ok=N failed=N"
# and the failures' reasons. A connection closed by duet (Connection: close during a drain) is reopened;
# a request that fails is counted, never retried by the client. Like a load balancer in front of duet,
# the load watches duet's /ready and sends no new request once it answers anything but 200.
load() {
  python3 - "$PORT" "$ADMIN" "$@" <<'PY'
import http.client, sys, threading, time
port, admin = int(sys.argv[1]), int(sys.argv[2])
requests, clients, seconds = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
ok, failed, reasons, lock = [0], [0], {}, threading.Lock()
deadline = time.monotonic() + seconds
ready = [True]
def watch_ready():
    while time.monotonic() < deadline and ready[0]:
        try:
            probe = http.client.HTTPConnection("127.0.0.1", admin, timeout=1)
            probe.request("GET", "/ready")
            ready[0] = probe.getresponse().status == 200
            probe.close()
        except Exception:
            ready[0] = False
        time.sleep(0.02)  # the probe's pace: /ready is polled until the deadline or a failure
threading.Thread(target=watch_ready, daemon=True).start()
def client(n):
    conn = None
    for _ in range(n):
        if time.monotonic() > deadline or not ready[0]:
            return
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/")
            response = conn.getresponse()
            response.read()
            with lock:
                if response.status == 200:
                    ok[0] += 1
                else:
                    failed[0] += 1
                    reasons[str(response.status)] = reasons.get(str(response.status), 0) + 1
            if response.getheader("connection", "").lower() == "close":
                conn.close()
                conn = None
        except Exception as error:
            with lock:
                failed[0] += 1
                reasons[type(error).__name__] = reasons.get(type(error).__name__, 0) + 1
            conn = None
        time.sleep(0.005)  # the clients' pace: a steady load, not a flood, across the kill or stop
threads = [threading.Thread(target=client, args=(requests // clients,)) for _ in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(f"ok={ok[0]} failed={failed[0]} {reasons if reasons else ''}")
PY
}
count() { sed -n "s/.*$1=\([0-9]*\).*/\1/p" <<<"$2"; }

echo "== docker kill of a backend during a keep-alive load"
load 2000 8 8 >"$WORK/kill.out" &
sleep 1
docker kill "$TAG-b2" >/dev/null
wait $!
result=$(cat "$WORK/kill.out")
echo "load while b2 was killed: $result"
[ "$(count failed "$result")" = "0" ] || fail "client errors while a backend was killed"
[ "$(count ok "$result")" -ge 500 ] || fail "too few requests served"

echo "== docker network disconnect of a backend (a partition) during a load"
metric() {
  curl -fsS "http://127.0.0.1:$ADMIN/metrics" | awk -v name="$1" \
    'index($0, name "{") == 1 { sum += $NF } END { print sum + 0 }'
}
ejected_before=$(metric duet_ejections_total)
start=$(date +%s%N)
docker network disconnect "$NET" "$TAG-b3"
load 1500 8 8 >"$WORK/partition.out"
result=$(cat "$WORK/partition.out")
echo "load while b3 was partitioned: $result"
ejections=$(( $(metric duet_ejections_total) - ejected_before ))
echo "ejections of the partitioned backend, counted by duet's workers: $ejections"
[ "$(count failed "$result")" = "0" ] || fail "client errors during the partition"
[ "$ejections" -ge 1 ] || fail "the partitioned backend was never ejected"
# Once ejected, b3 takes no more requests: only b1 answers now (b2 is dead, b3 unreachable).
served=$(for _ in $(seq 1 20); do
  curl -fsS -m 3 -D - -o /dev/null "http://127.0.0.1:$PORT/" | tr -d '\r' | awk -F': ' 'tolower($1) == "x-backend" { print $2 }'
done | sort | uniq -c)
echo "after the partition: $served"
echo "partition load and checks took $(( ($(date +%s%N) - start) / 1000000 )) ms (connect timeout 300 ms, ejection after 3 failures, names refreshed every 1 s)"
docker network connect "$NET" "$TAG-b3"

echo "== docker stop of duet during a keep-alive load: the drain loses nothing"
load 3000 8 10 >"$WORK/stop.out" &
sleep 1
stopping=$(date +%s%N)
docker stop --time 15 "$TAG-duet" >/dev/null
echo "docker stop returned after $(( ($(date +%s%N) - stopping) / 1000000 )) ms"
wait $!
result=$(cat "$WORK/stop.out")
code=$(docker inspect --format '{{.State.ExitCode}}' "$TAG-duet")
echo "load across docker stop: $result; duet exited with $code"
[ "$(count ok "$result")" -ge 200 ] || fail "too few requests before the drain"
[ "$(count failed "$result")" = "0" ] || fail "requests failed during the drain"
[ "$code" = "0" ] || fail "duet's exit code after the drain is $code"

echo "== deploy/compose.yaml: duet and three backends, one 20x slower"
if command -v docker-compose >/dev/null 2>&1; then
  compose=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
else
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null
  compose=(docker-compose)
fi
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export DUET_IMAGE="$TAG" DUET_BACKEND_IMAGE="$TAG-backend" DUET_PORT DUET_ADMIN_PORT
DUET_PORT=$(free_port)
DUET_ADMIN_PORT=$(free_port)
COMPOSE_UP=1
"${compose[@]}" -f deploy/compose.yaml -p "$TAG" up -d >/dev/null 2>&1 || fail "compose up failed"
PORT=$DUET_PORT
ADMIN=$DUET_ADMIN_PORT
for _ in $(seq 1 50); do
  curl -fsS "http://127.0.0.1:$ADMIN/ready" >/dev/null 2>&1 && break
  sleep 0.2
done
shares=$(python3 - "$PORT" <<'PY'
import collections, http.client, sys, threading
port, seen, lock = int(sys.argv[1]), collections.Counter(), threading.Lock()
def client():
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    for _ in range(60):
        conn.request("GET", "/")
        response = conn.getresponse()
        response.read()
        with lock:
            seen[response.getheader("x-backend") or str(response.status)] += 1
threads = [threading.Thread(target=client) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
total = sum(seen.values())
print(" ".join(f"{name}={count}" for name, count in sorted(seen.items())), f"slow_share={seen['slow'] / total:.3f}")
PY
)
echo "480 requests, 8 at a time: $shares"
slow=$(sed -n 's/.*slow_share=\([0-9.]*\).*/\1/p' <<<"$shares")
python3 -c "import sys; sys.exit(0 if float('$slow') < 0.15 else 1)" \
  || fail "the slow backend got a share of $slow (round robin would give it 0.333)"

echo "container tests: all passed"
