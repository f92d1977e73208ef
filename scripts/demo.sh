#!/usr/bin/env bash
# make demo: a local broker, meshd running the example modules as module
# processes (examples/mesh.yaml), and meshctl tail showing what travels on
# the mesh, then meshctl call invoking a tool.
#
# Environment:
#   MESH_AMQP_URL   the broker, with its virtual host (default the local
#                   broker's /); everything the demo makes is made there.
#   DEMO_SECONDS    how long the mesh runs, once meshd says every module
#                   started (/readyz), before the calls (default 6).
#   DEMO_GRAPH_FILE where to write meshctl graph's picture too (the doc
#                   check compares it with the README's).
#   DEMO_LIVE=1     (make demo-live) keep the mesh running after the show,
#                   with the web console on DEMO_CONSOLE_ADDR (default
#                   127.0.0.1:8080), until Ctrl-C; open the login URL
#                   meshctl console prints.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
scripts/ensure-rabbitmq.sh
# The release and commit every binary says it is (meshd version), as make build stamps them.
v=github.com/meshkit/mesh/internal/version
ldflags="-X $v.release=$(cat VERSION) -X $v.commit=$(git rev-parse --short=12 HEAD 2>/dev/null || true)"
echo "== building meshd, meshctl, the example modules, the audit logger, the dispatcher, the agent and ordersource into bin/ (the first build compiles every dependency: a minute or two) =="
go build -ldflags "$ldflags" -o bin/ ./cmd/meshd ./cmd/meshctl
go build -ldflags "$ldflags" -o bin/modules/ ./examples/modules/...
go build -ldflags "$ldflags" -o bin/modules/audit-logger ./auditlogger/cmd/audit-logger
go build -ldflags "$ldflags" -o bin/modules/dispatcher ./modules/dispatcher/cmd/dispatcher
go build -ldflags "$ldflags" -o bin/modules/agent ./modules/agent/cmd/agent
go build -ldflags "$ldflags" -o bin/ordersource ./examples/ordersource
# The outside system's queue exists before the dispatcher consumes it
# (the dispatcher never declares a queue it does not own). ordersource
# reads MESH_AMQP_URL, so the queue is made in the demo's virtual host.
bin/ordersource -declare-only
seconds="${DEMO_SECONDS:-6}"
echo "== meshd runs umami, notifier, billing, tax, the audit logger, the dispatcher and the agent as module processes for ${seconds}s; meshctl tail 'module.#' shows the events =="
echo "== a demo setup: meshd and meshctl log in to the local broker as guest/guest, and meshd warns of it; a real mesh gives each node a broker user of its own and turns identity: on (docs/security.md) =="
bin/meshctl tail 'module.#' &
tail_pid=$!
config=examples/mesh.yaml
# As root, meshd runs each module as a user of its own (docs/security.md),
# which must be able to pass through the checkout to its directory and
# the agent's script. Where it cannot (a checkout under /root, say), the
# demo's modules run as root instead, and say so.
if [ "$(id -u)" = 0 ] && ! setpriv --reuid=65534 --regid=65534 --clear-groups test -x "$PWD/examples" 2>/dev/null; then
  echo "== $PWD is closed to other users: the demo's modules run as root (user: root), not as users of their own =="
  config=bin/demo-root.yaml
  sed 's/^  - name: \(.*\)$/  - name: \1\n    user: root/' examples/mesh.yaml > "$config"
fi
# meshd answers /readyz on a loopback port nothing listens on yet: the
# demo goes on once every module has started (a busy machine takes longer
# than the show's seconds), then lets the mesh run for them.
port=18480
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
bin/meshd run --config "$config" --log-level warn --http-addr "127.0.0.1:$port" &
meshd_pid=$!
trap 'kill "$tail_pid" "$meshd_pid" 2>/dev/null || true' EXIT
# The demo node is gone once the show ends: its queues (the audit
# logger's bound to "#") would otherwise keep every event the mesh carries
# (other nodes' heartbeats among them) for a node that never comes back.
# meshctl node remove deletes them; a later run declares them anew.
remove_node() {
  echo "== meshctl node remove demo --yes: the broker forgets the demo node (its modules' queues and their policies) =="
  bin/meshctl node remove demo --yes || echo "== the demo node's queues were not removed: run bin/meshctl node remove demo =="
}
ready() {
  exec 3<>"/dev/tcp/127.0.0.1/$port" || return 1
  printf 'GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  local status
  read -r _ status _ <&3 || true
  exec 3<&-
  [ "$status" = 200 ]
}
for _ in $(seq 1200); do
  ready 2>/dev/null && break
  kill -0 "$meshd_pid" 2>/dev/null || { echo "== meshd exited =="; exit 1; }
  sleep 0.1
done
ready 2>/dev/null || echo "== meshd is not ready after 2 minutes (see its log above); the demo goes on with what runs =="
sleep "$seconds"
echo "== meshctl call invoice.create (served by the billing module process, which calls tax.rate) =="
bin/meshctl call invoice.create '{"site":"demo.example","cents":1000}'
echo "== meshctl audit trace: the audit logger's record of a site umami created, and what it caused =="
site=$(bin/meshctl audit query --json --limit 1 --type 'module.umami.site.created' | sed -n 's/.*"id":"\([0-9A-Z]*\)".*/\1/p' | head -n 1)
if [ -n "$site" ]; then bin/meshctl audit trace "$site"; else echo "(no site event in the audit log yet)"; fi
echo "== an outside system publishes orders into its queue shop.orders with raw amqp091-go; the dispatcher's trigger hands each to invoice.issue, which the agent serves by running examples/agent/invoice.sh =="
bin/ordersource -n 2
sleep 1.5
echo "== meshctl dispatcher fires orders: the dispatcher's record of each firing =="
bin/meshctl dispatcher fires orders
echo "== meshctl audit trace: from the order (outside the mesh, so not in the audit log) to the invoice the dispatcher emitted =="
fired=$(bin/meshctl audit query --json --type 'module.dispatcher.fired' | tail -n 1 | sed -n 's/^{"seq":[0-9]*,"id":"\([0-9A-Z]*\)".*/\1/p')
if [ -n "$fired" ]; then bin/meshctl audit trace "$fired"; else echo "(no fired event in the audit log yet)"; fi
echo "== meshctl graph: the mesh drawn from the node's heartbeat (Mermaid; --format dot or svg for Graphviz) =="
bin/meshctl graph --wait 3s | tee "${DEMO_GRAPH_FILE:-/dev/null}"
echo "== meshctl audit replay --dry-run: what a replay of umami's events would send again, up to now =="
bin/meshctl audit replay --dry-run --type 'module.umami.#'
if [ -n "${DEMO_LIVE:-}" ]; then
  addr="${DEMO_CONSOLE_ADDR:-127.0.0.1:8080}"
  kill "$tail_pid" 2>/dev/null || true # the console's Live page shows the events now
  echo "== the demo mesh keeps running with the web console on $addr: open the login URL meshctl console prints next in a browser (it works once, for 10 minutes; where you have tokens of your own, from bin/meshctl console token add NAME, it prints none: log in at http://$addr/login with one); in another shell try bin/meshctl nodes, bin/meshctl tail '#', bin/meshctl call invoice.create '{\"site\":\"x\",\"cents\":1}'; Ctrl-C stops it all =="
  bin/meshctl console --addr "$addr" &
  console_pid=$!
  trap 'kill "$tail_pid" "$meshd_pid" "$console_pid" 2>/dev/null || true' EXIT
  trap 'echo; echo "== stopping the demo mesh =="; kill -TERM "$meshd_pid" "$console_pid" 2>/dev/null || true' INT TERM
  status=0
  wait "$meshd_pid" || status=$?
  if [ "$status" -gt 128 ] && kill -0 "$meshd_pid" 2>/dev/null; then # Ctrl-C: wait for meshd's drain
    status=0
    wait "$meshd_pid" || status=$?
  fi
  [ "$status" = 0 ] || echo "== meshd exited with status $status =="
  kill "$console_pid" 2>/dev/null || true
  remove_node
  exit 0
fi
kill -TERM "$meshd_pid"
wait "$meshd_pid" && echo "== meshd stopped cleanly (exit 0) on SIGTERM ==" || echo "== meshd exited with status $? =="
sleep 0.5
kill "$tail_pid" 2>/dev/null || true
wait "$tail_pid" 2>/dev/null || true
remove_node
echo "== done. The mesh stopped; make demo-live runs it until Ctrl-C with the web console. Try: bin/meshctl tail --json '#'   and in another shell: bin/meshctl emit mesh.demo.hello '{\"hi\":1}' =="
