#!/usr/bin/env bash
# The small edge binary: edge-only (no cloud modules, no kube client), built for size
# (profile `edge`), and for resident memory:
#
#   bench/build-edge.sh             # static glibc, non-PIE: target/x86_64-unknown-linux-gnu/edge/edgehive
#   bench/build-edge.sh --dynamic   # dynamic glibc, PIE:    target/edge-dynamic/x86_64-unknown-linux-gnu/edge/edgehive
#
# Extra arguments go to cargo. What each setting saves is in BENCHMARKS.md ("Edge footprint").
# - static: `+crt-static` (no shared libraries to map) and `relocation-model=static`: a
#   non-PIE executable has no start-up relocations, so .data.rel.ro stays clean file pages
#   and .rela.dyn is not read. The price: the binary's own code and data are at fixed
#   addresses (no ASLR for them; stack, heap and libraries are still randomized).
# `--target` keeps these flags off build scripts and proc macros, and the output apart from
# `cargo build --profile edge --no-default-features` (target/edge/edgehive).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=x86_64-unknown-linux-gnu
FLAGS=()
ARGS=()
if [[ ${1:-} == --dynamic ]]; then
  shift
  ARGS=(--target-dir target/edge-dynamic)
else
  FLAGS+=(-C target-feature=+crt-static -C relocation-model=static)
fi
# CARGO_ENCODED_RUSTFLAGS: one flag per \x1f-separated field (a path may hold spaces).
CARGO_ENCODED_RUSTFLAGS=$(IFS=$'\x1f'; echo "${FLAGS[*]}")
export CARGO_ENCODED_RUSTFLAGS
unset RUSTFLAGS
exec cargo build --profile edge --no-default-features --target "$TARGET" "${ARGS[@]}" "$@"
