# The static release build: crt-static, for the host's triple, in target/<triple>/release. deploy/docker/build.sh
# builds the image's binary with it, and the CI stages that need release binaries (tests/browser/ci.sh,
# jepsen-like/ci.sh, jepsen-like/upgrade.sh) use the same build, so a CI run compiles the release once, where a
# plain `cargo build --release` (target/release) would compile every crate a second time. The binaries behave the
# same on this machine; they just need no shared libraries. Sourced from the repository root:
#
#   . .ci/static-release.sh
#   static_release_build -p raftq --bin raftq     # cargo build --release arguments
#   "$STATIC_RELEASE_DIR/raftq" ...
STATIC_RELEASE_TRIPLE=$(uname -m)-unknown-linux-gnu
case ${CARGO_TARGET_DIR:-target} in
  /*) STATIC_RELEASE_DIR=$CARGO_TARGET_DIR/$STATIC_RELEASE_TRIPLE/release ;;
  *) STATIC_RELEASE_DIR=$PWD/${CARGO_TARGET_DIR:-target}/$STATIC_RELEASE_TRIPLE/release ;;
esac

static_release_build() {
  RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --target "$STATIC_RELEASE_TRIPLE" "$@"
}
