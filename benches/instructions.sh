#!/usr/bin/env bash
# Instructions per proxied request, duet against HAProxy and nginx, counted by valgrind's callgrind: the
# one CPU figure a noisy 2-core virtual machine reproduces to within a percent or two, where req/s moves
# by 30%.
#
#   benches/instructions.sh [SECONDS]       (default: 6 s of measured traffic per run)
#   DUET=/path/to/duet benches/instructions.sh
#                                           counts another duet build (a before/after pair)
#   OFFSET=100 benches/instructions.sh       moves every port by 100 (two measurements at once)
#   NO_BUILD=1 benches/instructions.sh      uses the release binaries as they are (a build of another
#                                           profile holds cargo's lock on target/)
#   PACE_MS=50 benches/instructions.sh       each of wrk's 8 connections waits 50 ms after each response
#                                           (about 150 requests/s): the cost per request at a low rate,
#                                           where each request wakes the proxy on its own
#   KEEP=/tmp/profiles benches/instructions.sh
#                                           keeps each run's callgrind output there (PROXY-log-on.out), for
#                                           callgrind_annotate --inclusive=yes to say where the instructions go
#
# Installs valgrind, haproxy, nginx-light and wrk with apt if missing and builds duet in release mode. The
# proxies and their configurations are those of benches/record.sh (benches/anchors.sh), each access log
# off and then on (nginx without its master process). Each runs under callgrind; after 2 s of warm-up the
# counters are zeroed (callgrind_control -z), then SECONDS of wrk -c8 traffic are counted (callgrind runs
# a program ~50x slower, so the proxy is the bottleneck): user-space instructions of the proxy's
# process. The kernel's share, the same TCP work for every proxy, is not counted.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-6}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

if ! command -v valgrind >/dev/null 2>&1 || [ ! -x /usr/sbin/haproxy ] || [ ! -x /usr/sbin/nginx ] ||
  ! command -v wrk >/dev/null 2>&1; then
  echo "== installing valgrind, haproxy, nginx-light and wrk"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind haproxy nginx-light wrk >/dev/null
fi
PROXIES=${PROXIES:-duet haproxy nginx}
if [ -z "${NO_BUILD:-}" ]; then
  echo "== building duet (release)"
  cargo build --release -q --bin duet --bin duet-backend
  case " $PROXIES " in *" bare "*) cargo build --release -q -p duet-proxy --example bare_hyper ;; esac
fi
source "$(dirname "$0")/anchors.sh"
for port in $BACKENDS; do
  target/release/duet-backend --listen "127.0.0.1:$port" --name "b$port" >/dev/null &
done

COUNTS="$WORK/counts"
mkdir "$COUNTS"
LAUNCH="valgrind --tool=callgrind --log-file=$COUNTS/valgrind.%p.log --callgrind-out-file=$COUNTS/callgrind.out.%p"

wait_for() { # port
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "nothing listening on $1" >&2
  return 1
}

count() { # proxy log
  local url pid requests total
  url="http://127.0.0.1:$(port "$1")/api/x"
  rm -f "$COUNTS"/callgrind.out.*
  pid=$(start "$1" "$2")
  wait_for "$(port "$1")"
  wrk -t1 -c8 -d2 "$url" >/dev/null
  # Only this process's counters: a bare `callgrind_control -z` zeroes every callgrind run on the machine,
  # which corrupts a measurement running beside this one.
  if ! callgrind_control -z "$pid" >/dev/null 2>&1; then
    echo "callgrind_control could not zero process $pid ($1): is it running under callgrind?" >&2
    return 1
  fi
  requests=$(wrk -t1 -c8 -d"$SECS" ${PACE_MS:+-s "$WORK/paced.lua"} "$url" | awk '/requests in/ {print $1}')
  kill "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  total=$(callgrind_annotate "$COUNTS"/callgrind.out.* 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP" && cat "$COUNTS"/callgrind.out.* >"$KEEP/$1-log-$2.out"
  fi
  printf '  %-8s log %-3s %8d requests  %7d instructions/request\n' "$1" "$2" "$requests" $((total / requests))
}

if [ -n "${PACE_MS:-}" ]; then
  echo "function delay() return $PACE_MS end" >"$WORK/paced.lua"
fi
echo "== user-space instructions per request (callgrind, wrk -c8${PACE_MS:+ pausing $PACE_MS ms after each response}, ${SECS} s counted)"
for log in off on; do
  write_configs "$log"
  # nginx serves in its master process (the same request path as its worker): callgrind_control cannot
  # reach a worker that has dropped to another user.
  sed -i '1i master_process off;' "$WORK/nginx/nginx.conf"
  for proxy in $PROXIES; do
    count "$proxy" "$log"
  done
  rm -f "$WORK/nginx/logs/access.log" "$WORK/duet.log" "$WORK/haproxy.log"
done
