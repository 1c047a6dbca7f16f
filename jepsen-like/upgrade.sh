#!/usr/bin/env bash
# CI stage: rolling upgrades from previous releases under the jepsen-like workload; fails on any violation.
#
# Each previous release is a commit of this repository (PREVIOUS below): 27ebc28, from before cluster versions
# (v0 files), and 86e2f28, the last of v1 records (cluster version 3). Its binary is built from this repository's
# own history (git archive, then a dev-profile build of `raftq` alone, in a target directory of its own) and kept
# as target/upgrade/raftq-<commit>, so later runs reuse it. Then the current release binaries are
# built and `raftq-jepsen run --scenario upgrade` starts a 3-node cluster on the previous binary, upgrades one
# follower and downgrades it back (`raftq data downgrade`), upgrades every node in turn (the leader last, after a
# transfer), waits for the cluster version to switch, and checks that the previous binary then refuses the data
# (docs/jepsen.md, "Upgrades"). A clone without that commit (a shallow clone) skips the stage with a message.
#
# Times (per previous release): the previous binary's dev build takes about a minute once `cargo test --workspace` has built the
# dependencies (it took 12 min on a loaded machine before they were copied in; cached after), the release build of
# this tree what jepsen-like/ci.sh left (seconds when warm), the run about 40 s. UPGRADE_SEED overrides the
# workload's seed; UPGRADE_OLD_BIN uses a given binary instead.
set -euo pipefail
cd "$(dirname "$0")/.."

# The previous releases: 27ebc28's data is v0 (unversioned) and it knows nothing of cluster versions; 86e2f28's is
# v1 (fixed-width bincode) at cluster version 3. UPGRADE_OLD_BIN runs one given binary instead.
PREVIOUS=${UPGRADE_PREVIOUS:-27ebc28 86e2f28}
dir=target/upgrade

start=$(date +%s)
. .ci/static-release.sh
static_release_build -p raftq -p raftq-jepsen
echo "upgrade: current release build took $(( $(date +%s) - start )) s"

status=0
for previous in $PREVIOUS; do
old_bin=${UPGRADE_OLD_BIN:-$dir/raftq-$previous}
if [ ! -x "$old_bin" ]; then
  if ! git rev-parse --verify --quiet "$previous^{commit}" >/dev/null; then
    echo "upgrade: skipped: commit $previous is not in this clone's history (shallow clone?); fetch it to run this stage"
    continue
  fi
  src=$dir/src-$previous
  target=$dir/target-$previous
  start=$(date +%s)
  rm -rf "$src"
  mkdir -p "$src"
  git archive "$previous" | tar -x -C "$src"
  # A target directory of its own: cargo names a workspace member's artefacts by its path in the workspace, so
  # in this tree's target directory the previous release's raftq-proto would overwrite this tree's (a shared
  # `build-dir` did exactly that). The previous release locks the same dependency versions, so this tree's
  # compiled dependencies (everything but the workspace's own crates) are copied in first, when `cargo test`
  # has built them: only the crates that differ are compiled then (about a minute, against several minutes
  # from nothing). The dev profile: a release build of the server takes several times longer, and the run does
  # not need its speed.
  here=${CARGO_TARGET_DIR:-target}/debug
  if [ -d "$here/deps" ] && [ ! -d "$target/debug/deps" ]; then
    for sub in deps build .fingerprint; do
      mkdir -p "$target/debug/$sub"
      [ -d "$here/$sub" ] || continue
      find "$here/$sub" -mindepth 1 -maxdepth 1 ! -name 'raftq*' ! -name 'libraftq*' \
        -exec cp -a -t "$target/debug/$sub" {} +
    done
  fi
  (cd "$src" && CARGO_TARGET_DIR="$PWD/../target-$previous" cargo build --locked --bin raftq)
  cp "$target/debug/raftq" "$old_bin"
  echo "upgrade: built the $previous binary in $(( $(date +%s) - start )) s"
fi

seed=${UPGRADE_SEED:-401}
out=target/jepsen/upgrade-$previous-$seed
# A failed run keeps its nodes' data: the next one starts from empty directories.
rm -rf "$out"
run_status=0
"$STATIC_RELEASE_DIR/raftq-jepsen" run --scenario upgrade --old-bin "$old_bin" --seed "$seed" --out "$out" || run_status=$?
if [ "$run_status" -ne 0 ]; then
  echo "upgrade: FAILED from $previous (exit $run_status); history, summary, report and node logs in $out" >&2
  echo "upgrade: repeat with UPGRADE_PREVIOUS=$previous UPGRADE_SEED=$seed jepsen-like/upgrade.sh" >&2
  status=$run_status
fi
done
exit "$status"
