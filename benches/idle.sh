#!/usr/bin/env bash
# Memory per idle keep-alive client connection: duet beside nginx, in one run, on loopback.
#
#   benches/idle.sh [CONNECTIONS...]        (default: 1000 10000)
#
# Each proxy runs one worker in front of one loopback backend (nginx: least_conn with upstream
# keepalive). For each count, a Python client opens that many connections, sends one request on each,
# reads its response and keeps the connection open; after 3 s the proxy's resident memory (VmRSS, all of
# its processes) is read from /proc. Reported: RSS with no client, with the connections, and the growth
# per connection, then duet/nginx. Installs nginx-light with apt if missing. Needs an open-file limit
# above the largest count (the hard limit here is 20,000 per process).
set -euo pipefail
cd "$(dirname "$0")/.."
COUNTS=("$@")
[ ${#COUNTS[@]} -gt 0 ] || COUNTS=(1000 10000)
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
ulimit -n "$(ulimit -Hn)"

if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  echo "== installing nginx-light"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

echo "== building duet (release)"
cargo build --release -q --bin duet --bin duet-backend
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
worker_rlimit_nofile 40000;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/logs/error.log warn;
events { worker_connections 30000; }
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
RUST_LOG=warn target/release/duet run --config "$WORK/duet.yaml" 2>"$WORK/duet.log" &
DUET_PID=$!
"$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" 2>"$WORK/nginx.err" &
NGINX_PID=$!
sleep 1

python3 - "$DUET_PID" "$NGINX_PID" "${COUNTS[@]}" <<'PY'
import os, socket, sys, time

duet_pid, nginx_pid = int(sys.argv[1]), int(sys.argv[2])
counts = [int(c) for c in sys.argv[3:]]

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

print(f"{'proxy':<6} {'connections':>11} {'idle RSS KiB':>13} {'loaded RSS KiB':>15} {'KiB/conn':>9}")
results = {}
for n in counts:
    for name, pid, port in (("duet", duet_pid, 18280), ("nginx", nginx_pid, 18290)):
        before = rss_kib(pid)
        conns = hold(port, n)
        time.sleep(3)
        after = rss_kib(pid)
        per = (after - before) / n
        results[(name, n)] = per
        print(f"{name:<6} {n:>11} {before:>13} {after:>15} {per:>9.2f}")
        for s in conns:
            s.close()
        time.sleep(2)
print()
for n in counts:
    print(f"{n} idle connections: duet/nginx memory per connection = {results[('duet', n)] / max(results[('nginx', n)], 0.01):.1f}")
PY
