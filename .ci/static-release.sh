# Sourced by CI stages that need release binaries (tests/browser/ci.sh, jepsen-like/ci.sh, jepsen-like/upgrade.sh).
#
# They build the same static release that deploy/docker/build.sh builds for the image (crt-static, for the host's
# triple, in target/<triple>/release): same flags and target directory, so a CI run compiles the release once,
# where a plain `cargo build --release` (target/release) would compile every crate a second time. The binaries
# behave the same on this machine; they just need no shared libraries.
#
#   static_release_build -p raftq --bin raftq     # cargo build --release arguments
#   "$STATIC_RELEASE_DIR/raftq" ...
STATIC_RELEASE_TRIPLE=$(uname -m)-unknown-linux-gnu
STATIC_RELEASE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/${CARGO_TARGET_DIR:-target}/$STATIC_RELEASE_TRIPLE/release
case ${CARGO_TARGET_DIR:-} in /*) STATIC_RELEASE_DIR=$CARGO_TARGET_DIR/$STATIC_RELEASE_TRIPLE/release ;; esac

static_release_build() {
  RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --target "$STATIC_RELEASE_TRIPLE" "$@"
}
