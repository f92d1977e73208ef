#!/usr/bin/env bash
# Makes sure Debian's PostgreSQL server binaries (initdb, pg_ctl) are
# installed for the tests that run a database of their own
# (internal/pgtest: a cluster in a temporary directory, on a private port
# and socket, started and removed by each test), installing the
# postgresql package with apt-get when they are missing (needs root or
# sudo). It makes no cluster and starts no server: the package's own
# cluster is not created (createcluster.conf), so nothing listens on 5432.
# Idempotent; fast when they are there.
#
# Environment:
#   MESH_PG_BIN  a directory holding initdb and pg_ctl to use instead.
set -euo pipefail

log() { echo "ensure-postgres: $*" >&2; }

if [[ -n "${MESH_PG_BIN:-}" ]]; then
	[[ -x "$MESH_PG_BIN/initdb" && -x "$MESH_PG_BIN/pg_ctl" ]] || { log "MESH_PG_BIN=$MESH_PG_BIN holds no initdb and pg_ctl"; exit 1; }
	exit 0
fi
found() { compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; }
if found; then
	log "$(ls -d /usr/lib/postgresql/*/bin | tail -1) is installed"
	exit 0
fi
SUDO=()
if [[ "$(id -u)" -ne 0 ]]; then
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		SUDO=(sudo)
	else
		log "PostgreSQL is missing and this user cannot install it: run \`sudo apt-get install postgresql\` (the database tests need it)"
		exit 1
	fi
fi
command -v apt-get >/dev/null 2>&1 || { log "PostgreSQL is missing and there is no apt-get: install it and set MESH_PG_BIN"; exit 1; }
log "installing Debian's postgresql with apt-get, without its default cluster"
"${SUDO[@]}" mkdir -p /etc/postgresql-common
if [[ ! -e /etc/postgresql-common/createcluster.conf ]]; then
	echo "create_main_cluster = false" | "${SUDO[@]}" tee /etc/postgresql-common/createcluster.conf >/dev/null
fi
"${SUDO[@]}" apt-get update >&2
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql >&2
found || { log "initdb still missing after apt-get install"; exit 1; }
log "$(ls -d /usr/lib/postgresql/*/bin | tail -1) installed"
