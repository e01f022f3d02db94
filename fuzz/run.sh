#!/usr/bin/env bash
# Builds and runs the fuzz targets (README.md here). Stable toolchain: libFuzzer with LLVM's
# SanitizerCoverage instrumentation, no sanitizer.
#
#   fuzz/run.sh build                      every crate instrumented, optimised (for long runs)
#   fuzz/run.sh build-ci                   only the workspace's crates instrumented, reusing
#                                          the dependencies `cargo test` built (CI)
#   fuzz/run.sh run TARGET [libFuzzer args] fuzz TARGET from its seeds until stopped (or
#                                          until -runs=N / -max_total_time=S)
#   fuzz/run.sh smoke SECONDS              each target for SECONDS from its seeds (CI)
#   fuzz/run.sh list                       the targets
#
# run and smoke use the binaries of the last build or build-ci. New inputs go to
# target/fuzz/corpus/TARGET (fuzz/corpus/TARGET, the committed seeds, is only read), crashes
# to target/fuzz/artifacts/TARGET/.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${FUZZ_WORK_DIR:-$here/../target/fuzz}"
triple="$(rustc -vV | sed -n 's/^host: //p')"
targets=(frame resource token csr config ws_frames tunnel rule topic)

# SanitizerCoverage as cargo-fuzz sets it up: edge counters, the PC table and compare
# tracing (libFuzzer's value profile and its dictionary from comparisons).
export SANCOV_FLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares"
unset CARGO_BUILD_RUSTFLAGS
target_root="${CARGO_TARGET_DIR:-$here/../target}"

# All crates instrumented (serde_json, libyaml, x509-parser... are where much of the
# decoding happens), release with debug assertions and overflow checks: an overflow is a
# finding. `--target` keeps the flags off build scripts and proc macros.
build() {
  RUSTFLAGS="$SANCOV_FLAGS -Cdebug-assertions -Coverflow-checks -Cforce-frame-pointers=yes" \
    cargo build -p edgehive-fuzz --bins --release --locked \
    --target "$triple" --target-dir "$work/build"
  echo "$work/build/$triple/release" >"$work/bin-dir"
}

# The dev profile and target folder of `cargo test --workspace`: the dependencies are
# reused, only edgehive's own crates are compiled again, instrumented (sancov-rustc).
build_ci() {
  RUSTC_WORKSPACE_WRAPPER="$here/sancov-rustc" cargo build -p edgehive-fuzz --bins --locked
  mkdir -p "$work"
  echo "$target_root/debug" >"$work/bin-dir"
}

binary() { echo "$(cat "$work/bin-dir")/$1"; }

# Limits every run uses: a 1 MiB input at most, 10 s per input, 2 GiB of RSS (the allocator
# in src/lib.rs also fails any allocation past 512 MiB live).
limits=(-max_len=1048576 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1)

run() {
  local target="$1"
  shift
  mkdir -p "$work/corpus/$target" "$work/artifacts/$target"
  "$(binary "$target")" "${limits[@]}" -artifact_prefix="$work/artifacts/$target/" \
    "$@" "$work/corpus/$target" "$here/corpus/$target"
}

case "${1:-}" in
  build) build ;;
  build-ci) build_ci ;;
  list) printf '%s\n' "${targets[@]}" ;;
  run)
    [ $# -ge 2 ] || { echo "usage: $0 run TARGET [libFuzzer args]" >&2; exit 2; }
    shift
    run "$@"
    ;;
  smoke)
    seconds="${2:-5}"
    for target in "${targets[@]}"; do
      echo "fuzz: $target for ${seconds}s"
      mkdir -p "$work"
      run "$target" -max_total_time="$seconds" 2>"$work/$target.log" || {
        tail -n 40 "$work/$target.log" >&2
        echo "fuzz: $target failed (artifacts in $work/artifacts/$target/)" >&2
        exit 1
      }
      grep -E '^Done' "$work/$target.log" || true
    done
    echo "fuzz: ${#targets[@]} passed, 0 failed"
    ;;
  *) sed -n '2,17p' "$0" >&2; exit 2 ;;
esac
