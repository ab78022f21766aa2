#!/usr/bin/env bash
# Latency of established clients while a flood of connections waits past `limits.max_connections`.
#
#   benches/cap.sh [REPETITIONS] [SECONDS]       (defaults: 3 repetitions of 10 s)
#
# duet runs one worker pinned to CPU 0 with `max_connections: 64`, in front of one instant loopback
# backend; wrk and the flood share CPU 1. In each repetition:
#   unloaded  wrk -t1 -c16 for SECONDS: p50 and p99 of the 16 established connections.
#   flooded   the same wrk; one second in, a Python client opens FLOOD (2,000) more connections and sends
#             a request on each, holding them until wrk ends. The first 48 fit under the cap (they are
#             served, then park: a parked connection keeps its place under the cap); the rest wait in the
#             kernel's accept queue or in SYN retries and must get no answer while the cap is held.
#   control   the same wrk and the same flood, sent to a listener that never accepts: what the flood
#             costs this 2-core machine (its client shares wrk's core, the kernel handles its SYNs)
#             whatever the proxy does.
# Reported per repetition and as medians: p50/p99 of the three; p99 flooded over p99 control (target:
# within 2x: the flood past the cap costs the established clients nothing of duet's making), and how many
# flood connections were answered (target: at most 48).
# Installs wrk with apt if missing; needs an open-file limit above FLOOD + 100.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
SECS=${2:-10}
FLOOD=${FLOOD:-2000}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
ulimit -n "$(ulimit -Hn)"

if ! command -v wrk >/dev/null 2>&1; then
  echo "== installing wrk"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
fi
echo "== building duet (release)"
cargo build --release -q --bin duet --bin duet-backend
taskset -c 1 target/release/duet-backend --listen 127.0.0.1:19501 --name b >/dev/null &
cat >"$WORK/duet.yaml" <<YAML
workers: 1
listeners: [ { address: 127.0.0.1:18500 } ]
routes: [ { cluster: app } ]
clusters:
  - name: app
    policy: p2c_inflight
    backends: [ { address: 127.0.0.1:19501 } ]
# keepalive_requests raised: at the default (1,000) a wrk connection is asked to reconnect every
# ~0.1 s here, and a reconnecting client queues behind the flood like any new one (that is what the cap
# means: with nginx's worker_connections and keepalive_requests it is the same).
limits: { max_connections: 64, keepalive_requests: 100000000 }
YAML
RUST_LOG=warn taskset -c 0 target/release/duet run --config "$WORK/duet.yaml" 2>"$WORK/duet.log" &
sleep 1

cat >"$WORK/flood.py" <<'PY'
import socket, sys, time
count, hold, port = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
conns = []
# Paced (100 every 50 ms): the flood shares wrk's core, and a burst of its own CPU would show up in
# wrk's latencies as if it were duet's.
for i in range(count):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    conns.append(s)
    if i % 100 == 99:
        time.sleep(0.05)
time.sleep(0.5)
for i, s in enumerate(conns):
    try:
        s.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    except OSError:
        pass
    if i % 100 == 99:
        time.sleep(0.05)
time.sleep(hold)
answered = 0
for s in conns:
    try:
        if s.recv(64).startswith(b"HTTP/1.1"):
            answered += 1
    except OSError:
        pass
    s.close()
print(answered)
PY

# wrk's "Latency Distribution" lines: p50 and p99 in microseconds.
percentiles() {
  awk '
    function us(v) { if (v ~ /us$/) return v + 0; if (v ~ /ms$/) return v * 1000; if (v ~ /s$/) return v * 1000000; return v }
    $1 == "50%" { p50 = us($2) } $1 == "99%" { p99 = us($2) }
    END { printf "%d %d\n", p50, p99 }'
}

# The control: the same flood sent to a listener that never accepts, so wrk's latencies show what the
# flood costs this machine (its client shares wrk's core; the kernel handles its SYNs) without duet.
taskset -c 1 python3 -c 'import socket, time
s = socket.socket(); s.bind(("127.0.0.1", 18501)); s.listen(1024); time.sleep(100000)' &
sleep 0.5

flooded() { # port: where the flood goes. Prints "p50 p99 answered".
  taskset -c 1 wrk -t1 -c16 -d"${SECS}s" --latency http://127.0.0.1:18500/ >"$WORK/flooded.txt" &
  local wrk=$! answered
  sleep 1
  answered=$(taskset -c 1 python3 "$WORK/flood.py" "$FLOOD" "$((SECS - 4))" "$1")
  wait "$wrk"
  grep "Non-2xx\|Socket errors" "$WORK/flooded.txt" >&2 || true
  echo "$(percentiles <"$WORK/flooded.txt") $answered"
}

printf "%-4s %9s %9s %9s %9s %9s %9s %9s %9s\n" rep "p50 none" "p99 none" "p50 ctl" "p99 ctl" "p50 duet" "p99 duet" "answered" "p99 d/c"
for rep in $(seq 1 "$REPS"); do
  read -r u50 u99 < <(taskset -c 1 wrk -t1 -c16 -d"${SECS}s" --latency http://127.0.0.1:18500/ | percentiles)
  sleep 2
  read -r c50 c99 _ < <(flooded 18501)
  sleep 2
  read -r f50 f99 answered < <(flooded 18500)
  printf "%-4s %9s %9s %9s %9s %9s %9s %9s %9.2f\n" "$rep" "$u50" "$u99" "$c50" "$c99" "$f50" "$f99" "$answered" \
    "$(awk -v f="$f99" -v c="$c99" 'BEGIN { print f / c }')"
  echo "$u99 $c99 $f99 $answered" >>"$WORK/all.txt"
  sleep 2
done
python3 - "$WORK/all.txt" <<'PY'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
unloaded = statistics.median(f / u for u, c, f, _ in rows)
control = statistics.median(f / c for u, c, f, _ in rows)
flood_cost = statistics.median(c / u for u, c, f, _ in rows)
print(f"median p99, flood at duet / no flood: {unloaded:.2f}; flood at duet / the same flood elsewhere: "
      f"{control:.2f} (target <= 2); the flood's own cost here (elsewhere / none): {flood_cost:.2f}")
print(f"flood connections answered: {', '.join(str(int(a)) for *_, a in rows)} (48 fit under the cap)")
PY
grep -i "warn\|error" "$WORK/duet.log" | head -5 || true
