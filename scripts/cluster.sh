#!/usr/bin/env bash
# A local three-node RabbitMQ cluster, to try mesh against a cluster on one
# machine (a laptop, CI), beside the default broker on 5672, which it leaves
# alone. MESH_CLUSTER_SIZE=1 makes a single private node instead: the fault
# tests stop, restart and alarm one of their own, never the user's broker.
#
#   scripts/cluster.sh up       start the three nodes and join them (idempotent)
#   scripts/cluster.sh status   print each node's state and the cluster's members
#   scripts/cluster.sh urls     print the AMQP URLs, comma-separated (for MESH_AMQP_URLS)
#   scripts/cluster.sh down     stop the nodes and delete their data
#
# The nodes are mesh-c1@localhost, mesh-c2@localhost and mesh-c3@localhost
# (MESH_CLUSTER_NAME, default mesh-c, is the part before the number: a
# second cluster, as the soak's, has a name, ports and a dir of its own).
# Node i listens for AMQP on 127.0.0.1:(MESH_CLUSTER_PORT + i - 1) (default
# 5701 to 5703), for the management API on that port + 10000 (15701...),
# and for Erlang distribution on that port + 20000 (RabbitMQ's default).
# Each has its own config, data and logs under MESH_CLUSTER_DIR (default
# /var/lib/rabbitmq/mesh-cluster) and shares the rabbitmq user's Erlang
# cookie, as cluster members must. Each Erlang VM runs without scheduler
# busy-waiting, so four brokers share a small machine.
#
# Needs Debian's rabbitmq-server (scripts/ensure-rabbitmq.sh installs it) and
# root, the rabbitmq user, or sudo.
set -euo pipefail

export PATH="$PATH:/usr/sbin:/sbin"

PREFIX="${MESH_CLUSTER_NAME:-mesh-c}"
BASE_PORT="${MESH_CLUSTER_PORT:-5701}"
DIR="${MESH_CLUSTER_DIR:-/var/lib/rabbitmq/mesh-cluster}"
SIZE="${MESH_CLUSTER_SIZE:-3}"
[[ "$SIZE" =~ ^[1-9]$ ]] || { echo "cluster: MESH_CLUSTER_SIZE must be 1 to 9, not $SIZE" >&2; exit 1; }
mapfile -t NODES < <(seq 1 "$SIZE")
BIN=/usr/lib/rabbitmq/bin

log() { echo "cluster: $*" >&2; }
die() { echo "cluster: $*" >&2; exit 1; }

name() { echo "$PREFIX$1@localhost"; }
port() { echo $((BASE_PORT + $1 - 1)); }

# as_rabbitmq runs a command as the rabbitmq user, whose home holds the Erlang
# cookie every node of the cluster (and rabbitmqctl) must share.
as_rabbitmq() {
	if [[ "$(id -un)" == rabbitmq ]]; then
		"$@"
	elif [[ "$(id -u)" -eq 0 ]]; then
		su rabbitmq -s /bin/sh -c "cd /var/lib/rabbitmq && $(printf '%q ' "$@")"
	else
		sudo -u rabbitmq -H sh -c "cd /var/lib/rabbitmq && $(printf '%q ' "$@")"
	fi
}

ctl() { as_rabbitmq timeout 60 "$BIN/rabbitmqctl" -q -n "$(name "$1")" "${@:2}"; }
node_up() { ctl "$1" ping >/dev/null 2>&1; }
port_open() { timeout 1 bash -c "</dev/tcp/127.0.0.1/$(port "$1")" 2>/dev/null; }

# configure writes node i's environment and config files.
configure() {
	local i=$1 d="$DIR/c$1"
	as_rabbitmq mkdir -p "$d/mnesia" "$d/log"
	as_rabbitmq sh -c "cat > '$d/rabbitmq-env.conf'" <<EOF
NODENAME=$(name "$i")
NODE_IP_ADDRESS=127.0.0.1
NODE_PORT=$(port "$i")
DIST_PORT=$(($(port "$i") + 20000))
ERL_EPMD_ADDRESS=127.0.0.1
export ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}"
CONFIG_FILE=$d/rabbitmq.conf
MNESIA_BASE=$d/mnesia
LOG_BASE=$d/log
ENABLED_PLUGINS_FILE=$d/enabled_plugins
PID_FILE=$d/pid
SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none"
EOF
	as_rabbitmq sh -c "cat > '$d/rabbitmq.conf'" <<EOF
listeners.tcp.local = 127.0.0.1:$(port "$i")
management.tcp.ip = 127.0.0.1
management.tcp.port = $(($(port "$i") + 10000))
vm_memory_high_watermark.relative = 0.2
cluster_partition_handling = pause_minority
EOF
	as_rabbitmq sh -c "echo '[rabbitmq_management].' > '$d/enabled_plugins'"
}

start_node() {
	local i=$1
	if node_up "$i"; then
		ctl "$i" start_app >/dev/null 2>&1 || true
		return
	fi
	configure "$i"
	log "starting $(name "$i") on 127.0.0.1:$(port "$i")"
	as_rabbitmq env RABBITMQ_CONF_ENV_FILE="$DIR/c$i/rabbitmq-env.conf" "$BIN/rabbitmq-server" -detached
}

await_node() {
	local i=$1
	for _ in $(seq 1 120); do
		if node_up "$i" && ctl "$i" await_startup >/dev/null 2>&1 && port_open "$i"; then
			return
		fi
		sleep 1
	done
	die "$(name "$i") did not start; its logs are in $DIR/c$i/log"
}

members() { ctl 1 eval 'length(rabbit_nodes:all_running()).' 2>/dev/null || echo 0; }

up() {
	[[ -x "$BIN/rabbitmq-server" ]] || die "rabbitmq-server is not installed: run scripts/ensure-rabbitmq.sh first"
	for i in "${NODES[@]}"; do start_node "$i"; done
	for i in "${NODES[@]}"; do await_node "$i"; done
	for i in "${NODES[@]:1}"; do
		if ctl "$i" cluster_status 2>/dev/null | grep -q "$(name 1)"; then
			continue
		fi
		log "joining $(name "$i") to $(name 1)"
		ctl "$i" stop_app
		ctl "$i" join_cluster "$(name 1)"
		ctl "$i" start_app
		await_node "$i"
	done
	local n
	n=$(members)
	[[ "$n" == "${#NODES[@]}" ]] || die "the cluster has $n running nodes, want ${#NODES[@]}"
	log "up: ${#NODES[@]} node(s) running; MESH_AMQP_URLS=$(urls)"
}

status() {
	for i in "${NODES[@]}"; do
		if node_up "$i"; then
			echo "$(name "$i")  amqp 127.0.0.1:$(port "$i")  running"
		else
			echo "$(name "$i")  amqp 127.0.0.1:$(port "$i")  down"
		fi
	done
	echo "running members: $(members)"
}

urls() {
	local out=()
	for i in "${NODES[@]}"; do out+=("amqp://guest:guest@127.0.0.1:$(port "$i")/"); done
	(IFS=,; echo "${out[*]}")
}

down() {
	for i in "${NODES[@]}"; do
		if node_up "$i"; then
			log "stopping $(name "$i")"
			ctl "$i" stop || true
		fi
	done
	if [[ -d "$DIR" ]]; then
		as_rabbitmq rm -rf "$DIR"
	fi
	log "down: nodes stopped, $DIR removed"
}

case "${1:-}" in
	up) up ;;
	status) status ;;
	urls) urls ;;
	down) down ;;
	*) die "usage: scripts/cluster.sh up|status|urls|down" ;;
esac
