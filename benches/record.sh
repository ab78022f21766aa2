#!/usr/bin/env bash
# The benchmark of record: duet against HAProxy and nginx at their best settings, side by side in one run,
# on loopback, with every proxy's access log off and then on.
#
#   benches/record.sh [REPETITIONS] [SECONDS]      (defaults: 5 repetitions of 8 s per proxy and run)
#   PROXIES="duet bare haproxy nginx" benches/record.sh
#                                                  adds the calibration proxy (hyper alone, see anchors.sh)
#
# Installs nginx-light, haproxy and wrk with apt if missing and builds duet in release mode. Each proxy
# gets one worker pinned to CPU 0; four instant loopback backends and wrk share CPU 1.
#   duet     p2c_peak_ewma, routing, retries (3 attempts, budget), the admin listener (metrics) on;
#            log "on" is its default (RUST_LOG=info: one access-log line per request, to a file)
#   HAProxy  balance leastconn, http-reuse always; log "on": option httplog to a file (log stdout)
#   nginx    least_conn, upstream keepalive 64; log "on": its default combined access_log to a file
# In each repetition, for each log setting, the proxies run in turn:
#   closed   wrk -t1 -c64 for SECONDS: requests/s, p99, CPU µs per request
#   fixed    1,500 requests/s (wrk, 16 connections, each waiting 10.7 ms between requests): CPU µs per
#            request at equal load
# CPU is the proxy's own (utime + stime of all its processes, from /proc), reported whole and split into
# user space (what the proxy's own code costs) and kernel (the TCP work of a request, about the same for
# every proxy since all make the same system calls). Reported: the medians, and the median of
# per-repetition ratios of duet to the better of the other two.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}
SECS=${2:-8}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

if [ ! -x /usr/sbin/nginx ] || [ ! -x /usr/sbin/haproxy ] || ! command -v wrk >/dev/null 2>&1; then
  echo "== installing nginx-light, haproxy and wrk"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light haproxy wrk >/dev/null
fi
echo "== building duet (release)"
cargo build --release -q --bin duet --bin duet-backend
PROXIES=${PROXIES:-duet haproxy nginx}
case " $PROXIES " in *" bare "*) cargo build --release -q -p duet-proxy --example bare_hyper ;; esac
for port in 19301 19302 19303 19304; do
  taskset -c 1 target/release/duet-backend --listen "127.0.0.1:$port" --name "b$port" >/dev/null &
done

# The three proxies, their configurations and how each is started: shared with benches/instructions.sh.
source "$(dirname "$0")/anchors.sh"

# cpu_ticks PID: utime and stime of a process tree (shared with upstream_tls.sh and h2load.sh).
source "$(dirname "$0")/proc_cpu.sh"

cat >"$WORK/fixed.lua" <<'LUA'
-- 16 connections, each waiting 16/1500 s between requests: 1,500 requests/s in all.
function delay() return 10.667 end
LUA

measure() { # proxy mode(closed|fixed) pid -> "rps p99_ms cpu_us_per_request non2xx user_us kernel_us"
  local url="http://127.0.0.1:$(port "$1")/api/x" before after out
  before=$(cpu_ticks "$3")
  if [ "$2" = closed ]; then
    out=$(taskset -c 1 wrk -t1 -c64 -d"${SECS}s" --latency "$url")
  else
    out=$(taskset -c 1 wrk -t1 -c16 -d"${SECS}s" --latency -s "$WORK/fixed.lua" "$url")
  fi
  after=$(cpu_ticks "$3")
  python3 -c '
import re, sys
text = sys.stdin.read()
before, after = [int(x) for x in sys.argv[1].split()], [int(x) for x in sys.argv[2].split()]
user, kernel = after[0] - before[0], after[1] - before[1]
total = int(re.search(r"(\d+) requests in", text).group(1))
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
m = re.search(r"99%\s+([\d.]+)(us|ms|s)\b", text)
p99 = float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
us = lambda ticks: ticks / 100 * 1e6 / max(total, 1)  # clock ticks are 1/100 s
print(rps, p99, us(user + kernel), bad.group(1) if bad else 0, us(user), us(kernel))' "$before" "$after" <<<"$out"
}

RESULTS="$WORK/results.txt"
printf "%-4s %-4s %-7s %-7s %10s %9s %12s %9s %9s\n" rep log proxy run req/s p99 "CPU us/req" user kernel
for rep in $(seq 1 "$REPS"); do
  for log in off on; do
    write_configs "$log"
    for proxy in $PROXIES; do
      pid=$(start "$proxy" "$log")
      sleep 1
      curl -sf "http://127.0.0.1:$(port "$proxy")/api/x" >/dev/null || { echo "$proxy is not answering"; cat "$WORK"/*.log "$WORK"/*.err 2>/dev/null | tail; exit 1; }
      for mode in closed fixed; do
        read -r rps p99 cpu bad user kernel <<<"$(measure "$proxy" "$mode" "$pid")"
        printf "%-4s %-4s %-7s %-7s %10.0f %7.2fms %12.1f %9.1f %9.1f\n" "$rep" "$log" "$proxy" "$mode" "$rps" "$p99" "$cpu" "$user" "$kernel"
        echo "$rep $log $proxy $mode $rps $p99 $cpu $bad $user $kernel" >>"$RESULTS"
      done
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      rm -f "$WORK/nginx/logs/access.log" "$WORK/duet.log" "$WORK/haproxy.log"
    done
  done
done

python3 - "$RESULTS" <<'PY'
import collections, statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
data = collections.defaultdict(dict)  # (rep, log, mode) -> proxy -> (rps, p99, cpu, user, kernel)
bad = 0
for rep, log, proxy, mode, rps, p99, cpu, b, user, kernel in rows:
    data[(rep, log, mode)][proxy] = (float(rps), float(p99), float(cpu), float(user), float(kernel))
    bad += int(float(b))
def med(log, mode, proxy, i):
    return statistics.median(v[proxy][i] for (r, l, m), v in data.items() if l == log and m == mode)
def ratio(log, mode, f):
    return statistics.median(f(v) for (r, l, m), v in data.items() if l == log and m == mode)
print()
for log in ("off", "on"):
    print(f"access log {log}:")
    for proxy in [p for p in ("duet", "bare", "haproxy", "nginx") if any(p in v for v in data.values())]:
        print(f"  {proxy:<8} {med(log, 'closed', proxy, 0):>8.0f} req/s  p99 {med(log, 'closed', proxy, 1):5.2f} ms"
              f"  {med(log, 'closed', proxy, 2):5.1f} us/req (closed loop: user {med(log, 'closed', proxy, 3):4.1f},"
              f" kernel {med(log, 'closed', proxy, 4):4.1f})  {med(log, 'fixed', proxy, 2):5.1f} us/req at 1,500/s")
    print(f"  duet / better of HAProxy and nginx, req/s: {ratio(log, 'closed', lambda v: v['duet'][0] / max(v['haproxy'][0], v['nginx'][0])):.2f}"
          f"   CPU per request at 1,500/s: {ratio(log, 'fixed', lambda v: v['duet'][2] / min(v['haproxy'][2], v['nginx'][2])):.2f}"
          f"   user-space CPU per request (closed loop): {ratio(log, 'closed', lambda v: v['duet'][3] / min(v['haproxy'][3], v['nginx'][3])):.2f}")
    # The calibration never logs: it is compared only where nobody does.
    if log == "off" and any("bare" in v for v in data.values()):
        print(f"  bare hyper / better of HAProxy and nginx, req/s: {ratio(log, 'closed', lambda v: v['bare'][0] / max(v['haproxy'][0], v['nginx'][0])):.2f}"
              f"   CPU per request at 1,500/s: {ratio(log, 'fixed', lambda v: v['bare'][2] / min(v['haproxy'][2], v['nginx'][2])):.2f}"
              f"   (the calibration: what hyper and the kernel cost before duet adds anything)")
cost = statistics.median(1 - data[(r, 'on', 'closed')]['duet'][0] / data[(r, 'off', 'closed')]['duet'][0]
                         for r in {k[0] for k in data})
print(f"duet's access log costs {cost * 100:.1f}% of its throughput (median over repetitions)")
# req/s is bounded by wrk and the backends on the other core as much as by the proxy: CPU per request
# is the cost the log adds to the proxy itself.
for mode, label in (("closed", "closed loop"), ("fixed", "1,500/s")):
    added = statistics.median(data[(r, 'on', mode)]['duet'][2] / data[(r, 'off', mode)]['duet'][2] - 1
                              for r in {k[0] for k in data})
    print(f"duet's access log adds {added * 100:.1f}% CPU per request ({label}, median over repetitions)")
print(f"non-2xx responses across all runs: {bad}")
PY
