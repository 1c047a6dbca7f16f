#!/usr/bin/env bash
# CI stage: a rolling upgrade from the previous release under the jepsen-like workload; fails on any violation.
#
# The previous release is a commit of this repository (PREVIOUS below). Its binary is built from this
# repository's own history (git archive, then a dev-profile build of `raftq` alone, in a target directory of its
# own) and kept as target/upgrade/raftq-<commit>, so later runs reuse it. Then the current release binaries are
# built and `raftq-jepsen run --scenario upgrade` starts a 3-node cluster on the previous binary, upgrades one
# follower and downgrades it back (`raftq data downgrade`), upgrades every node in turn (the leader last, after a
# transfer), waits for the cluster version to switch, and checks that the previous binary then refuses the data
# (docs/jepsen.md, "Upgrades"). A clone without that commit (a shallow clone) skips the stage with a message.
#
# Times: the previous binary's dev build takes about a minute once `cargo test --workspace` has built the
# dependencies (it took 12 min on a loaded machine before they were copied in; cached after), the release build of
# this tree what jepsen-like/ci.sh left (seconds when warm), the run about 40 s. UPGRADE_SEED overrides the
# workload's seed; UPGRADE_OLD_BIN uses a given binary instead.
set -euo pipefail
cd "$(dirname "$0")/.."

# The previous release: its data is v0 (unversioned) and it knows nothing of cluster versions.
PREVIOUS=27ebc28
dir=target/upgrade
old_bin=${UPGRADE_OLD_BIN:-$dir/raftq-$PREVIOUS}

if [ ! -x "$old_bin" ]; then
  if ! git rev-parse --verify --quiet "$PREVIOUS^{commit}" >/dev/null; then
    echo "upgrade: skipped: commit $PREVIOUS is not in this clone's history (shallow clone?); fetch it to run this stage"
    exit 0
  fi
  src=$dir/src-$PREVIOUS
  start=$(date +%s)
  rm -rf "$src"
  mkdir -p "$src"
  git archive "$PREVIOUS" | tar -x -C "$src"
  # A target directory of its own: cargo names a workspace member's artefacts by its path in the workspace, so
  # in this tree's target directory the previous release's raftq-proto would overwrite this tree's (a shared
  # `build-dir` did exactly that). The previous release locks the same dependency versions, so this tree's
  # compiled dependencies (everything but the workspace's own crates) are copied in first, when `cargo test`
  # has built them: only the crates that differ are compiled then (about a minute, against several minutes
  # from nothing). The dev profile: a release build of the server takes several times longer, and the run does
  # not need its speed.
  here=${CARGO_TARGET_DIR:-target}/debug
  if [ -d "$here/deps" ] && [ ! -d "$dir/target/debug/deps" ]; then
    for sub in deps build .fingerprint; do
      mkdir -p "$dir/target/debug/$sub"
      [ -d "$here/$sub" ] || continue
      find "$here/$sub" -mindepth 1 -maxdepth 1 ! -name 'raftq*' ! -name 'libraftq*' \
        -exec cp -a -t "$dir/target/debug/$sub" {} +
    done
  fi
  (cd "$src" && CARGO_TARGET_DIR="$PWD/../target" cargo build --locked --bin raftq)
  cp "$dir/target/debug/raftq" "$old_bin"
  echo "upgrade: built the $PREVIOUS binary in $(( $(date +%s) - start )) s"
fi

start=$(date +%s)
. .ci/static-release.sh
static_release_build -p raftq -p raftq-jepsen
echo "upgrade: current release build took $(( $(date +%s) - start )) s"

seed=${UPGRADE_SEED:-401}
out=target/jepsen/upgrade-$seed
# A failed run keeps its nodes' data: the next one starts from empty directories.
rm -rf "$out"
status=0
"$STATIC_RELEASE_DIR/raftq-jepsen" run --scenario upgrade --old-bin "$old_bin" --seed "$seed" --out "$out" || status=$?
if [ "$status" -ne 0 ]; then
  echo "upgrade: FAILED (exit $status); history, summary, report and node logs in $out" >&2
  echo "upgrade: repeat with UPGRADE_SEED=$seed jepsen-like/upgrade.sh" >&2
fi
exit "$status"
