#!/usr/bin/env bash
# make screenshots: the pictures of the console guide (docs/console.md).
#
# Builds what make demo builds, runs the demo mesh (meshd with
# examples/mesh.yaml's modules as module processes) in a RabbitMQ virtual
# host of its own, made here and deleted at the end, feeds it (umami's
# sites, two orders for the dispatcher, a tool gone missing for a while so
# that the notifier gives up on a few sites, an event whose body the
# notifier cannot read), starts meshctl console on it and runs the browser
# test TestScreenshots (cmd/meshctl/screenshots_test.go, build tag
# screenshots), which visits each page and writes docs/images/console-*.png.
#
# Needs the local RabbitMQ (scripts/ensure-rabbitmq.sh) with its management
# plugin, rabbitmqctl (as root, or sudo without a password) and Chromium
# (scripts/ensure-chromium.sh). It stops only what it started, by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
scripts/ensure-rabbitmq.sh
scripts/ensure-chromium.sh
go build -o bin/ ./cmd/meshd ./cmd/meshctl
go build -o bin/modules/ ./examples/modules/...
go build -o bin/modules/audit-logger ./auditlogger/cmd/audit-logger
go build -o bin/modules/dispatcher ./modules/dispatcher/cmd/dispatcher
go build -o bin/modules/agent ./modules/agent/cmd/agent
go build -o bin/ordersource ./examples/ordersource

log() { echo "== screenshots: $* ==" >&2; }
# Debian's rabbitmqctl works for root and the rabbitmq user; the others go
# through sudo.
rmq() {
  if [ "$(id -u)" = 0 ] || [ "$(id -un)" = rabbitmq ]; then
    timeout 60 rabbitmqctl -q "$@"
  else
    timeout 60 sudo -n rabbitmqctl -q "$@"
  fi
}

vhost="mesh-shots-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
url="amqp://guest:guest@127.0.0.1:5672/$vhost"
config=bin/screenshots-mesh.yaml
state=bin/screenshots-state
console_out=bin/screenshots-console.out
out_dir=docs/images
# meshd and meshctl read these before the config: only this script's
# broker URL may count.
unset MESH_AMQP_URLS MESH_NODE MESH_STATE_DIR MESH_HTTP_ADDR MESH_CONSOLE_ADDR MESH_CONSOLE_TOKEN_FILE MESH_CONSOLE_TOKENS MESH_CONSOLE_TLS_CERT MESH_CONSOLE_TLS_KEY MESH_MANAGEMENT_URL
export MESH_AMQP_URL="$url"

meshd_pid=
console_pid=
cleanup() {
  status=$?
  for pid in $console_pid $meshd_pid; do
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rmq delete_vhost "$vhost" >/dev/null 2>&1 || echo "screenshots: could not delete the virtual host $vhost: rabbitmqctl delete_vhost $vhost" >&2
  rm -rf "$state" "$config" "$console_out"
  if [ -n "${MESH_CONSOLE_TOKENS:-}" ]; then
    rm -f "$MESH_CONSOLE_TOKENS" "$MESH_CONSOLE_TOKENS.lock"
  fi
  if [ "$status" = 0 ]; then
    rm -f bin/screenshots-meshd.log bin/screenshots-console.log
  else
    echo "screenshots: failed (status $status); the logs are bin/screenshots-meshd.log and bin/screenshots-console.log" >&2
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf "$state"
log "virtual host $vhost"
rmq add_vhost "$vhost" >/dev/null
rmq set_permissions -p "$vhost" guest '.*' '.*' '.*' >/dev/null

# As root, meshd runs each module as a user of its own (docs/security.md),
# which must be able to pass through the checkout; where it cannot, the
# modules run as root, as in make demo.
as_root=
if [ "$(id -u)" = 0 ] && ! setpriv --reuid=65534 --regid=65534 --clear-groups test -x "$PWD/examples" 2>/dev/null; then
  log "$PWD is closed to other users: the modules run as root (user: root)"
  as_root=1
fi
# write_config [without-tax]: examples/mesh.yaml with this script's broker
# and state dir, less the tax module if asked.
write_config() {
  sed -e "s|^amqp_url: .*|amqp_url: $url|" -e "s|^state_dir: .*|state_dir: ./$state|" examples/mesh.yaml > "$config.new"
  if [ "${1:-}" = without-tax ]; then
    sed -i '/^  - name: tax$/,/^    tools: \["tax.rate"\]$/d' "$config.new"
  fi
  if [ -n "$as_root" ]; then
    sed -i 's/^  - name: \(.*\)$/  - name: \1\n    user: root/' "$config.new"
  fi
  mv "$config.new" "$config"
}

# wait_until WHAT COMMAND...: runs COMMAND every 0.2 s until it succeeds,
# for a minute at most.
wait_until() {
  local what=$1
  shift
  for _ in $(seq 300); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  echo "screenshots: gave up waiting for $what" >&2
  return 1
}
audited() { [ "$(bin/meshctl audit count "${@:2}")" -ge "$1" ]; }
dead() { [ "$(bin/meshctl dlq ls --json "${@:2}" | wc -l)" -ge "$1" ]; }
tax_answers() { bin/meshctl call tax.rate '"shots.example"' --timeout 2s; }
tax_gone() { ! tax_answers; }
unrouted_empty() { [ -z "$(bin/meshctl unrouted ls --json)" ]; }
fired() { [ "$(bin/meshctl dispatcher fires orders --json | wc -l)" -ge "$1" ]; }

# The outside system's queue exists before the dispatcher consumes it.
bin/ordersource -url "$url" -declare-only
write_config
log "meshd runs the demo mesh (node demo)"
bin/meshd run --config "$config" --log-level warn 2> bin/screenshots-meshd.log &
meshd_pid=$!
wait_until "the node to join" audited 1 --type node.demo.joined
wait_until "three sites handled" audited 3 --type module.notifier.notification.sent

log "tax stops (SIGHUP without it): the notifier gives up on the sites it cannot invoice"
write_config without-tax
kill -HUP "$meshd_pid"
wait_until "tax.rate to be gone" tax_gone
wait_until "three dead letters of the notifier" dead 3 --module notifier
log "tax is back"
write_config
kill -HUP "$meshd_pid"
wait_until "tax.rate to answer" tax_answers

log "an event whose body the notifier cannot read: dead-lettered at once"
bad=$(bin/meshctl emit module.umami.site.created '"not a site"')
wait_until "the bad event's dead letter" dead 1 --id "$bad"
wait_until "the audit log to record it dead" audited 1 --dead --id "$bad"

log "two orders for the dispatcher's trigger"
bin/ordersource -url "$url" -n 2
wait_until "two firings" fired 2

# meshd announced the modules it started before the audit logger's queue
# (bound to #) existed: no queue wanted those events, and mesh.unrouted
# kept them. Sent again, the audit logger takes them, and the overview
# lists only what this script broke.
log "the node's start events, unrouted, replayed to the audit logger"
bin/meshctl unrouted replay --type 'node.demo.#'
wait_until "mesh.unrouted to be empty" unrouted_empty

log "meshctl console"
# A token of this script's own, in a tokens file of its own (removed at
# the end): the console always wants one, and the user's file is theirs.
export MESH_CONSOLE_TOKENS="$PWD/bin/screenshots-console-tokens"
rm -f "$MESH_CONSOLE_TOKENS"
console_token=$(bin/meshctl console token add screenshots)
bin/meshctl console --addr 127.0.0.1:0 > "$console_out" 2> bin/screenshots-console.log &
console_pid=$!
wait_until "the console to listen" grep -q '^meshctl console on http://' "$console_out"
console_url=$(sed -n 's|^meshctl console on \(http://[^/]*\)/.*|\1|p' "$console_out" | head -n 1)
log "console on $console_url; the pictures go to $out_dir"
mkdir -p "$out_dir"
MESH_SCREENSHOTS_URL="$console_url" MESH_SCREENSHOTS_TOKEN="$console_token" MESH_SCREENSHOTS_DIR="$PWD/$out_dir" \
  go test -tags screenshots -count=1 -timeout 10m -run '^TestScreenshots$' -v ./cmd/meshctl
ls -l "$out_dir"/console-*.png
