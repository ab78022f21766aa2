#!/usr/bin/env bash
# Memory per idle keep-alive client connection: duet beside nginx and HAProxy, in one run, on loopback.
#
#   benches/idle.sh [CONNECTIONS...]        (default: 1000 10000)
#   DUET=path/to/duet benches/idle.sh       another duet build (e.g. the static musl one of the image)
#   PROXIES=duet benches/idle.sh            only some of duet, nginx, haproxy
#
# Each proxy runs one worker in front of one loopback backend (nginx: least_conn with upstream
# keepalive; HAProxy: leastconn, http-reuse always), access logs off everywhere. Each proxy is first
# warmed up: one batch of connections is served and closed, so the one-time growth of the first busy
# moment (buffers of a batch served at once, upstream connections) is not charged to idle connections.
# Then, for each count, a Python client opens that many connections in batches of 500, sends one request
# on each, reads its response and keeps the connection open, letting each batch go idle (2.5 s) before
# the next; 11 s after the last (duet returns freed pages on 5 s ticks), the proxy's resident
# memory (VmRSS, all of its processes) is read from /proc. Reported: RSS before, RSS with the
# connections, the growth per connection, and ratios to the others. Installs nginx-light and haproxy with apt if missing. Needs an open-file limit above the
# largest count (the hard limit here is 20,000 per process).
#
# nginx allocates its connection and event structures for all of `worker_connections` at start (here
# sized to the largest count): they are in its "before" figure, not in its growth.
set -euo pipefail
cd "$(dirname "$0")/.."
COUNTS=("$@")
[ ${#COUNTS[@]} -gt 0 ] || COUNTS=(1000 10000)
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
ulimit -n "$(ulimit -Hn)"

MAX=0
for n in "${COUNTS[@]}"; do [ "$n" -gt "$MAX" ] && MAX=$n; done
if [ ! -x /usr/sbin/nginx ] || [ ! -x /usr/sbin/haproxy ]; then
  echo "== installing nginx-light and haproxy"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light haproxy >/dev/null
fi
NGINX=/usr/sbin/nginx
HAPROXY=/usr/sbin/haproxy

echo "== building duet (release)"
cargo build --release -q --bin duet --bin duet-backend
DUET=${DUET:-target/release/duet}
target/release/duet-backend --listen 127.0.0.1:19201 --name b --delay-ms 0 >/dev/null &

cat >"$WORK/duet.yaml" <<YAML
workers: 1
listeners: [ { address: 127.0.0.1:18280 } ]
routes: [ { cluster: app } ]
clusters:
  - name: app
    policy: p2c_inflight
    backends: [ { address: 127.0.0.1:19201 } ]
limits: { max_connections: 100000, header_read_timeout: 60s }
YAML
mkdir -p "$WORK/nginx/logs"
cat >"$WORK/nginx/nginx.conf" <<CONF
worker_processes 1;
worker_rlimit_nofile $(( 2 * MAX + 1000 < $(ulimit -Hn) ? 2 * MAX + 1000 : $(ulimit -Hn) ));
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/logs/error.log warn;
events { worker_connections $((MAX + 500)); }
http {
  access_log off;
  keepalive_timeout 75s;
  upstream app { least_conn; server 127.0.0.1:19201; keepalive 64; }
  server {
    listen 127.0.0.1:18290 backlog=4096;
    location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
CONF
# HAProxy reserves two descriptors per connection (client and server side) against its open-file
# limit: counts beyond half the hard limit are skipped for it.
HAPROXY_MAXCONN=$(( MAX + 500 < $(ulimit -Hn) / 2 - 100 ? MAX + 500 : $(ulimit -Hn) / 2 - 100 ))
cat >"$WORK/haproxy.cfg" <<CONF
global
  maxconn $HAPROXY_MAXCONN
  nbthread 1
defaults
  mode http
  timeout connect 5s
  timeout client 75s
  timeout server 60s
  timeout http-keep-alive 75s
  http-reuse always
frontend app
  bind 127.0.0.1:18300
  default_backend app
backend app
  balance leastconn
  server b 127.0.0.1:19201
CONF
RUST_LOG=warn "$DUET" run --config "$WORK/duet.yaml" 2>"$WORK/duet.log" &
DUET_PID=$!
"$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" 2>"$WORK/nginx.err" &
NGINX_PID=$!
"$HAPROXY" -f "$WORK/haproxy.cfg" -db 2>"$WORK/haproxy.err" &
HAPROXY_PID=$!
sleep 1

python3 - "$DUET_PID" "$NGINX_PID" "$HAPROXY_PID" "$HAPROXY_MAXCONN" "${COUNTS[@]}" <<'PY' || { tail -n 5 "$WORK"/*.err "$WORK"/*.log; exit 1; }
import os, socket, sys, time

pids = {"duet": int(sys.argv[1]), "nginx": int(sys.argv[2]), "haproxy": int(sys.argv[3])}
ports = {"duet": 18280, "nginx": 18290, "haproxy": 18300}
haproxy_max = int(sys.argv[4])
counts = [int(c) for c in sys.argv[5:]]

def tree(pid):
    """The process and its children (nginx's workers)."""
    pids = [pid]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        pids.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return pids

def rss_kib(pid):
    total = 0
    for p in tree(pid):
        with open(f"/proc/{p}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total

BATCH = 500

def hold(port, n):
    """Opens n connections in batches, each sending one request and reading its response; between
    batches the connections sit idle for longer than duet's 2 s before parking, as idle keep-alive
    connections accumulate in real traffic (rather than all being served in the same instant)."""
    conns = []
    request = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"
    while len(conns) < n:
        batch = []
        for _ in range(min(BATCH, n - len(conns))):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(request)
            batch.append(s)
        for s in batch:
            s.settimeout(10)
            got = b""
            while b"\r\n\r\n" not in got:
                chunk = s.recv(4096)
                if not chunk:
                    raise SystemExit("a proxy closed a connection")
                got += chunk
        conns.extend(batch)
        time.sleep(2.5)
    return conns

only = os.environ.get("PROXIES")
if only:
    pids = {k: v for k, v in pids.items() if k in only.split(",")}
# duet hands freed pages back to the system on its 5 s ticks after a crowd leaves, twice (the second
# for the upstream connections its pool closes after 4 s idle; crates/duet/src/memory.rs): every
# reading waits for both, so a burst's transient buffers are charged to nobody.
SETTLE = 11
for name in pids:
    for s in hold(ports[name], BATCH):
        s.close()
time.sleep(SETTLE)

print(f"{'proxy':<8} {'connections':>11} {'RSS before KiB':>15} {'RSS after KiB':>14} {'KiB/conn':>9}")
results = {}
for n in counts:
    for name, pid in pids.items():
        if name == "haproxy" and n > haproxy_max:
            print(f"{name:<8} {n:>11}  skipped: over HAProxy's maxconn {haproxy_max} (two descriptors per connection)")
            continue
        before = rss_kib(pid)
        conns = hold(ports[name], n)
        time.sleep(SETTLE)
        after = rss_kib(pid)
        results[(name, n)] = (after - before) / n, after
        print(f"{name:<8} {n:>11} {before:>15} {after:>14} {results[(name, n)][0]:>9.2f}")
        for s in conns:
            s.close()
        time.sleep(SETTLE)
print()
for n in counts:
    for other in ("nginx", "haproxy"):
        if (other, n) not in results or ("duet", n) not in results:
            continue
        per = results[("duet", n)][0] / max(results[(other, n)][0], 0.01)
        total = results[("duet", n)][1] / results[(other, n)][1]
        print(f"{n} idle connections: duet/{other} memory per connection = {per:.1f}, RSS with them = {total:.2f}")
PY
