#!/usr/bin/env bash
# Proves make test leaves the user's broker as it found it: `mark FILE`
# records the local default RabbitMQ node's fingerprint (its OS process,
# its rabbit application's supervisor, which a stop_app/start_app or a
# restart replaces, and its memory watermark, which an alarm test changes);
# `check FILE` fails, naming what changed, if it is not the same. The tests
# that stop, restart or alarm a broker use private nodes of their own
# (scripts/cluster.sh), so this never fails unless one of them strays.
#
# A broker configured elsewhere (MESH_AMQP_URL on another host) or one this
# user cannot inspect is not checked, and the script says so.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

fingerprint() {
	timeout 60 rabbitmqctl -q eval 'lists:flatten(io_lib:format("pid=~s rabbit_sup=~s watermark=~p", [os:getpid(), pid_to_list(whereis(rabbit_sup)), vm_memory_monitor:get_vm_memory_high_watermark()])).' 2>/dev/null
}

case "${1:-}:${2:-}" in
mark:?*)
	if fp=$(fingerprint); then
		echo "$fp" >"$2"
		echo "broker-untouched: the shared broker is $fp"
	else
		: >"$2"
		echo "broker-untouched: cannot inspect the local broker with rabbitmqctl; not checking it"
	fi
	;;
check:?*)
	was=$(cat "$2" 2>/dev/null || true)
	if [[ -z "$was" ]]; then
		echo "broker-untouched: nothing marked; not checking"
		exit 0
	fi
	now=$(fingerprint || echo "unreachable")
	if [[ "$now" != "$was" ]]; then
		echo "broker-untouched: make test changed the shared broker: it was $was, it is $now" >&2
		exit 1
	fi
	echo "broker-untouched: the shared broker was left as it was ($now)"
	;;
*)
	echo "usage: scripts/broker-untouched.sh mark|check FILE" >&2
	exit 2
	;;
esac
