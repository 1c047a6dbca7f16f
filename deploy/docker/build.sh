#!/usr/bin/env bash
# Builds the raftq container image FROM scratch, out of what is compiled here (no base image is pulled):
#
#   deploy/docker/build.sh [IMAGE]   default raftq:latest (or $RAFTQ_IMAGE); also tags raftq:<version> (the Helm
#                                    chart's default) and raftq:<version>-<commit>
#
# 1. `raftq`, a static-pie glibc binary: cargo build --release --target <arch>-unknown-linux-gnu with
#    crt-static. It lands in target/<triple>/release and leaves the ordinary target/release build alone.
# 2. `raftq-probe` (probe.rs, the health check) and `raftq-entrypoint` (entrypoint.rs, node id from a
#    StatefulSet pod's ordinal, for the Helm chart): std-only, static, compiled by rustc alone.
# 3. rootfs.tar: the three binaries in /usr/local/bin, deploy/docker/rootfs/etc, an empty /data and an empty
#    /secrets owned by uid 10001 (a named volume mounted there starts as a copy of it, so the node can write the
#    cluster's token secret into it: docker-compose.yml), and /tmp; fixed owners and mtimes, so the layer depends
#    on the binaries only.
# 4. docker build -f deploy/docker/Dockerfile on a context holding rootfs.tar alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=deploy/docker
image=${1:-${RAFTQ_IMAGE:-raftq:latest}}
# The static build (flags, target triple, directory) is shared with the CI stages that run release binaries.
. .ci/static-release.sh
target_dir=${CARGO_TARGET_DIR:-target}
ctx=$target_dir/docker-image
# The uid the server runs as; the Helm chart's securityContext uses the same.
uid=10001

say() { echo "[build.sh] $*" >&2; }
started=$SECONDS

say "static raftq binary ($STATIC_RELEASE_TRIPLE, crt-static)"
static_release_build --bin raftq
bin=$STATIC_RELEASE_DIR/raftq
if readelf -lW "$bin" | grep -q 'program interpreter'; then
  say "error: $bin is dynamically linked; the image has no shared libraries"
  exit 1
fi

rm -rf "$ctx"
mkdir -p "$ctx/rootfs/usr/local/bin" "$ctx/rootfs/data" "$ctx/rootfs/secrets" "$ctx/rootfs/tmp"
cp "$bin" "$ctx/rootfs/usr/local/bin/raftq"
strip --strip-all "$ctx/rootfs/usr/local/bin/raftq" 2>/dev/null || say "strip not found: the binary keeps its symbols"
say "raftq-probe and raftq-entrypoint"
for tool in probe entrypoint; do
  rustc --edition 2021 -O -C target-feature=+crt-static -C strip=symbols \
    -o "$ctx/rootfs/usr/local/bin/raftq-$tool" "$here/$tool.rs"
done
cp -r "$here/rootfs/etc" "$ctx/rootfs/etc"
chmod 0755 "$ctx/rootfs/usr/local/bin/"*
chmod 0644 "$ctx/rootfs/etc/"*
chmod 1777 "$ctx/rootfs/tmp"
chmod 0750 "$ctx/rootfs/data"
chmod 0700 "$ctx/rootfs/secrets"

# One archive, two owners: ADD keeps the owners written in a local tar archive, which COPY cannot do for a
# directory in a FROM-scratch image (there is no shell to chown with).
tar_opts=(--sort=name --mtime=@0 --numeric-owner -C "$ctx/rootfs")
tar -cf "$ctx/rootfs.tar" "${tar_opts[@]}" --owner=0 --group=0 --exclude=./data --exclude=./secrets .
tar -rf "$ctx/rootfs.tar" "${tar_opts[@]}" --owner="$uid" --group="$uid" ./data ./secrets
cp "$here/Dockerfile" "$ctx/Dockerfile"
rm -rf "$ctx/rootfs"

version=$(awk -F'"' '/^version *=/ {print $2; exit}' Cargo.toml)
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
dirty=
if git status --porcelain --untracked-files=no 2>/dev/null | grep -q .; then dirty=-dirty; fi
say "docker build $image"
docker build -q -t "$image" -t "raftq:$version" -t "raftq:$version-$commit$dirty" \
  --label org.opencontainers.image.title=raftq \
  --label org.opencontainers.image.version="$version" \
  --label org.opencontainers.image.revision="$commit$dirty" \
  "$ctx" >/dev/null

size=$(docker image inspect -f '{{.Size}}' "$image")
# Decimal megabytes, as `docker image ls` shows them and as README.md and docs/deploy.md state the size (deploy/ci.sh
# checks that those figures stay within 10% of this one).
mb=$(awk -v b="$size" 'BEGIN { printf "%.1f", b / 1000000 }')
say "built $image (also raftq:$version, raftq:$version-$commit$dirty): $mb MB ($size bytes) in $((SECONDS - started)) s"
