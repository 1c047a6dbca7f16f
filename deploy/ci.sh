#!/usr/bin/env bash
# CI stage for deployment (.ci/run runs it after the tests pass); also runnable by hand from the repository root.
#
# 1. The Helm chart: Helm's lint and template rendering, offline, plus strict schema validation
#    (deploy/helm/check.sh). Needs no Docker.
# 2. Without a usable Docker engine (`docker info` fails) or Compose: prints "skipped: ..." and exits 0.
# 3. Builds the image (deploy/docker/build.sh) and brings up docker-compose.yml under a project and host ports of
#    its own (so a cluster of yours, or another run, is not touched).
# 4. Authentication (on by default): a host call without a token, or with a forged one, is refused; the host
#    gets its token (RAFTQ_TOKEN) from `raftq token issue` in a container, as docker-compose.yml documents.
#    Tasks enqueued, claimed, completed and read through nodes chosen at random, with the CLI inside the
#    containers (`docker compose exec`, peers by service name; there it mints its own token).
# 5. Under load (producers enqueueing through random nodes' published ports, workers `raftq worker` on the host
#    with every node listed): kill -9 the leader's container and restart it; transfer the leadership; restart
#    every node one by one (deploy/rolling-restart.sh: followers first, leader after a transfer).
# 6. Checks that every acknowledged enqueue ends COMPLETED (nothing acknowledged was lost) and that the three
#    replicas agree (same state digest at the same applied index).
# 7. Runs the Helm chart's rendered pod spec as three containers (no Kubernetes here) and checks they form a
#    cluster by their headless-Service names. Tears down (always, from a trap) and prints timings.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=deploy/compose-lib.sh
. deploy/compose-lib.sh

T0=$SECONDS
# shellcheck disable=SC2317 # called by phase(), which shellcheck does not follow
now_ms() { date +%s%3N; }
TIMINGS=()
PHASE=
PHASE_T0=0
phase() {
  PHASE=$1
  PHASE_T0=$SECONDS
  echo "== deploy/ci.sh: $1"
  [ -z "${work:-}" ] || echo "$(now_ms) $1" >>"$work/phases"
}
phase_done() { TIMINGS+=("$(printf '%-58s %5d s' "$PHASE" $((SECONDS - PHASE_T0)))"); }
print_timings() {
  echo "== deploy/ci.sh timings"
  printf '%s\n' "${TIMINGS[@]}" "$(printf '%-58s %5d s' total $((SECONDS - T0)))"
}
die() {
  echo "deploy/ci.sh: FAILED: $*" >&2
  exit 1
}

phase "helm chart: lint, template, schema validation"
helm_rc=0
deploy/helm/check.sh || helm_rc=$?
case $helm_rc in
  0) ;;
  75) echo "deploy/ci.sh: helm check skipped: its Python packages could not be installed (no PyPI?)" ;;
  *) die "the Helm chart does not lint, render or validate" ;;
esac
phase_done

if ! docker info >/dev/null 2>&1; then
  echo "deploy/ci.sh: skipped: no Docker engine (\`docker info\` failed); the image and compose tests did not run"
  print_timings
  exit 0
fi
if ! compose_detect; then
  echo "deploy/ci.sh: skipped: no Docker Compose (neither \`docker compose\` nor docker-compose)"
  print_timings
  exit 0
fi
# deploy/compose.sh (what the README tells people to run when `docker compose` is missing) picks the same one.
[ "$(deploy/compose.sh which)" = "${DC[*]}" ] || die "deploy/compose.sh runs $(deploy/compose.sh which), the scripts ${DC[*]}"
echo "compose: ${DC[*]} ($("${DC[@]}" version --short 2>/dev/null || echo '?'))"

# A project, an image tag and host ports of our own.
export COMPOSE_PROJECT_NAME=raftq-ci-$$
export RAFTQ_IMAGE=raftq:ci
# Host ports below the kernel's ephemeral range (which outgoing connections take from), not listened on, and
# leased the way the Rust harnesses lease theirs (jepsen-like/src/ports.rs): an exclusive flock on
# $TMPDIR/raftq-ports/<port>.lock, held by this shell (and whatever it starts) until it exits, so a concurrent
# test run, jepsen-like run or deploy/ci.sh never picks the same port.
used_ports=" "
ephemeral_low=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
lock_dir=${TMPDIR:-/tmp}/raftq-ports
mkdir -p "$lock_dir"
port_busy() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
  command -v ss >/dev/null 2>&1 && [ -n "$(ss -Htan "( sport = :$1 )" 2>/dev/null)" ]
}
# lease_port: sets PORT (not a $(...) subshell, which would let the lock go when it exits).
lease_port() {
  local p fd
  for _ in $(seq 500); do
    p=$((10000 + RANDOM % (ephemeral_low - 10000)))
    [[ "$used_ports" != *" $p "* ]] || continue
    if command -v flock >/dev/null 2>&1; then
      exec {fd}>>"$lock_dir/$p.lock" || continue
      if ! flock -n "$fd"; then
        exec {fd}>&-
        continue
      fi
    fi
    if port_busy "$p"; then
      [ -z "${fd:-}" ] || exec {fd}>&-
      continue
    fi
    used_ports+="$p "
    PORT=$p
    return 0
  done
  return 1
}
# publish_on_new_ports: host ports for every node's gRPC and HTTP port (RAFTQ_NODEn_*_PORT, docker-compose.yml).
publish_on_new_ports() {
  GRPC_PORTS=()
  for n in "${NODES[@]}"; do
    lease_port || die "no free host port"
    export "RAFTQ_NODE${n}_GRPC_PORT=$PORT"
    GRPC_PORTS+=("$PORT")
    lease_port || die "no free host port"
    export "RAFTQ_NODE${n}_HTTP_PORT=$PORT"
  done
}
publish_on_new_ports
work=$(mktemp -d "${TMPDIR:-/tmp}/raftq-deploy-ci.XXXXXX")
LOAD_PIDS=()
WORKER_PIDS=()

cleanup() {
  local rc=$?
  set +e
  touch "$work/stop"
  for p in "${LOAD_PIDS[@]}" "${WORKER_PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${LOAD_PIDS[@]}" "${WORKER_PIDS[@]}"; do wait "$p" 2>/dev/null; done
  if [ "$rc" -ne 0 ]; then
    echo "== deploy/ci.sh: last log lines of each node"
    dc logs --no-color --tail 30 2>&1 | tail -100
    for f in "$work"/worker*.log; do [ -f "$f" ] && { echo "-- $f"; tail -20 "$f"; }; done
  fi
  echo "== deploy/ci.sh: teardown"
  local t=$SECONDS
  dc down -v --remove-orphans -t 10 >/dev/null 2>&1
  echo "teardown took $((SECONDS - t)) s"
  rm -rf "$work"
  [ "$rc" -eq 0 ] || print_timings
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

phase "image build (deploy/docker/build.sh $RAFTQ_IMAGE)"
deploy/docker/build.sh "$RAFTQ_IMAGE"
IMAGE_SIZE=$(docker image inspect -f '{{.Size}}' "$RAFTQ_IMAGE")
# The size the README and docs/deploy.md state ("about N MB", decimal megabytes as `docker image ls` shows them)
# must be the one measured, within 10%: a change that grows the image updates them.
IMAGE_MB=$(awk -v b="$IMAGE_SIZE" 'BEGIN { printf "%.1f", b / 1000000 }')
for doc in README.md docs/deploy.md; do
  said=$(grep -o 'image is about [0-9.]* MB' "$doc" | head -1 | grep -o '[0-9.]*' || true)
  [ -n "$said" ] || die "$doc does not say how large the image is (\"image is about N MB\")"
  awk -v a="$said" -v m="$IMAGE_MB" 'BEGIN { d = a - m; if (d < 0) d = -d; exit !(d <= m / 10) }' ||
    die "$doc says the image is about $said MB; it measures $IMAGE_MB MB: update it (deploy/docker/build.sh prints the size)"
  echo "$doc: about $said MB; measured $IMAGE_MB MB"
done
BIN=${CARGO_TARGET_DIR:-target}/$(uname -m)-unknown-linux-gnu/release/raftq
phase_done

phase "compose up: 3 nodes ready (project $COMPOSE_PROJECT_NAME, ${DC[*]})"
# A port taken meanwhile by a program that takes no leases fails the start: again on new ports.
for attempt in 1 2 3; do
  if up_out=$(dc up -d 2>&1); then
    sed 's/^/  /' <<<"$up_out"
    break
  fi
  sed 's/^/  /' <<<"$up_out"
  if [ "$attempt" -lt 3 ] && grep -qiE 'address already in use|port is already allocated' <<<"$up_out"; then
    echo "a host port was taken meanwhile: compose up again on new ports"
    dc down -v --remove-orphans -t 5 >/dev/null 2>&1 || true
    publish_on_new_ports
    continue
  fi
  die "compose up failed"
done
wait_cluster_ready 120 || die "the cluster did not become ready"
echo "leader: node $(current_leader)"
phase_done

rand_node() { echo $((RANDOM % ${#NODES[@]} + 1)); }

phase "auth: calls without a valid token refused, host token"
# Inside the containers the CLI mints its own tokens from the shared secret (RAFTQ_AUTH_HS256_SECRET_FILE is in
# their environment); the host's producers, workers and checks use this one, minted the way docker-compose.yml
# says.
RAFTQ_TOKEN=$(node_exec 1 raftq token issue --secret-file /secrets/cluster.hs256 --scopes enqueue,work,read,admin \
  --ttl 12h) || die "raftq token issue in node 1"
[ -n "$RAFTQ_TOKEN" ] || die "raftq token issue printed nothing"
export RAFTQ_TOKEN
if out=$(env -u RAFTQ_TOKEN -u RAFTQ_AUTH_HS256_SECRET_FILE RAFTQ_DATA_DIR="$work/no-such-node" \
  timeout 20 "$BIN" task enqueue --addr "127.0.0.1:${GRPC_PORTS[0]}" --queue noauth --payload x 2>&1); then
  die "an enqueue without a token was accepted: $out"
fi
[[ "$out" == *TOKEN_MISSING* ]] || die "an enqueue without a token failed, but not for want of a token: $out"
echo "without a token: refused (TOKEN_MISSING)"
head -c 36 /dev/urandom | base64 >"$work/other.hs256"
forged=$("$BIN" token issue --secret-file "$work/other.hs256" --scopes enqueue,work,read,admin) ||
  die "raftq token issue on the host"
if out=$(timeout 20 "$BIN" task enqueue --addr "127.0.0.1:${GRPC_PORTS[0]}" --queue noauth --payload x \
  --auth-token "$forged" 2>&1); then
  die "an enqueue with a token signed by another secret was accepted: $out"
fi
[[ "$out" == *TOKEN_* ]] || die "an enqueue with a token signed by another secret failed, but not on its token: $out"
echo "with a token signed by another secret: refused ($(grep -o 'TOKEN_[A-Z_]*' <<<"$out" | head -1))"
id=$(timeout 20 "$BIN" task enqueue --addr "127.0.0.1:${GRPC_PORTS[1]}" --queue noauth --payload x) ||
  die "an enqueue from the host with RAFTQ_TOKEN failed"
echo "with RAFTQ_TOKEN from \`raftq token issue\` in node 1: accepted ($id)"
phase_done

phase "CLI inside the containers, through random nodes"
smoke=8
for i in $(seq "$smoke"); do
  n=$(rand_node) m=$(rand_node)
  id=$(node_exec "$n" raftq task enqueue --addr "node$m:9091" --queue smoke --payload "smoke-$i") ||
    die "enqueue via node $n -> node$m:9091"
  echo "$id" >>"$work/smoke.ids"
done
claimed=0
for _ in $(seq 20); do
  n=$(rand_node) m=$(rand_node)
  node_exec "$n" raftq task claim --addr "node$m:9091" --queue smoke --worker ci --count "$smoke" --lease 60s \
    >"$work/claims" || die "claim via node $n -> node$m:9091"
  while IFS=$'\t' read -r id _ tok payload; do
    n=$(rand_node) m=$(rand_node)
    node_exec "$n" raftq task complete "$id" --addr "node$m:9091" --token "${tok#token=}" --result "done-$payload" \
      >/dev/null || die "complete $id via node $n -> node$m:9091"
    claimed=$((claimed + 1))
  done <"$work/claims"
  [ "$claimed" -ge "$smoke" ] && break
  sleep 0.5
done
[ "$claimed" -eq "$smoke" ] || die "claimed $claimed of $smoke smoke tasks"
while read -r id; do
  n=$(rand_node) m=$(rand_node)
  r=$(node_exec "$n" raftq task result "$id" --addr "node$m:9091" --output json) || die "result $id"
  [[ "$r" == *'"state":"COMPLETED"'* && "$r" == *'"result":"done-smoke-'* ]] || die "smoke task $id: $r"
done <"$work/smoke.ids"
echo "$smoke tasks enqueued, claimed, completed and read back through random nodes"
phase_done

phase "load: producers and workers on the host"
producer() {
  local k=$1 i=0 p id
  while [ ! -e "$work/stop" ]; do
    i=$((i + 1))
    p=${GRPC_PORTS[RANDOM % ${#GRPC_PORTS[@]}]}
    if id=$(timeout 20 "$BIN" task enqueue --addr "127.0.0.1:$p" --queue load --payload "load-$k-$i" \
      --max-attempts 100 2>>"$work/producer$k.err"); then
      echo "$(now_ms) $id" >>"$work/acked.$k"
    else
      echo "$i" >>"$work/enqueue-errors.$k"
    fi
  done
}
addrs_shuffled() { printf '127.0.0.1:%s\n' "${GRPC_PORTS[@]}" | shuf | paste -sd, -; }
for w in 1 2; do
  "$BIN" worker --addr "$(addrs_shuffled)" --queue load --concurrency 4 --lease 5s --shutdown-grace 5s \
    --worker-id "ci-worker-$w" -- cat >"$work/worker$w.log" 2>&1 &
  WORKER_PIDS+=($!)
done
for k in 1 2; do
  producer "$k" &
  LOAD_PIDS+=($!)
done
acked() { cat "$work"/acked.* 2>/dev/null | wc -l; }
sleep 5
echo "after 5 s: $(acked) enqueues acknowledged"
phase_done

phase "kill -9 the leader's container, restart it"
leader=$(current_leader)
[ -n "$leader" ] || die "no leader"
others=()
for n in "${NODES[@]}"; do [ "$n" = "$leader" ] || others+=("$n"); done
new_leader_elected() {
  local n l
  for n in "${others[@]}"; do
    l=$(leader_seen_by "$n")
    if [ -n "$l" ] && [ "$l" != "$leader" ]; then
      NEW_LEADER=$l
      return 0
    fi
  done
  return 1
}
before=$(acked)
t=$(now_ms)
dc kill -s SIGKILL "node$leader" 2>&1 | sed 's/^/  /'
# Polled in the main shell (wait_until would run it in a subshell and lose NEW_LEADER).
NEW_LEADER=
until new_leader_elected; do
  [ $(($(now_ms) - t)) -lt 60000 ] || die "no new leader 60 s after killing node $leader"
  sleep 0.2
done
FAILOVER_MS=$(($(now_ms) - t))
echo "node $leader killed; node $NEW_LEADER leads, seen $FAILOVER_MS ms after the kill (polling /readyz via exec)"
sleep 3
dc start "node$leader" 2>&1 | sed 's/^/  /'
wait_node_back "$leader" 120 || die "node $leader did not come back"
echo "node $leader back and caught up; $(($(acked) - before)) enqueues acknowledged meanwhile"
phase_done

phase "leadership transfer"
leader=$(current_leader)
to=$(( (leader % ${#NODES[@]}) + 1 ))
via=$(rand_node)
out=$(node_exec "$via" raftq cluster transfer-leader --to "$to") || die "transfer-leader --to $to via node $via"
echo "via node $via: $out"
[ "$(current_leader)" = "$to" ] || die "node $to does not lead after the transfer"
TRANSFER=$out
phase_done

phase "rolling restart under load (deploy/rolling-restart.sh)"
before=$(acked)
deploy/rolling-restart.sh || die "rolling restart"
echo "$(($(acked) - before)) enqueues acknowledged during the rolling restart"
phase_done

phase "verify: every acknowledged enqueue COMPLETED, replicas agree"
touch "$work/stop"
for p in "${LOAD_PIDS[@]}"; do wait "$p" || true; done
LOAD_PIDS=()
cut -d' ' -f2 "$work"/acked.* | sort -u >"$work/acked"
total=$(wc -l <"$work/acked")
errors=$(cat "$work"/enqueue-errors.* 2>/dev/null | wc -l)
[ "$total" -gt 0 ] || die "no enqueue was acknowledged"
# Four checkers, each on a quarter of the ids, each asking random nodes; --wait lets the workers finish.
split -n l/4 "$work/acked" "$work/check."
check_ids() {
  local id p r
  while read -r id; do
    p=${GRPC_PORTS[RANDOM % ${#GRPC_PORTS[@]}]}
    if r=$(timeout 90 "$BIN" task result "$id" --addr "127.0.0.1:$p" --wait 60s --output json 2>&1); then
      echo "$id $(sed -n 's/.*"state":"\([A-Z_]*\)".*/\1/p' <<<"$r")"
    else
      echo "$id ERROR $r"
    fi
  done <"$1"
}
CHECK_PIDS=()
for f in "$work"/check.*; do
  check_ids "$f" >"$f.out" &
  CHECK_PIDS+=($!)
done
for p in "${CHECK_PIDS[@]}"; do wait "$p"; done
cat "$work"/check.*.out >"$work/states"
completed=$(grep -c ' COMPLETED$' "$work/states" || true)
if [ "$completed" -ne "$total" ]; then
  grep -v ' COMPLETED$' "$work/states" | head -20
  die "$((total - completed)) of $total acknowledged tasks are not COMPLETED"
fi
echo "all $total acknowledged enqueues found COMPLETED; $errors enqueue calls failed unacknowledged (and were not retried):"
# The CLI's error lines, by message, ids and addresses blanked out.
cat "$work"/producer*.err 2>/dev/null | grep -v '^ *$' | sed -E 's/[0-9a-f]{32}/ID/g; s/[0-9]+(\.[0-9]+){3}(:[0-9]+)?/ADDR/g' |
  sort | uniq -c | sort -rn | head -6 | sed 's/^/  /'
for p in "${WORKER_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${WORKER_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
WORKER_PIDS=()
for f in "$work"/worker*.log; do
  echo "  $(basename "$f" .log): $(grep -o 'WorkerSummary {.*}' "$f" | tail -1)"
done
# Availability: the longest stretches without an acknowledged enqueue, and the phase each began in.
GAPS=$(sort -n "$work"/acked.[0-9]* | awk -v phases="$work/phases" '
  BEGIN { while ((getline line < phases) > 0) { n++; pt[n] = substr(line, 1, 13) + 0; pn[n] = substr(line, 15) } }
  { t = $1 + 0; if (prev) { g = t - prev; if (g > 300) { p = ""; for (i = 1; i <= n; i++) if (pt[i] <= prev) p = pn[i]; print g, p } } prev = t }' |
  sort -rn | head -3 | awk '{ g = $1; $1 = ""; printf "  %d ms without an acknowledged enqueue, during:%s\n", g, $0 }')
echo "longest gaps between acknowledged enqueues (2 producers, random nodes):"
echo "${GAPS:-  none over 300 ms}"
same_state() {
  local d
  d=$(node_exec 1 raftq cluster digest --output json) || return 1
  [ "$(grep -c '"digest"' <<<"$d")" -eq "${#NODES[@]}" ] || return 1
  [ "$(sed -n 's/.*"applied_index":\([0-9]*\).*"digest":"\([0-9a-f]*\)".*/\1 \2/p' <<<"$d" | sort -u | wc -l)" -eq 1 ] ||
    return 1
  echo "$d" >"$work/digest"
}
wait_until 60 "the three replicas to agree (same digest at the same applied index)" same_state ||
  die "replicas disagree: $(node_exec 1 raftq cluster digest)"
sed 's/^/  /' "$work/digest"
phase_done

if [ "$helm_rc" -eq 0 ]; then
  phase "the Helm chart's pods as containers (deploy/helm/check.sh pods-in-docker)"
  deploy/helm/check.sh pods-in-docker "$RAFTQ_IMAGE" || die "the chart's pod spec does not form a cluster"
  phase_done
fi

echo "== deploy/ci.sh: passed"
echo "image $RAFTQ_IMAGE: $IMAGE_MB MB ($IMAGE_SIZE bytes)"
echo "tasks: $smoke through the containers' CLI; $total acknowledged enqueues under load, all COMPLETED, none lost"
echo "leader kill: a new leader seen after $FAILOVER_MS ms (polling /readyz via docker compose exec); transfer: $TRANSFER"
echo "longest gaps between acknowledged enqueues:"
echo "${GAPS:-  none over 300 ms}"
print_timings
