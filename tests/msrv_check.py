#!/usr/bin/env python3
"""duet-balance's minimum supported Rust: the `rust-version` its Cargo.toml states.

    python3 tests/msrv_check.py

- every crate duet-balance builds with (normal and build dependencies, transitively, as Cargo.lock
  pins them) states a `rust-version` no newer than duet-balance's, or none;
- when a toolchain of exactly that version is installed (`rustup toolchain list`), duet-balance is
  checked with it (`cargo +VERSION check -p duet-balance --locked`); CI machines have only the current
  toolchain and no way to fetch another, so there the first check and clippy's `incompatible_msrv`
  lint (which reads the same `rust-version` and flags standard-library items stabilised after it) are
  what hold the line.
Prints one line per check; exits 1 on any failure.
"""
import json
import subprocess
import sys


def version(text):
    """'1.89' or '1.89.0' as a comparable tuple (1, 89, 0)."""
    parts = [int(p) for p in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def main():
    metadata = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--locked"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    packages = {p["id"]: p for p in metadata["packages"]}
    nodes = {n["id"]: n for n in metadata["resolve"]["nodes"]}
    root = next(p for p in metadata["packages"] if p["name"] == "duet-balance")
    msrv = root.get("rust_version")
    if not msrv:
        print("FAIL: crates/balance/Cargo.toml states no rust-version")
        return 1
    print(f"duet-balance states rust-version {msrv}")

    # Walk the normal and build dependencies (dev-dependencies build only its tests).
    seen, stack = set(), [root["id"]]
    while stack:
        node = nodes[stack.pop()]
        for dep in node["deps"]:
            kinds = {k["kind"] for k in dep["dep_kinds"]}
            if kinds <= {"dev"} or dep["pkg"] in seen:
                continue
            seen.add(dep["pkg"])
            stack.append(dep["pkg"])

    newer = []
    for pkg_id in sorted(seen):
        package = packages[pkg_id]
        needed = package.get("rust_version")
        if needed and version(needed) > version(msrv):
            newer.append(f"{package['name']} {package['version']} needs Rust {needed}")
    if newer:
        for line in newer:
            print(f"FAIL: {line}, newer than duet-balance's {msrv}")
        return 1
    print(f"ok: none of its {len(seen)} dependencies needs a Rust newer than {msrv}")

    listed = subprocess.run(["rustup", "toolchain", "list"], capture_output=True, text=True)
    names = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
    exact = [n for n in names if n.split("-")[0] in (msrv, f"{msrv}.0")]
    if exact:
        toolchain = exact[0]
        result = subprocess.run(
            ["cargo", f"+{toolchain}", "check", "-p", "duet-balance", "--locked"]
        )
        if result.returncode != 0:
            print(f"FAIL: duet-balance does not build with {toolchain}")
            return 1
        print(f"ok: duet-balance builds with {toolchain}")
    else:
        print(f"no {msrv} toolchain installed: not built with it (clippy's incompatible_msrv checks std)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
