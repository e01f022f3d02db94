#!/usr/bin/env bash
# The container image's binary: one static edgehive (cloud and edge, default features) that
# runs in an empty image (deploy/image/Containerfile: FROM scratch). Built by hand, never by
# CI (.ci/run): it is a release build of every dependency for another target (about 30 min of
# CPU).
#
#   deploy/image/build.sh            # the build context target/static/image/: the binary
#                                    # (edgehive) and the root's folders (rootfs/tmp)
#   deploy/image/build.sh --image    # and then the image edgehive:<version>, with buildah
#
# musl (x86_64-unknown-linux-musl), statically linked: the binary needs no file of the image
# at run time. Its resolver reads /etc/hosts and /etc/resolv.conf itself (the kubelet and
# podman mount both into every container); a static glibc build resolves through glibc's
# built-in files and dns modules too, but would dlopen any other module an nsswitch.conf
# names, and the edge would not get musl's smaller malloc (the cloud allocates with mimalloc
# either way, src/alloc.rs). Needs, once: `rustup target add x86_64-unknown-linux-musl` and
# musl-gcc for the bundled C (SQLite, ring, mimalloc): `apt-get install musl-tools`.
# Extra arguments go to cargo.
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGE=0
if [[ ${1:-} == --image ]]; then
  shift
  IMAGE=1
fi
TARGET=x86_64-unknown-linux-musl
# Apart from target/release and from the edge builds of bench/build-edge.sh.
export CARGO_TARGET_DIR="$PWD/target/static"
# No symbol table: a smaller image; panic messages keep their text and location.
export CARGO_PROFILE_RELEASE_STRIP=symbols
unset RUSTFLAGS CARGO_ENCODED_RUSTFLAGS
nice -n 10 cargo build --release --locked -p edgehive --bin edgehive --target "$TARGET" "$@"
# The build context holds only what the image holds (the Containerfile COPYs both).
CONTEXT=target/static/image
mkdir -p "$CONTEXT/rootfs/tmp"
chmod 1777 "$CONTEXT/rootfs/tmp"
cp "target/static/$TARGET/release/edgehive" "$CONTEXT/edgehive"
echo "$CONTEXT/edgehive"
if [[ $IMAGE == 1 ]]; then
  VERSION=$("$CONTEXT/edgehive" --version | awk '{print $2}')
  buildah build --layers=false -f deploy/image/Containerfile -t "edgehive:$VERSION" "$CONTEXT"
fi
