#!/usr/bin/env bash
# Runs Docker Compose with the arguments given, whichever Compose is installed: v2's `docker compose` (a Docker
# CLI plugin), else v1's `docker-compose` (1.27 or newer reads docker-compose.yml). Without either, says so and
# exits 127. From the repository root:
#
#   deploy/compose.sh up -d
#   deploy/compose.sh exec node1 raftq cluster status
#   deploy/compose.sh which          # prints the command it runs ("docker compose" or "docker-compose")
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=deploy/compose-lib.sh
. deploy/compose-lib.sh
if ! compose_detect; then
  echo "deploy/compose.sh: no Docker Compose: neither \`docker compose\` (v2) nor \`docker-compose\` (v1) runs here" >&2
  exit 127
fi
if [ "${1:-}" = which ]; then
  echo "${DC[*]}"
  exit 0
fi
exec "${DC[@]}" "$@"
