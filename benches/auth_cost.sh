#!/usr/bin/env bash
# What authentication costs per request (#47): user-space instructions (valgrind's callgrind, the figure
# a noisy 2-core machine reproduces) and requests/s (wrk, wall clock: read as an order of magnitude on
# a shared machine), on one duet worker with the access log off, for three routes to the same backend:
#
#   /open    no `auth:`
#   /basic   `auth: { basic }`, an htpasswd file written by `htpasswd -B` (bcrypt, cost 5); every
#            request carries the same right password, so after the first all are the worker's cached
#            check (the cache keeps a credential 30 s: one bcrypt per 30 s per worker)
#   /jwt     `auth: { jwt }` with the fixture JWKS (tests/fixtures/auth): every request carries the same
#            ES256 token (signed here with Python's `cryptography`), verified in full each time
#
# Each callgrind run: 2 s of warm-up, counters zeroed (callgrind_control -z), SECONDS of wrk -t1 -c8
# counted. Each wrk run: 2 s of warm-up, then SECONDS measured, duet not under valgrind.
#
#   benches/auth_cost.sh [SECONDS]    (default 6; NO_BUILD=1 uses target/release as it is;
#                                      OFFSET=100 moves the ports)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-6}
OFFSET=${OFFSET:-0}
PORT=$((18850 + OFFSET))
BACKEND=$((19851 + OFFSET))
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
[ -n "${NO_BUILD:-}" ] || cargo build --release -q --bin duet --bin duet-backend
target/release/duet-backend --listen "127.0.0.1:$BACKEND" --name b >/dev/null &

htpasswd -cbB "$WORK/users.htpasswd" ann s3cret 2>/dev/null
BASIC="Authorization: Basic $(printf 'ann:s3cret' | base64)"
TOKEN=$(python3 - "$PWD/tests/fixtures/auth/ec.pk8.der" <<'PY'
import base64, json, sys, time
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils
key = serialization.load_der_private_key(open(sys.argv[1], "rb").read(), password=None)
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
head = b64(json.dumps({"alg": "ES256", "typ": "JWT", "kid": "ec1"}).encode())
claims = {"sub": "ann", "iss": "https://id.example.com", "aud": "api", "exp": int(time.time()) + 3600}
body = b64(json.dumps(claims).encode())
r, s = utils.decode_dss_signature(key.sign(f"{head}.{body}".encode(), ec.ECDSA(hashes.SHA256())))
print(f"{head}.{body}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}")
PY
)
JWT="Authorization: Bearer $TOKEN"
cat >"$WORK/duet.yaml" <<YAML
workers: 1
listeners: [ { address: 127.0.0.1:$PORT } ]
routes:
  - { name: open, match: { path_prefix: /open }, cluster: app }
  - { name: basic, match: { path_prefix: /basic }, cluster: app, auth: { basic: { users: $WORK/users.htpasswd } } }
  - name: jwt
    match: { path_prefix: /jwt }
    cluster: app
    auth: { jwt: { jwks: $PWD/tests/fixtures/auth/jwks.json, issuer: https://id.example.com, audiences: [api] } }
clusters:
  - { name: app, backends: [ { address: 127.0.0.1:$BACKEND } ] }
limits: { keepalive_requests: 100000000 }
YAML

header() { # path
  case "$1" in /basic) echo "$BASIC" ;; /jwt) echo "$JWT" ;; *) echo "X-Open: 1" ;; esac
}

wait_for() {
  for _ in $(seq 1 300); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && return 0; sleep 0.1; done
  echo "nothing listening on $PORT" >&2
  return 1
}

check() { # path: the route lets the request through (200), or the figures mean nothing
  local code
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "$(header "$1")" "http://127.0.0.1:$PORT$1")
  [ "$code" = 200 ] || { echo "$1 answered $code, not 200" >&2; exit 1; }
}

count() { # path
  local pid requests total
  rm -f "$WORK"/callgrind.out.*
  RUST_LOG=warn valgrind --tool=callgrind --log-file="$WORK/valgrind.log" \
    --callgrind-out-file="$WORK/callgrind.out.%p" target/release/duet run --config "$WORK/duet.yaml" \
    2>/dev/null &
  pid=$!
  wait_for
  check "$1"
  wrk -t1 -c8 -d2 -H "$(header "$1")" "http://127.0.0.1:$PORT$1" >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  requests=$(wrk -t1 -c8 -d"$SECS" -H "$(header "$1")" "http://127.0.0.1:$PORT$1" | awk '/requests in/ { print $1 }')
  kill "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  total=$(callgrind_annotate "$WORK"/callgrind.out.* 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
  printf '  %-7s %8d requests  %7d instructions/request\n' "$1" "$requests" $((total / requests))
}

rate() { # path
  local rps
  wrk -t1 -c8 -d2 -H "$(header "$1")" "http://127.0.0.1:$PORT$1" >/dev/null
  rps=$(wrk -t1 -c8 -d"$SECS" -H "$(header "$1")" "http://127.0.0.1:$PORT$1" | awk '/Requests\/sec/ { print $2 }')
  printf '  %-7s %10s requests/s\n' "$1" "$rps"
}

echo "== user-space instructions per request (callgrind, one worker, wrk -t1 -c8, ${SECS} s counted)"
for path in /open /basic /jwt /open /basic /jwt; do
  count "$path"
done

echo "== requests/s on one worker (wrk -t1 -c8, ${SECS} s, no valgrind)"
RUST_LOG=warn target/release/duet run --config "$WORK/duet.yaml" 2>/dev/null &
DUET=$!
wait_for
for path in /open /basic /jwt; do check "$path"; done
for path in /open /basic /jwt /open /basic /jwt; do
  rate "$path"
done
kill "$DUET"
