#!/usr/bin/env bash
# Regenerates every figure and table under docs/ (about 10 minutes on a 2-core machine).
#   docs/herd.svg, docs/herd.txt          duet-sim herd (simulation, deterministic for its seed)
#   docs/latency-cdf.svg, degraded-share.svg, stalls-cdf.svg, stalls-tail.svg, experiments/*.json
#                                         cargo bench --bench experiments (real binary, real backends;
#                                         the stalls CDFs also as CSVs under target/experiments/)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release -q -p duet-sim -- herd --svg docs/herd.svg | tee docs/herd.txt
cargo run --release -q -p duet-sim -- supermarket | tee docs/supermarket.txt
cargo run --release -q -p duet-sim -- balls | tee docs/balls.txt
cargo bench --bench experiments | tee docs/experiments.txt
