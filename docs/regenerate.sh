#!/usr/bin/env bash
# Regenerates every figure and table under docs/src/figures/ (about 10 minutes on a 2-core machine).
#   docs/src/figures/herd.svg, docs/src/figures/herd.txt          duet-sim herd (simulation, deterministic for its seed)
#   docs/src/figures/latency-cdf.svg, degraded-share.svg, stalls-cdf.svg, stalls-tail.svg, docs/src/figures/experiments/*.json
#                                         cargo bench --bench experiments (real binary, real backends;
#                                         the stalls CDFs also as CSVs under target/experiments/)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release -q -p duet-sim -- herd --svg docs/src/figures/herd.svg | tee docs/src/figures/herd.txt
cargo run --release -q -p duet-sim -- supermarket | tee docs/src/figures/supermarket.txt
cargo run --release -q -p duet-sim -- balls | tee docs/src/figures/balls.txt
cargo bench --bench experiments | tee docs/src/figures/experiments.txt
