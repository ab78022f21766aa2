#!/usr/bin/env bash
# Compression throughput and memory: MiB of input per CPU second of the proxy's process (user + system,
# from /proc, so the figure holds on a loaded machine better than wall-clock would), the response's size
# and the proxy's peak RSS, on one 100 MiB streamed text response (benches/compression_backend.py: words
# of an 8 MiB corpus, chunked, text/plain), duet (one worker; gzip 5, br 4, zstd 3) beside nginx
# (one worker, gzip_comp_level 5) in the same run, then duet passing it uncompressed.
#
#   benches/compression.sh [REPS]            (REPS=3; MIB=100; DUET=target/release/duet, built if missing)
#
# Each repetition runs duet gzip and nginx gzip back to back (then br, zstd and plain), so the gzip ratio
# is taken within one repetition; the summary gives medians over the repetitions.
#
# OFFSET=N moves its three ports (19301-19303) by N.
# Needs nginx (apt-get install nginx-light), curl and bc.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}; OFFSET=${OFFSET:-0}; W=$(mktemp -d); DUET=${DUET:-target/release/duet}; MIB=${MIB:-100}
[ -x "$DUET" ] || cargo build --release -q --bin duet
python3 benches/compression_backend.py $((19301 + OFFSET)) $MIB & BPID=$!
cat > $W/duet.yaml <<Y
workers: 1
listeners: [ { address: 127.0.0.1:$((19302 + OFFSET)) } ]
routes:
  - { match: { path_prefix: /gzip }, cluster: text, compress: { encodings: [gzip], gzip_level: 5 } }
  - { match: { path_prefix: /br }, cluster: text, compress: { encodings: [br], brotli_level: 4 } }
  - { match: { path_prefix: /zstd }, cluster: text, compress: { encodings: [zstd], zstd_level: 3 } }
  - { match: { path_prefix: / }, cluster: text }
clusters: [ { name: text, backends: [ { address: 127.0.0.1:$((19301 + OFFSET)) } ] } ]
Y
RUST_LOG=warn $DUET run --config $W/duet.yaml >/dev/null 2>&1 & DPID=$!
cat > $W/nginx.conf <<N
worker_processes 1; daemon off; master_process off; pid $W/nginx.pid; error_log $W/nginx.err;
events {}
http { access_log off;
  server { listen 127.0.0.1:$((19303 + OFFSET));
    gzip on; gzip_comp_level 5; gzip_types text/plain; gzip_proxied any; gzip_min_length 1024;
    location / { proxy_pass http://127.0.0.1:$((19301 + OFFSET)); proxy_http_version 1.1; proxy_buffering on; } } }
N
/usr/sbin/nginx -c $W/nginx.conf -p $W & NPID=$!
trap 'kill $BPID $DPID $NPID 2>/dev/null || true; rm -rf $W' EXIT
# The backend makes its corpus first (a few seconds).
sleep 12
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
hz=$(getconf CLK_TCK)
measure() { # name pid url encoding
  local before after bytes
  before=$(cpu $2)
  bytes=$(curl -s -H "Accept-Encoding: $4" "$3" -o $W/out.bin -w '%{size_download}')
  after=$(cpu $2)
  local secs; secs=$(echo "($after - $before) / $hz" | bc -l)
  local rate; rate=$(echo "$MIB / $secs" | bc -l)
  printf '%-12s %-5s %9d bytes out  %6.2f CPU s  %7.1f MiB/s  rss_peak %s\n' "$1" "$4" "$bytes" "$secs" \
    "$rate" "$(grep VmHWM /proc/$2/status | awk '{print $2 $3}')"
  echo "$REP $1 $4 $rate $bytes" >> $W/results
}
grep VmRSS /proc/$DPID/status
for REP in $(seq 1 $REPS); do
  echo "-- repetition $REP"
  measure duet $DPID http://127.0.0.1:$((19302 + OFFSET))/gzip gzip
  measure nginx $NPID http://127.0.0.1:$((19303 + OFFSET))/ gzip
  measure duet $DPID http://127.0.0.1:$((19302 + OFFSET))/br br
  measure duet $DPID http://127.0.0.1:$((19302 + OFFSET))/zstd zstd
  measure duet-plain $DPID http://127.0.0.1:$((19302 + OFFSET))/plain identity
  grep VmRSS /proc/$DPID/status
done
python3 - $W/results <<'PY'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
rate = {}
for rep, name, enc, r, size in rows:
    rate.setdefault((name, enc), {})[rep] = float(r)
ratios = [rate[("duet", "gzip")][k] / rate[("nginx", "gzip")][k] for k in rate[("duet", "gzip")]]
print("== medians over %d repetitions (MiB of input per CPU second)" % len(ratios))
for (name, enc), per in rate.items():
    print("%-12s %-8s %8.1f" % (name, enc, statistics.median(per.values())))
print("duet gzip 5 / nginx gzip 5, median of per-repetition ratios: %.2f  (each: %s)"
      % (statistics.median(ratios), " ".join("%.2f" % r for r in ratios)))
PY
