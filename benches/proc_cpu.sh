# CPU of a process tree from /proc, sourced by benches/record.sh, benches/upstream_tls.sh and
# benches/h2load.sh: utime + stime, in clock ticks of 1/100 s.
cpu_ticks() { # pid: "utime stime" of it and its children
  python3 - "$1" <<'PY'
import os, sys
root = int(sys.argv[1])
def stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()
user = kernel = 0
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            fields = stat(entry)
        except OSError:
            continue
        if int(entry) == root or int(fields[1]) == root:
            user += int(fields[11])
            kernel += int(fields[12])
print(user, kernel)
PY
}

wait_for() { # port: until something listens there (30 s at most)
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "nothing listening on $1" >&2
  return 1
}

refuse_taken() { # port: a stale proxy left on it would take part of the traffic (duet uses SO_REUSEPORT)
  if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
    echo "port $1 is already taken (a stale process from an earlier run?): stop it first" >&2
    return 1
  fi
}

stop() { # pid: started in a command substitution, so not our child: poll until it is gone (10 s at most)
  kill "$1" 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -9 "$1" 2>/dev/null || true
}
