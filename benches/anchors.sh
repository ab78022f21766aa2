# The anchors of the benchmarks of record, sourced by benches/record.sh and benches/instructions.sh:
# duet, HAProxy and nginx at their best settings over four loopback backends (ports 19301-19304), with
# every proxy's access log off or on. Needs WORK (a scratch directory). LAUNCH prefixes each proxy's
# command, split into words (default: pinned to CPU 0); DUET names the duet binary (default: this build);
# BACKENDS lists other backend ports (benches/efficiency.sh: six slow backends) for write_configs and start.
#   duet     p2c_peak_ewma, routing, retries (3 attempts, budget), the admin listener (metrics) on;
#            log "on" is its default (RUST_LOG=info: one access-log line per request, to a file)
#   HAProxy  balance leastconn, http-reuse always; log "on": option httplog to a file (log stdout)
#   nginx    least_conn, upstream keepalive 64; log "on": its default combined access_log to a file
#   bare     (only when asked for, e.g. PROXIES="duet bare haproxy nginx") the calibration proxy of #11:
#            hyper 1.x and nothing else (crates/proxy/examples/bare_hyper.rs: round robin, no header
#            rules, limits, retries, metrics or log): what hyper and the kernel cost before duet adds anything
# DUET_POLICY and DUET_ATTEMPTS change duet's policy (default p2c_peak_ewma) and attempts (default 3),
# to count what a feature costs (benches/instructions.sh: DUET_ATTEMPTS=1 DUET_POLICY=p2c_inflight ...);
# DUET_TRACING, a YAML flow mapping, adds duet's `tracing:` (DUET_TRACING="{ otlp: http://127.0.0.1:4318,
# sample: 1% }": what traces cost at 1% sampling, a collector listening there).
# OFFSET moves every port (proxies and default backends) by that much, so two measurements can run at once.
OFFSET=${OFFSET:-0}
LAUNCH=${LAUNCH:-taskset -c 0}
BACKENDS=${BACKENDS:-$((19301 + OFFSET)) $((19302 + OFFSET)) $((19303 + OFFSET)) $((19304 + OFFSET))}

write_configs() { # log: on|off
  local log=$1 port duet_backends="" nginx_servers="" haproxy_servers=""
  for port in $BACKENDS; do
    duet_backends+="${duet_backends:+, }{ address: 127.0.0.1:$port }"
    nginx_servers+="${nginx_servers:+ }server 127.0.0.1:$port;"
    haproxy_servers+="  server b$port 127.0.0.1:$port
"
  done
  cat >"$WORK/duet.yaml" <<YAML
workers: 1
listeners: [ { address: 127.0.0.1:$((18400 + OFFSET)) } ]
admin: { address: 127.0.0.1:$((18409 + OFFSET)) }
routes:
  - match: { path_prefix: /api }
    cluster: app
  - match: { path_prefix: / }
    cluster: app
clusters:
  - name: app
    policy: ${DUET_POLICY:-p2c_peak_ewma}
    backends: [ $duet_backends ]
    retries: { attempts: ${DUET_ATTEMPTS:-3}, budget_percent: 20%, min_retries_per_second: 10 }
YAML
  if [ -n "${DUET_TRACING:-}" ]; then
    echo "tracing: $DUET_TRACING" >>"$WORK/duet.yaml"
  fi
  mkdir -p "$WORK/nginx/logs"
  local nginx_log="access_log off;"
  [ "$log" = on ] && nginx_log="access_log $WORK/nginx/logs/access.log;"
  cat >"$WORK/nginx/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
  $nginx_log
  upstream app {
    least_conn;
    $nginx_servers
    keepalive 64;
  }
  server {
    listen 127.0.0.1:$((18410 + OFFSET));
    location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
CONF
  local haproxy_log=""
  [ "$log" = on ] && haproxy_log="  log stdout format raw local0 info
  option httplog"
  cat >"$WORK/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 4096
defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 30s
  http-reuse always
$haproxy_log
frontend app
  bind 127.0.0.1:$((18420 + OFFSET))
  default_backend app
backend app
  balance leastconn
$haproxy_servers
CONF
}

start() { # proxy log -> pid of the process whose tree is measured (its output never to our stdout, which
         # a command substitution would wait on)
  # duet listens with SO_REUSEPORT, so a stale duet left on the port would silently take part of the
  # traffic and the figures would belong to it: refuse to measure on a port something already holds.
  if (exec 3<>"/dev/tcp/127.0.0.1/$(port "$1")") 2>/dev/null; then
    echo "port $(port "$1") is already taken (a stale $1 from an earlier run?): stop it first" >&2
    return 1
  fi
  case $1 in
    duet)
      local level=warn
      [ "$2" = on ] && level=info
      RUST_LOG=$level $LAUNCH "${DUET:-target/release/duet}" run --config "$WORK/duet.yaml" >/dev/null 2>"$WORK/duet.log" &
      echo $! ;;
    nginx)
      $LAUNCH /usr/sbin/nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" >/dev/null 2>"$WORK/nginx.err" &
      echo $! ;;
    haproxy)
      $LAUNCH /usr/sbin/haproxy -f "$WORK/haproxy.cfg" -db >"$WORK/haproxy.log" 2>&1 &
      echo $! ;;
    bare)
      # shellcheck disable=SC2046 # one argument per backend
      $LAUNCH target/release/examples/bare_hyper 127.0.0.1:$((18430 + OFFSET)) $(printf '127.0.0.1:%s ' $BACKENDS) \
        >/dev/null 2>"$WORK/bare.err" &
      echo $! ;;
  esac
}
port() { case $1 in duet) echo $((18400 + OFFSET)) ;; nginx) echo $((18410 + OFFSET)) ;; haproxy) echo $((18420 + OFFSET)) ;; bare) echo $((18430 + OFFSET)) ;; esac; }
