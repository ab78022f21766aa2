#!/usr/bin/env python3
"""The example overlay as rendered (`kubectl kustomize deploy/kubernetes/overlays/example`), checked.

    kubectl kustomize deploy/kubernetes/overlays/example > rendered.yaml
    python3 tests/kubernetes_overlay_check.py rendered.yaml builtin.yaml

Writes the resources of built-in kinds to builtin.yaml, for kubernetes-validate. The ServiceMonitor is
prometheus-operator's custom resource: kubernetes-validate has no schema for it, so it is left out of
builtin.yaml (said on stdout) and checked here instead against what it points at: its selector picks
the admin Service, whose port it names, and that Service reaches the pods' admin port. Also checked:
the edge Service is a LoadBalancer with externalTrafficPolicy Local, the TLS Secret is mounted where the
config's TLS listener reads its files, and the container and NetworkPolicy open the TLS port.
Needs PyYAML. Prints one line per check; exits 1 on any failure.
"""
import sys

import yaml

rendered, builtin_out = sys.argv[1], sys.argv[2]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
custom = [d for d in docs if "." in d["apiVersion"].split("/")[0] and not d["apiVersion"].split("/")[0].endswith(".k8s.io")]
builtin = [d for d in docs if d not in custom]
with open(builtin_out, "w") as f:
    yaml.safe_dump_all(builtin, f, sort_keys=False)
for d in custom:
    print(f"note {d['kind']} {d['metadata']['name']} ({d['apiVersion']}): a custom resource, not given to "
          "kubernetes-validate (no schema for it there); checked below")


def one(kind, name):
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    check(len(found) == 1, f"one {kind} {name}")
    return found[0] if found else {}


monitor = one("ServiceMonitor", "duet")
admin = one("Service", "duet-admin")
edge = one("Service", "duet")
deployment = one("Deployment", "duet")
policy = one("NetworkPolicy", "duet")
config = yaml.safe_load(one("ConfigMap", "duet-config")["data"]["duet.yaml"])
pod = deployment["spec"]["template"]["spec"]
container = pod["containers"][0]

wanted = monitor["spec"]["selector"]["matchLabels"]
labels = admin["metadata"].get("labels", {})
check(all(labels.get(k) == v for k, v in wanted.items()), f"the ServiceMonitor selects duet-admin ({wanted})")
selected = [s["metadata"]["name"] for s in docs if s["kind"] == "Service"
            and all(s["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())]
check(selected == ["duet-admin"], f"and only it ({selected})")
admin_ports = {p["name"]: p for p in admin["spec"]["ports"]}
for endpoint in monitor["spec"]["endpoints"]:
    check(endpoint["port"] in admin_ports, f"the ServiceMonitor's port {endpoint['port']} is duet-admin's")
container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
admin_port = int(config["admin"]["address"].rsplit(":", 1)[1])
check(container_ports.get(admin_ports.get("admin", {}).get("targetPort")) == admin_port,
      f"duet-admin reaches the admin listener's port {admin_port}")

check(edge["spec"].get("type") == "LoadBalancer", "the duet Service is a LoadBalancer")
check(edge["spec"].get("externalTrafficPolicy") == "Local", "with externalTrafficPolicy: Local")
check("admin" not in [p["targetPort"] for p in edge["spec"]["ports"]], "and does not expose the admin port")

tls_listeners = [l for l in config["listeners"] if "tls" in l]
check(len(tls_listeners) == 1, "the config has a TLS listener")
secret_volumes = {v["name"] for v in pod["volumes"] if v.get("secret", {}).get("secretName") == "duet-tls"}
mounts = [m["mountPath"] for m in container["volumeMounts"] if m["name"] in secret_volumes]
for listener in tls_listeners:
    port = int(listener["address"].rsplit(":", 1)[1])
    for key in ("cert", "key"):
        path = listener["tls"][key]
        check(any(path.startswith(m.rstrip("/") + "/") for m in mounts),
              f"tls.{key} {path} is in the mounted Secret duet-tls ({mounts})")
    check(port in container_ports.values(), f"the container declares the TLS port {port}")
    opened = [p["port"] for rule in policy["spec"]["ingress"] if "from" not in rule for p in rule["ports"]]
    check(port in opened, f"the NetworkPolicy opens the TLS port {port} ({opened})")
    https = [p for p in edge["spec"]["ports"] if container_ports.get(p["targetPort"]) == port]
    check(len(https) == 1, "the LoadBalancer forwards to the TLS port")

print(f"{len(failures)} of the overlay checks failed" if failures else "overlay checks: all passed")
sys.exit(1 if failures else 0)
