#!/usr/bin/env bash
# CPU per request, and what it is made of, for duet, bare hyper, nginx and HAProxy in the same run (#30):
# the README's "Efficiency" table.
#
#   benches/efficiency.sh [REPETITIONS] [SECONDS]   (defaults: 3 repetitions of 8 s per proxy and run)
#   PROXIES="duet bare" benches/efficiency.sh       a subset (default: duet bare haproxy nginx)
#   DUET=/path/to/duet benches/efficiency.sh        another duet build (the others are this tree's)
#   INSTRUCTIONS=0 benches/efficiency.sh            without the callgrind pass
#   OFFSET=100 benches/efficiency.sh                every port moved by 100 (another measurement beside it)
#   DUET_ENV="DUET_X_EVENT_INTERVAL=8" ...          environment for duet only (a runtime setting's trial)
#
# duet runs with its default logging (RUST_LOG=info: one access-log line per request, to a file), the
# others without an access log (bare hyper has none): the configuration #30 states its targets for.
# Proxies and configurations are benches/anchors.sh's; each gets one worker pinned to CPU 0, wrk and the
# backends share CPU 1. In each repetition the proxies run in turn:
#   closed  four instant backends, wrk -t1 -c64 for SECONDS
#   fixed   six backends that answer after 5 ms, about 1,500 requests/s: 96 wrk connections each waiting
#           PACE_MS (59) after each response. wrk has no open loop: the rate is 96 / (59 ms + latency),
#           1,490/s at the 5.5 ms a quiet machine gives and lower when CPU 1 is contended (the achieved
#           rate is printed; every figure is per request)
# Per request: CPU µs (utime + stime of the proxy's process tree, /proc) and wake-ups (voluntary context
# switches of all its threads, /proc: each is a sleep in epoll_wait or on a lock ended by an event).
# Then, unless INSTRUCTIONS=0, benches/instructions.sh counts user-space instructions per request under
# callgrind (wrk -c8, closed loop, four instant backends). Cycles and cache misses: `perf stat` has no
# hardware counters on the virtual machines this was written on; the script prints them when it does.
# The machine is noisy: medians over repetitions, and ratios to bare hyper taken within each repetition.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
SECS=${2:-8}
PACE_MS=${PACE_MS:-59}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

if [ ! -x /usr/sbin/nginx ] || [ ! -x /usr/sbin/haproxy ] || ! command -v wrk >/dev/null 2>&1; then
  echo "== installing nginx-light, haproxy and wrk"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light haproxy wrk >/dev/null
fi
if [ -z "${NO_BUILD:-}" ]; then # NO_BUILD=1: the release binaries as they are
  echo "== building duet (release) and bare hyper"
  cargo build --release -q --bin duet --bin duet-backend
  cargo build --release -q -p duet-proxy --example bare_hyper
fi
PROXIES=${PROXIES:-duet bare haproxy nginx}
OFFSET=${OFFSET:-0}
INSTANT="$((19301 + OFFSET)) $((19302 + OFFSET)) $((19303 + OFFSET)) $((19304 + OFFSET))"
SLOW="$((19311 + OFFSET)) $((19312 + OFFSET)) $((19313 + OFFSET)) $((19314 + OFFSET)) $((19315 + OFFSET)) $((19316 + OFFSET))"
source "$(dirname "$0")/anchors.sh"
# refuse_taken, wait_for and stop.
source "$(dirname "$0")/proc_cpu.sh"
for port in $INSTANT $SLOW; do refuse_taken "$port"; done
for port in $INSTANT; do
  taskset -c 1 target/release/duet-backend --listen "127.0.0.1:$port" --name "b$port" >/dev/null &
done
for port in $SLOW; do
  taskset -c 1 target/release/duet-backend --listen "127.0.0.1:$port" --name "s$port" --delay-ms 5 >/dev/null &
done
for port in $INSTANT $SLOW; do wait_for "$port"; done

cat >"$WORK/paced.lua" <<LUA
function delay() return $PACE_MS end
LUA

PERF=""
if perf stat -e cycles,cache-misses true 2>&1 | grep -q "cycles" &&
  ! perf stat -e cycles,cache-misses true 2>&1 | grep -q "not supported"; then
  PERF=1
fi

sample() { # pid -> "utime stime voluntary_switches" of it, its children and all their threads
  python3 - "$1" <<'PY'
import os, sys
root = int(sys.argv[1])
user = kernel = switches = 0
for entry in os.listdir("/proc"):
    if not entry.isdigit():
        continue
    try:
        with open(f"/proc/{entry}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if int(entry) != root and int(fields[1]) != root:
            continue
        user += int(fields[11])
        kernel += int(fields[12])
        for task in os.listdir(f"/proc/{entry}/task"):
            with open(f"/proc/{entry}/task/{task}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        switches += int(line.split()[1])
    except OSError:
        continue
print(user, kernel, switches)
PY
}

measure() { # proxy mode pid -> "rps cpu_us user_us kernel_us wakeups non2xx cycles cache_misses"
  local url="http://127.0.0.1:$(port "$1")/api/x" before after out perf_out="" perf_pid=""
  if [ -n "$PERF" ]; then
    perf stat -x, -e cycles,cache-misses -p "$3" -o "$WORK/perf.txt" &
    perf_pid=$!
  fi
  before=$(sample "$3")
  if [ "$2" = closed ]; then
    out=$(taskset -c 1 wrk -t1 -c64 -d"${SECS}s" "$url")
  else
    out=$(taskset -c 1 wrk -t1 -c96 -d"${SECS}s" -s "$WORK/paced.lua" "$url")
  fi
  after=$(sample "$3")
  if [ -n "$perf_pid" ]; then
    kill -INT "$perf_pid" 2>/dev/null || true
    wait "$perf_pid" 2>/dev/null || true
    perf_out=$(cat "$WORK/perf.txt")
  fi
  python3 -c '
import re, sys
text, perf = sys.stdin.read(), sys.argv[3]
before, after = [int(x) for x in sys.argv[1].split()], [int(x) for x in sys.argv[2].split()]
user, kernel, switches = (a - b for a, b in zip(after, before))
total = max(int(re.search(r"(\d+) requests in", text).group(1)), 1)
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
us = lambda ticks: ticks / 100 * 1e6 / total  # clock ticks are 1/100 s
def counter(name):
    m = re.search(r"^([\d.]+),[^,]*," + name, perf, re.M)
    return float(m.group(1)) / total if m else -1
print(rps, us(user + kernel), us(user), us(kernel), switches / total, bad.group(1) if bad else 0,
      counter("cycles"), counter("cache-misses"))' "$before" "$after" "$perf_out" <<<"$out"
}

RESULTS="$WORK/results.txt"
printf "%-4s %-7s %-7s %9s %11s %8s %8s %9s\n" rep proxy run req/s "CPU us/req" user kernel wakeups
for rep in $(seq 1 "$REPS"); do
  for mode in closed fixed; do
    if [ "$mode" = closed ]; then BACKENDS=$INSTANT; else BACKENDS=$SLOW; fi
    write_configs off
    for proxy in $PROXIES; do
      # duet with its default log level; the anchors with the access log off (write_configs off).
      if [ "$proxy" = duet ]; then
        # shellcheck disable=SC2086 # DUET_ENV is a list of NAME=value words
        pid=$(if [ -n "${DUET_ENV:-}" ]; then export ${DUET_ENV?}; fi; start duet on)
      else
        pid=$(start "$proxy" off)
      fi
      wait_for "$(port "$proxy")"
      curl -sf "http://127.0.0.1:$(port "$proxy")/api/x" >/dev/null || { echo "$proxy is not answering"; exit 1; }
      taskset -c 1 wrk -t1 -c16 -d1s "http://127.0.0.1:$(port "$proxy")/api/x" >/dev/null # warm-up
      read -r rps cpu user kernel wakeups bad cycles misses <<<"$(measure "$proxy" "$mode" "$pid")"
      printf "%-4s %-7s %-7s %9.0f %11.1f %8.1f %8.1f %9.2f\n" "$rep" "$proxy" "$mode" "$rps" "$cpu" "$user" "$kernel" "$wakeups"
      echo "$rep $proxy $mode $rps $cpu $user $kernel $wakeups $bad $cycles $misses" >>"$RESULTS"
      stop "$pid"
      rm -f "$WORK/nginx/logs/access.log" "$WORK/duet.log" "$WORK/haproxy.log"
    done
  done
done
kill $(jobs -p) 2>/dev/null || true
wait 2>/dev/null || true

: >"$WORK/instructions.txt"
if [ "${INSTRUCTIONS:-1}" != 0 ]; then
  echo "== user-space instructions per request (benches/instructions.sh)"
  PROXIES="$PROXIES" DUET="${DUET:-}" NO_BUILD=1 benches/instructions.sh 6 | tee "$WORK/instructions.txt"
fi

python3 - "$RESULTS" "$WORK/instructions.txt" <<'PY'
import collections, re, statistics, sys
data = collections.defaultdict(dict)  # (rep, mode) -> proxy -> figures
bad = 0
for line in open(sys.argv[1]):
    rep, proxy, mode, *rest = line.split()
    rps, cpu, user, kernel, wakeups, b, cycles, misses = map(float, rest)
    data[(rep, mode)][proxy] = dict(rps=rps, cpu=cpu, user=user, kernel=kernel, wakeups=wakeups,
                                     cycles=cycles, misses=misses)
    bad += int(b)
instructions = {}
for line in open(sys.argv[2]):
    m = re.match(r"\s*(\w+)\s+log (on|off)\s+\d+ requests\s+(\d+) instructions/request", line)
    # duet with its default logging, the others without an access log, as in the timed runs.
    if m and (m.group(2) == "on") == (m.group(1) == "duet"):
        instructions[m.group(1)] = int(m.group(3))
proxies = [p for p in ("duet", "bare", "haproxy", "nginx") if any(p in v for v in data.values())]
names = {"duet": "duet (log on)", "bare": "bare hyper", "haproxy": "HAProxy leastconn", "nginx": "nginx least_conn"}
def med(mode, proxy, key):
    return statistics.median(v[proxy][key] for (r, m), v in data.items() if m == mode and proxy in v)
def ratio(mode, proxy, key):
    if "bare" not in proxies:
        return ""
    return " (%.2f×)" % statistics.median(v[proxy][key] / v["bare"][key] for (r, m), v in data.items()
                                          if m == mode and proxy in v and v["bare"][key] > 0)
print()
print("| | closed loop req/s | closed loop CPU µs/req | 1,500/s: achieved req/s | 1,500/s: CPU µs/req "
      "(user + kernel) | 1,500/s: wake-ups/req | instructions/req |")
print("|---|---:|---:|---:|---:|---:|---:|")
for p in proxies:
    print(f"| {names[p]} | {med('closed', p, 'rps'):.0f}{ratio('closed', p, 'rps')} "
          f"| {med('closed', p, 'cpu'):.1f}{ratio('closed', p, 'cpu')} "
          f"| {med('fixed', p, 'rps'):.0f} "
          f"| {med('fixed', p, 'cpu'):.1f}{ratio('fixed', p, 'cpu')} "
          f"({med('fixed', p, 'user'):.1f} + {med('fixed', p, 'kernel'):.1f}) "
          f"| {med('fixed', p, 'wakeups'):.2f} "
          f"| {instructions.get(p, '–')} |")
if any(v[p]["cycles"] > 0 for v in data.values() for p in v):
    for p in proxies:
        print(f"  {p}: {med('fixed', p, 'cycles'):.0f} cycles/req, {med('fixed', p, 'misses'):.1f} cache misses/req at 1,500/s")
else:
    print("(perf stat: no hardware counters here, so no cycles or cache misses)")
print(f"ratios in brackets: to bare hyper, the median of per-repetition ratios; non-2xx responses: {bad}")
PY
