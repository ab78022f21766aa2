#!/usr/bin/env python3
"""What no Kubernetes schema knows about deploy/kubernetes/base/duet.yaml, checked against duet itself.

    python3 tests/kubernetes_check.py [path/to/duet]      (default: target/debug/duet)

- the ConfigMap's duet.yaml passes `duet check` (offline: backend names that resolve only inside the
  cluster are fine);
- container ports agree with the config's listener and admin addresses, the Service targets the traffic
  port and not the admin one, the NetworkPolicy opens the traffic port and restricts the admin one;
- the probes' paths are real: duet is started with this very config (addresses moved to loopback) and
  each probe's path answers 200;
- terminationGracePeriodSeconds >= shutdown.drain_delay + shutdown.drain_timeout;
- `workers` equals the container's CPU limit.
Needs PyYAML (installed with kubernetes-validate). Prints one line per check; exits 1 on any failure.
"""
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFEST = os.path.join(ROOT, "deploy", "kubernetes", "base", "duet.yaml")
DUET = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "debug", "duet")
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def seconds(value):
    match = re.fullmatch(r"(\d+)(ms|s|m)", str(value))
    if not match:
        raise ValueError(f"not a duration: {value}")
    n, unit = int(match.group(1)), match.group(2)
    return {"ms": n / 1000, "s": n, "m": n * 60}[unit]


def port_of(address):
    return int(address.rsplit(":", 1)[1])


docs = [d for d in yaml.safe_load_all(open(MANIFEST)) if d]
by_kind = {}
for doc in docs:
    by_kind.setdefault(doc["kind"], []).append(doc)
config_text = by_kind["ConfigMap"][0]["data"]["duet.yaml"]
config = yaml.safe_load(config_text)
deployment = by_kind["Deployment"][0]
pod = deployment["spec"]["template"]["spec"]
container = pod["containers"][0]
ports = {p["name"]: p["containerPort"] for p in container["ports"]}

with tempfile.TemporaryDirectory() as work:
    path = os.path.join(work, "duet.yaml")
    with open(path, "w") as f:
        f.write(config_text)
    checked = subprocess.run([DUET, "check", "--config", path], capture_output=True, text=True)
    check(checked.returncode == 0, f"the ConfigMap's duet.yaml passes `duet check` {checked.stderr.strip()}")

traffic = port_of(config["listeners"][0]["address"])
admin = port_of(config["admin"]["address"])
check(ports.get("http") == traffic, f"container port http ({ports.get('http')}) is the listener's ({traffic})")
check(ports.get("admin") == admin, f"container port admin ({ports.get('admin')}) is the admin listener's ({admin})")

service = next(s for s in by_kind["Service"] if s["metadata"]["name"] == "duet")
targets = [p["targetPort"] for p in service["spec"]["ports"]]
check(targets == ["http"], f"the duet Service targets only the traffic port ({targets})")
check(service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"],
      "the Service selects the Deployment's pods")

policy = by_kind["NetworkPolicy"][0]
open_ports = [p["port"] for rule in policy["spec"]["ingress"] if "from" not in rule for p in rule["ports"]]
restricted = [p["port"] for rule in policy["spec"]["ingress"] if "from" in rule for p in rule["ports"]]
check(open_ports == [traffic] and restricted == [admin],
      f"the NetworkPolicy opens {open_ports} to all and {restricted} to the scraper only")

grace = pod["terminationGracePeriodSeconds"]
drain = seconds(config["shutdown"]["drain_delay"]) + seconds(config["shutdown"]["drain_timeout"])
check(grace >= drain, f"terminationGracePeriodSeconds {grace} >= drain_delay + drain_timeout ({drain:g})")

cpu = str(container["resources"]["limits"]["cpu"])
check(str(config["workers"]) == cpu, f"workers ({config['workers']}) equals the CPU limit ({cpu})")

# The probes against duet itself, started with this config on loopback.
probes = {name: container[name]["httpGet"] for name in ("readinessProbe", "livenessProbe")}
for name, probe in probes.items():
    check(probe["port"] == "admin", f"{name} targets the admin port")
free = socket.socket()
free.bind(("127.0.0.1", 0))
admin_port = free.getsockname()[1]
free.close()
local = config_text.replace(config["listeners"][0]["address"], "127.0.0.1:0").replace(
    config["admin"]["address"], f"127.0.0.1:{admin_port}")
with tempfile.TemporaryDirectory() as work:
    path = os.path.join(work, "duet.yaml")
    with open(path, "w") as f:
        f.write(local)
    process = subprocess.Popen([DUET, "run", "--config", path], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=dict(os.environ, RUST_LOG="warn"))
    try:
        answers = {}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(answers) < len(probes):
            for name, probe in probes.items():
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}{probe['path']}", timeout=1) as r:
                        answers[name] = r.status
                except (urllib.error.URLError, ConnectionError, OSError):
                    pass
            time.sleep(0.1)  # between polls of the probes, until each answers or the deadline
        for name, probe in probes.items():
            check(answers.get(name) == 200, f"{name} {probe['path']} answers {answers.get(name)} from a running duet")
    finally:
        process.terminate()
        process.wait(timeout=30)

print(f"{len(failures)} of the Kubernetes checks failed" if failures else "Kubernetes checks: all passed")
sys.exit(1 if failures else 0)
