#!/usr/bin/env bash
# Rolling restart (or upgrade) of the docker-compose cluster: one node at a time, followers first, and the leader
# last, after it has handed its leadership to a node already restarted. Before the next node goes down, the last
# one must be back: ready (/readyz), caught up with the leader, and the leadership settled (same leader, same
# term, for 2 s). So two of the three nodes serve at every moment, clients and workers keep working, and the
# leader is never taken down while it leads.
# (Known server behaviour, docs/deploy.md: in containers, a node coming back usually calls an election before
# the leader reaches it, which costs about a second without a leader; nothing acknowledged is lost.)
#
#   deploy/rolling-restart.sh            upgrade: recreate each node's container from the image as it is now
#                                        (after deploy/docker/build.sh); data stays in the node's volume
#   deploy/rolling-restart.sh --restart  restart the containers as they are
#
# Run it from the repository root (or pass Compose's own variables: COMPOSE_PROJECT_NAME, COMPOSE_FILE).
# It needs no token: every raftq call runs inside a container (`docker compose exec`), where the CLI mints its own
# from the cluster's shared secret (RAFTQ_AUTH_HS256_SECRET_FILE, docker-compose.yml); recreating a node keeps
# the `secrets` volume, so it comes back with the same secret.
# By hand, per node:  docker compose up -d --no-deps --force-recreate node2  (then wait until
# `docker compose exec node2 raftq-probe` prints ready, and `raftq cluster status` shows its lag near 0),
# and before the leader:  docker compose exec node1 raftq cluster transfer-leader --to 2
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=deploy/compose-lib.sh
. "$here/compose-lib.sh"
[ -n "${COMPOSE_FILE:-}" ] || cd "$here/.."

mode=recreate
case "${1:-}" in
  "") ;;
  --restart) mode=restart ;;
  *) echo "usage: $0 [--restart]" >&2; exit 2 ;;
esac
compose_detect || { echo "neither \`docker compose\` nor docker-compose found" >&2; exit 1; }
# How long one node may take to come back (start, catch up).
NODE_TIMEOUT_S=${NODE_TIMEOUT_S:-120}

log() { echo "[rolling-restart $(date +%T)] $*"; }

cycle_node() {
  local n=$1 t0=$SECONDS
  log "node $n: $mode"
  if [ "$mode" = recreate ]; then
    dc up -d --no-deps --force-recreate "node$n" 2>&1 | sed 's/^/  /'
  else
    dc restart "node$n" 2>&1 | sed 's/^/  /'
  fi
  wait_node_back "$n" "$NODE_TIMEOUT_S"
  log "node $n: back, ready, caught up, leadership settled ($((SECONDS - t0)) s; leader and term: $(leader_term))"
}

started=$SECONDS
wait_cluster_ready "$NODE_TIMEOUT_S"
done_nodes=()
while [ "${#done_nodes[@]}" -lt "${#NODES[@]}" ]; do
  leader=$(current_leader)
  if [ -z "$leader" ]; then
    wait_until 30 "a leader" have_leader
    leader=$(current_leader)
  fi
  next=
  for n in "${NODES[@]}"; do
    if [[ " ${done_nodes[*]} " != *" $n "* ]] && [ "$n" != "$leader" ]; then
      next=$n
      break
    fi
  done
  if [ -z "$next" ]; then
    # Only the leader is left: hand the leadership to a node already restarted, then restart the old leader.
    to=${done_nodes[0]}
    log "node $leader leads: transferring the leadership to node $to"
    node_exec "$to" raftq cluster transfer-leader --to "$to" </dev/null | sed 's/^/  /'
    next=$leader
  fi
  cycle_node "$next"
  done_nodes+=("$next")
done
wait_until 30 "a leader" have_leader
leader=$(current_leader)
log "all ${#NODES[@]} nodes restarted in $((SECONDS - started)) s; node $leader leads"
node_exec "$leader" raftq cluster status </dev/null | sed 's/^/  /'
