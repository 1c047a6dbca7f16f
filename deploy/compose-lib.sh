# shellcheck shell=bash
# Helpers for the scripts that drive the docker-compose cluster (sourced by deploy/rolling-restart.sh and
# deploy/ci.sh; not run on its own). Everything goes through `docker compose exec -T nodeN raftq ...`, so it
# needs nothing on the host but Docker: the service names (node1:9091, ...) resolve inside the network only, and
# no token: inside a container the CLI mints its own from the shared secret its environment names.
# JSON is picked apart with sed: the raftq CLI prints one object per line, and a node's object has no nesting.

# The Compose command: v2's `docker compose`, else v1's `docker-compose` (1.27 or newer: older ones cannot read
# docker-compose.yml). Sets the array DC; 1 when neither is usable. deploy/compose.sh runs it for people.
compose_detect() {
  local v
  if docker compose version >/dev/null 2>&1; then
    DC=(docker compose)
  elif command -v docker-compose >/dev/null 2>&1; then
    v=$(docker-compose version --short 2>/dev/null || echo 0)
    if [ "$(printf '%s\n1.27.0\n' "$v" | sort -V | head -1)" != 1.27.0 ]; then
      echo "docker-compose $v is older than 1.27, which docker-compose.yml needs; install Compose v2" >&2
      return 1
    fi
    DC=(docker-compose)
  else
    return 1
  fi
}

dc() { "${DC[@]}" "$@"; }

# node_exec N CMD...: run CMD in node N's container (no TTY, so it works from scripts and CI).
node_exec() {
  local n=$1
  shift
  dc exec -T "node$n" "$@" </dev/null
}

NODES=(1 2 3)

# cluster_status [N...]: `raftq cluster status --output json` from the first of the nodes (default: all) that answers.
cluster_status() {
  local n
  for n in "${@:-${NODES[@]}}"; do
    if timeout 20 "${DC[@]}" exec -T "node$n" raftq cluster status --output json </dev/null 2>/dev/null; then
      return 0
    fi
  done
  return 1
}

# json_leader STATUS: the leader's node id, empty when there is none.
json_leader() { sed -n 's/.*"leader":\([0-9][0-9]*\).*/\1/p' <<<"$1"; }

# json_node_field STATUS N FIELD: FIELD of node N in a status (null when unknown).
json_node_field() {
  grep -o '{[^{}]*}' <<<"$1" | grep -E "\"node_id\":$2[,}]" | sed -n "s/.*\"$3\":\\(\"[^\"]*\"\\|[^,}]*\\).*/\\1/p" | tr -d '"'
}

# current_leader [N...]: the leader's id as the given nodes (default: all) see it; empty when none is known.
current_leader() {
  local s
  s=$(cluster_status "$@") || return 0
  json_leader "$s"
}

# leader_seen_by N: the leader node N knows of, from its /readyz answer (quick: no other node is asked).
leader_seen_by() {
  timeout 10 "${DC[@]}" exec -T "node$1" raftq-probe /readyz </dev/null 2>/dev/null |
    sed -n 's/.*"leader":\([0-9][0-9]*\).*/\1/p'
}

have_leader() { [ -n "$(current_leader "$@")" ]; }

# wait_until TIMEOUT_S WHAT CMD...: run CMD every 0.5 s until it succeeds; 1 (with a message) after TIMEOUT_S.
wait_until() {
  local timeout=$1 what=$2 deadline=$((SECONDS + $1))
  shift 2
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "timed out after ${timeout}s waiting for $what" >&2
      return 1
    fi
    sleep 0.5
  done
}

# node_ready N: GET /readyz answers 200 in node N (it knows a leader and has applied what it committed).
node_ready() { timeout 10 "${DC[@]}" exec -T "node$1" raftq-probe /readyz </dev/null; }

# Most entries a node may trail the leader by and count as caught up.
CAUGHT_UP_MAX_LAG=${CAUGHT_UP_MAX_LAG:-1000}

# node_caught_up N: node N is reachable and, by the leader's account, within CAUGHT_UP_MAX_LAG entries of it.
node_caught_up() {
  local s leader lag reachable
  s=$(cluster_status "$1") || return 1
  leader=$(json_leader "$s")
  [ -n "$leader" ] || return 1
  reachable=$(json_node_field "$s" "$1" reachable)
  [ "$reachable" = true ] || return 1
  [ "$leader" = "$1" ] && return 0
  lag=$(json_node_field "$s" "$1" replication_lag)
  [ -n "$lag" ] && [ "$lag" != null ] && [ "$lag" -le "$CAUGHT_UP_MAX_LAG" ]
}

# leader_term: "LEADER_ID TERM" as the cluster sees it now; fails when no leader is known.
leader_term() {
  local s leader
  s=$(cluster_status) || return 1
  leader=$(json_leader "$s")
  [ -n "$leader" ] || return 1
  echo "$leader $(json_node_field "$s" "$leader" term)"
}

# Seconds the same leader must keep the same term to count as settled: more than twice the election timeout
# (150-300 ms by default, after a 300 ms leader lease), so an election that a returning node is about to call has
# happened by then.
SETTLE_S=${SETTLE_S:-2}

# leader_settled: the same node leads in the same term over SETTLE_S seconds.
leader_settled() {
  local a b
  a=$(leader_term) || return 1
  sleep "$SETTLE_S"
  b=$(leader_term) || return 1
  [ "$a" = "$b" ]
}

# wait_node_back N TIMEOUT_S: node N is ready and caught up, and the leadership has settled.
wait_node_back() {
  wait_until "$2" "node $1 to be ready (/readyz)" node_ready "$1" &&
    wait_until "$2" "node $1 to catch up with the leader" node_caught_up "$1" &&
    wait_until "$2" "the leadership to settle" leader_settled
}

# wait_cluster_ready TIMEOUT_S: every node is ready and one leads.
wait_cluster_ready() {
  local n
  for n in "${NODES[@]}"; do
    wait_until "$1" "node $n to be ready (/readyz)" node_ready "$n" || return 1
  done
}
