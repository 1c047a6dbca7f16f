#!/usr/bin/env bash
# Runs a local three-node raftq cluster as plain processes, from the repository root:
#   cluster/run.sh start     build (release) and start nodes 1-3 (data and logs in cluster/data/)
#   cluster/run.sh stop      stop them (SIGTERM)
#   cluster/run.sh restart N restart node N
#   cluster/run.sh kill N    kill -9 node N
#   cluster/run.sh status    raftq cluster status
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${RAFTQ_BIN:-target/release/raftq}
data=cluster/data
mkdir -p "$data"
# The nodes' shared token secret: the CLI mints its tokens from it (see README).
export RAFTQ_AUTH_HS256_SECRET_FILE=$data/secret.hs256

start_node() {
  local i=$1
  if [ -f "$data/node$i.pid" ] && kill -0 "$(cat "$data/node$i.pid")" 2>/dev/null; then
    echo "node $i already runs (pid $(cat "$data/node$i.pid"))"
    return
  fi
  RAFTQ_LOG=${RAFTQ_LOG:-info} "$bin" serve --config "cluster/node$i.toml" >>"$data/node$i.log" 2>&1 &
  echo $! >"$data/node$i.pid"
  echo "node $i started (pid $!, log $data/node$i.log)"
}

stop_node() {
  local i=$1 sig=${2:-TERM}
  if [ -f "$data/node$i.pid" ]; then
    kill "-$sig" "$(cat "$data/node$i.pid")" 2>/dev/null || true
    if [ "$sig" = TERM ]; then
      for _ in $(seq 50); do kill -0 "$(cat "$data/node$i.pid")" 2>/dev/null || break; sleep 0.2; done
    fi
    rm -f "$data/node$i.pid"
    echo "node $i stopped ($sig)"
  fi
}

case "${1:-}" in
  start)
    [ -x "$bin" ] || cargo build --release
    for i in 1 2 3; do start_node "$i"; done
    for _ in $(seq 100); do
      if "$bin" cluster status --addr 127.0.0.1:9091 2>/dev/null | grep -q LEADER; then break; fi
      sleep 0.2
    done
    "$bin" cluster status --addr 127.0.0.1:9091
    ;;
  stop) for i in 1 2 3; do stop_node "$i"; done ;;
  restart) stop_node "$2"; start_node "$2" ;;
  kill) stop_node "$2" KILL ;;
  status) "$bin" cluster status --addr "${2:-127.0.0.1:9091}" ;;
  *) echo "usage: $0 start|stop|restart N|kill N|status" >&2; exit 2 ;;
esac
