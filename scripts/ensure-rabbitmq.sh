#!/usr/bin/env bash
# Makes sure a local RabbitMQ answers on 127.0.0.1:5672 (guest/guest).
#
# Installs rabbitmq-server with apt-get when it is missing (needs root or sudo),
# starts the node or its app when stopped, waits until the broker is booted
# and the AMQP port accepts connections, and enables the management plugin
# (meshctl topology check reads bindings from its HTTP API on port 15672).
# Idempotent; fast when the broker is up.
#
# Environment:
#   MESH_AMQP_URL            if it points at another host or port, this script
#                            leaves the local broker alone and exits 0.
#   MESH_RABBITMQ_WAIT_SECS  how long to wait for startup (default 120).
#   MESH_NO_MANAGEMENT       set: never enable the management plugin (it is
#                            otherwise enabled, saying so, where it is off).
set -euo pipefail

export PATH="$PATH:/usr/sbin:/sbin"

HOST=127.0.0.1
PORT=5672
WAIT_SECS="${MESH_RABBITMQ_WAIT_SECS:-120}"
HINT="mesh needs RabbitMQ on ${HOST}:${PORT}: run \`sudo apt-get install rabbitmq-server && sudo rabbitmq-server -detached\`, or set MESH_AMQP_URL"

log() { echo "ensure-rabbitmq: $*" >&2; }
die() { echo "ensure-rabbitmq: $*" >&2; exit 1; }

port_open() { timeout 1 bash -c "</dev/tcp/${HOST}/${PORT}" 2>/dev/null; }

# A broker configured elsewhere is not ours to manage. (The URL is never printed:
# it may carry a password.)
if [[ -n "${MESH_AMQP_URL:-}" ]]; then
	url="${MESH_AMQP_URL#*://}"   # strip scheme
	url="${url%%/*}"              # strip vhost/path
	url="${url##*@}"              # strip user:password@
	case "$url" in
		127.0.0.1|127.0.0.1:5672|localhost|localhost:5672|"[::1]"|"[::1]:5672") ;;
		*) log "MESH_AMQP_URL points at another broker; leaving the local one alone"; exit 0 ;;
	esac
fi

# How to run privileged commands: directly as root (or as the rabbitmq user),
# through sudo otherwise. Debian's rabbitmqctl only works for root or rabbitmq.
SUDO=()
CAN_ADMIN=1
if [[ "$(id -u)" -ne 0 && "$(id -un)" != rabbitmq ]]; then
	if command -v sudo >/dev/null 2>&1 && { sudo -n true 2>/dev/null || [[ -t 0 ]]; }; then
		SUDO=(sudo)
	else
		CAN_ADMIN=0
	fi
fi

installed() { command -v rabbitmq-server >/dev/null 2>&1 || [[ -x /usr/sbin/rabbitmq-server ]]; }
ctl() { timeout 30 "${SUDO[@]}" rabbitmqctl -q "$@" >/dev/null 2>&1; }
diag() { timeout 30 "${SUDO[@]}" rabbitmq-diagnostics -q "$@" >/dev/null 2>&1; }
# The Erlang node answers (its rabbit app may still be stopped). `status` needs
# the app on RabbitMQ >= 3.9, `ping` does not; try both.
node_up() { ctl ping || ctl status; }
# The management plugin: AMQP cannot list bindings, its HTTP API can. Enabling
# it on a running node needs no restart.
ensure_management() {
	if timeout 30 "${SUDO[@]}" rabbitmq-plugins -q is_enabled rabbitmq_management >/dev/null 2>&1; then
		return 0
	fi
	if [[ -n "${MESH_NO_MANAGEMENT:-}" ]]; then
		log "the management plugin is off and MESH_NO_MANAGEMENT is set: leaving it off (meshctl topology check and the console's queue pages will say so)"
		return 0
	fi
	log "enabling RabbitMQ's management plugin on this broker (rabbitmq-plugins enable rabbitmq_management): meshctl topology check and the console read queues and bindings from its HTTP API on 127.0.0.1:15672; rabbitmq-plugins disable rabbitmq_management undoes it, MESH_NO_MANAGEMENT=1 skips it"
	timeout 60 "${SUDO[@]}" rabbitmq-plugins enable rabbitmq_management >&2 ||
		log "could not enable rabbitmq_management; meshctl topology check will report bindings UNCHECKED"
}

# Fast path: the port answers and the node says it has booted.
if port_open; then
	if ! installed || [[ $CAN_ADMIN -eq 0 ]]; then
		log "a broker answers on ${HOST}:${PORT}"
		exit 0
	fi
	if ctl await_startup --timeout 10; then
		ensure_management
		log "RabbitMQ is running on ${HOST}:${PORT}"
		exit 0
	fi
	if ! node_up; then
		log "a broker answers on ${HOST}:${PORT} (not the local rabbitmq-server node)"
		exit 0
	fi
	log "port ${PORT} answers but the node has not finished booting; checking"
fi

[[ $CAN_ADMIN -eq 1 ]] || die "$HINT"

if ! installed; then
	log "rabbitmq-server is not installed; installing it with apt-get"
	command -v apt-get >/dev/null 2>&1 || die "$HINT"
	"${SUDO[@]}" apt-get update >&2
	"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y rabbitmq-server >&2
	installed || die "rabbitmq-server still missing after apt-get install; $HINT"
fi

if ! node_up; then
	log "RabbitMQ node is not running; starting it (rabbitmq-server -detached)"
	"${SUDO[@]}" rabbitmq-server -detached >&2 || die "rabbitmq-server -detached failed; $HINT"
elif ! diag check_running; then
	log "RabbitMQ node is up but its app is stopped; running rabbitmqctl start_app"
	# A node still booting may refuse start_app; the wait below covers that.
	ctl start_app || log "rabbitmqctl start_app did not succeed yet; waiting"
fi

log "waiting up to ${WAIT_SECS}s for RabbitMQ on ${HOST}:${PORT}"
deadline=$((SECONDS + WAIT_SECS))
while :; do
	if ctl await_startup --timeout 5 && port_open; then
		ensure_management
		log "RabbitMQ is running on ${HOST}:${PORT}"
		exit 0
	fi
	if ((SECONDS >= deadline)); then
		die "RabbitMQ did not come up within ${WAIT_SECS}s (see /var/log/rabbitmq/); $HINT"
	fi
	sleep 1
done
