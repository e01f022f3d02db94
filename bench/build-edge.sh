#!/usr/bin/env bash
# The small edge binary: edge-only (no cloud modules, no kube client), built for size
# (profile `edge`), and for resident memory:
#
#   bench/build-edge.sh             # static glibc, non-PIE: target/x86_64-unknown-linux-gnu/edge/edgehive
#   bench/build-edge.sh --pie       # static glibc, PIE:     target/edge-pie/x86_64-unknown-linux-gnu/edge/edgehive
#   bench/build-edge.sh --dynamic   # dynamic glibc, PIE:    target/edge-dynamic/x86_64-unknown-linux-gnu/edge/edgehive
#
# Extra arguments go to cargo. What each setting saves is in BENCHMARKS.md ("Edge footprint").
# - static: `+crt-static` (no shared libraries to map) and `relocation-model=static`: a
#   non-PIE executable has no start-up relocations, so .data.rel.ro stays clean file pages
#   and .rela.dyn is not read. The price: the binary's own code and data are at fixed
#   addresses (no ASLR for them; stack, heap and libraries are still randomized). `--pie`
#   keeps ASLR for the whole binary at the cost of those relocations (BENCHMARKS.md).
# - bench/edge-layout.ld: the unwind tables after .rodata (see the file). Panics unwind as
#   before.
# - SQLite without what edgehive never uses: FTS3/FTS5, R-tree, dbstat, STAT4, soundex, the
#   JSON functions, extension loading, column metadata, deprecated APIs, shared cache; and no
#   lookaside (SQLite's per-connection small-allocation cache: its 120 KB buffer goes,
#   those allocations go to malloc).
# `--target` keeps these flags off build scripts and proc macros, and the output apart from
# `cargo build --profile edge --no-default-features` (target/edge/edgehive).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=x86_64-unknown-linux-gnu
FLAGS=(-C "link-arg=-Wl,-T,$PWD/bench/edge-layout.ld")
ARGS=()
if [[ ${1:-} == --dynamic ]]; then
  shift
  ARGS=(--target-dir target/edge-dynamic)
elif [[ ${1:-} == --pie ]]; then
  shift
  ARGS=(--target-dir target/edge-pie)
  FLAGS+=(-C target-feature=+crt-static)
else
  FLAGS+=(-C target-feature=+crt-static -C relocation-model=static)
fi
export LIBSQLITE3_FLAGS="-USQLITE_ENABLE_FTS3 -USQLITE_ENABLE_FTS3_PARENTHESIS -USQLITE_ENABLE_FTS5
  -USQLITE_ENABLE_RTREE -USQLITE_ENABLE_DBSTAT_VTAB -USQLITE_ENABLE_STAT4 -USQLITE_SOUNDEX
  -USQLITE_ENABLE_JSON1 -DSQLITE_OMIT_JSON -USQLITE_ENABLE_LOAD_EXTENSION
  -DSQLITE_OMIT_LOAD_EXTENSION -USQLITE_ENABLE_COLUMN_METADATA -DSQLITE_OMIT_DEPRECATED
  -DSQLITE_OMIT_SHARED_CACHE -DSQLITE_DEFAULT_LOOKASIDE=1200,0"
# CARGO_ENCODED_RUSTFLAGS: one flag per \x1f-separated field (a path may hold spaces).
CARGO_ENCODED_RUSTFLAGS=$(IFS=$'\x1f'; echo "${FLAGS[*]}")
export CARGO_ENCODED_RUSTFLAGS
unset RUSTFLAGS
exec cargo build --profile edge --no-default-features --target "$TARGET" "${ARGS[@]}" "$@"
