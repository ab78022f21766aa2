#!/usr/bin/env bash
# What the raw-frame HTTP/2 attacks of tests/h2_frames.py cost a release duet (issue #28): each attack
# is repeated by ATTACKERS loops for SECONDS against a fresh duet while h2load, a well-behaved h2c
# client, is served through the same listener.
#
#   benches/h2_attacks.sh [SECONDS] [ATTACKERS] [RPS]   (defaults: 20 s, 4 attacker loops, 1000 req/s)
#
# Needs python3-h2 and nghttp2-client (h2load), installed with apt if missing; builds duet in release
# mode. duet runs one worker pinned to CPU 0 with the default limits (RUST_LOG=warn); two duet-backend
# processes, the attackers and h2load share CPU 1.
#   none                 h2load alone: the baseline
#   rapid_reset          20,000 HEADERS + RST_STREAM pairs per connection (CVE-2023-44487)
#   continuation_flood   a HEADERS frame, then up to 20,000 CONTINUATION frames of 4 KB (CVE-2024-27316)
#   silent               the preface and SETTINGS, then nothing (each held until header_read_timeout)
#   zero_window          10 GETs of 2 MiB behind a window of 0 (each stream reset at send_timeout, 3 s here)
#   silent_forever       the preface, then nothing, not even a PING ACK (closed after its GOAWAY)
#   buffered_uploads     100 streams each sending 999,999 of 1,000,000 bytes to a buffer_request route
# Reported per attack: duet's peak RSS (VmHWM, MiB) and CPU seconds (utime + stime over the phase),
# attack connections made and how duet ended them, frames sent, and h2load's succeeded/failed requests
# and their mean and longest time (h2load -c4 -m10 at a fixed RPS over h2c, so an attack that starves
# the shared CPU 1 of h2load cannot pass for one that slows duet: every row should have RPS x SECONDS).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-20}
ATTACKERS=${2:-4}
RPS=${3:-1000}
WORK=$(mktemp -d)
DUET_PID=""
trap 'kill $(jobs -p) $DUET_PID 2>/dev/null || true; rm -rf "$WORK"' EXIT
PYTHON=/usr/bin/python3

if ! $PYTHON -c "import h2" 2>/dev/null || ! command -v h2load >/dev/null 2>&1; then
  echo "== installing python3-h2 and nghttp2-client"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-h2 nghttp2-client >/dev/null
fi
echo "== building duet (release)"
cargo build --release -q --bin duet --bin duet-backend
source "$(dirname "$0")/proc_cpu.sh"
for port in 18600 18609 19601 19602; do refuse_taken "$port"; done
for port in 19601 19602; do
  taskset -c 1 target/release/duet-backend --listen "127.0.0.1:$port" --name "b$port" >/dev/null &
done
wait_for 19602

cat >"$WORK/duet.yaml" <<YAML
workers: 1
listeners: [ { address: 127.0.0.1:18600 } ]
admin: { address: 127.0.0.1:18609 }
limits: { send_timeout: 3s }
routes:
  - match: { path_prefix: /upload/buffered }
    cluster: app
    buffer_request: 1MiB
  - match: { path_prefix: / }
    cluster: app
clusters:
  - name: app
    policy: p2c_peak_ewma
    backends: [ { address: 127.0.0.1:19601 }, { address: 127.0.0.1:19602 } ]
YAML

attack_loop() { # attack until: one outcome line per connection into $WORK/attack.log
  while [ "$(date +%s)" -lt "$2" ]; do
    taskset -c 1 $PYTHON tests/h2_frames.py 127.0.0.1 18600 "$1" >>"$WORK/attack.log" 2>/dev/null || true
  done
}

peak_rss_kib() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status"; }

printf "%-19s %8s %7s %6s %-20s %8s %9s %6s %15s\n" attack "RSS MiB" "CPU s" conns "ended by" frames "h2load ok" failed "mean/max ms"
for attack in none rapid_reset continuation_flood silent zero_window silent_forever buffered_uploads; do
  refuse_taken 18600
  RUST_LOG=warn taskset -c 0 target/release/duet run --config "$WORK/duet.yaml" >/dev/null 2>"$WORK/duet.err" &
  DUET_PID=$!
  wait_for 18600
  curl -sf --http2-prior-knowledge http://127.0.0.1:18600/x >/dev/null ||
    { echo "duet is not answering h2c"; tail "$WORK/duet.err"; exit 1; }
  : >"$WORK/attack.log"
  before=$(cpu_ticks "$DUET_PID")
  end=$(($(date +%s) + SECS))
  attackers=()
  if [ "$attack" != none ]; then
    for _ in $(seq 1 "$ATTACKERS"); do
      attack_loop "$attack" "$end" &
      attackers+=($!)
    done
  fi
  taskset -c 1 timeout $((SECS + 30)) h2load -t1 -c4 -m10 --rps $((RPS / 4)) -D "$SECS" http://127.0.0.1:18600/x >"$WORK/h2load.txt" || true
  # An attack run started just before the end finishes (10 s at most) before the figures are read.
  if [ ${#attackers[@]} -gt 0 ]; then wait "${attackers[@]}"; fi
  after=$(cpu_ticks "$DUET_PID")
  rss=$(peak_rss_kib "$DUET_PID")
  kill -0 "$DUET_PID" || { echo "duet died under $attack"; tail "$WORK/duet.err"; exit 1; }
  kill "$DUET_PID"
  wait "$DUET_PID" 2>/dev/null || true
  DUET_PID=""
  python3 - "$attack" "$rss" "$before" "$after" "$WORK/attack.log" "$WORK/h2load.txt" <<'PY'
import collections, re, sys
attack, rss, before, after, log, h2load = sys.argv[1:7]
b, a = [int(x) for x in before.split()], [int(x) for x in after.split()]
cpu = (a[0] - b[0] + a[1] - b[1]) / 100
ended, frames, conns = collections.Counter(), 0, 0
for line in open(log):
    how, _, sent = line.strip().rpartition(" sent=")
    if sent.isdigit():
        conns += 1
        frames += int(sent)
        ended[how] += 1
text = open(h2load).read()
m = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", text)
ok, failed = (int(m.group(2)), int(m.group(3)) + int(m.group(4))) if m else (0, -1)
how = ", ".join(f"{k} x{v}" for k, v in ended.most_common()) or "-"
def ms(value):
    number, unit = re.match(r"([\d.]+)(\w+)", value).groups()
    return float(number) * {"us": 0.001, "ms": 1, "s": 1000}[unit]
t = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", text)
times = f"{ms(t.group(3)):.1f}/{ms(t.group(2)):.0f}" if t else "-"
print(f"{attack:<19} {int(rss) / 1024:8.1f} {cpu:7.2f} {conns:6} {how:<20} {frames:8} {ok:9} {failed:6} {times:>15}")
PY
done
echo "(one noisy shared 2-core machine: compare rows of the same run, not absolute figures)"
