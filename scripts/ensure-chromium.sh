#!/usr/bin/env bash
# Makes sure Debian's Chromium is installed for the console's browser tests
# (cmd/meshctl's TestConsole*, make screenshots), installing the chromium
# package with apt-get when it is missing (needs root or sudo).
# Idempotent; fast when it is there.
#
# Environment:
#   MESH_CHROMIUM  a Chromium binary to use instead (then nothing is installed).
set -euo pipefail

log() { echo "ensure-chromium: $*" >&2; }

if [[ -n "${MESH_CHROMIUM:-}" ]]; then
	[[ -x "$MESH_CHROMIUM" ]] || { log "MESH_CHROMIUM=$MESH_CHROMIUM is not an executable"; exit 1; }
	exit 0
fi
for b in chromium chromium-browser; do
	if command -v "$b" >/dev/null 2>&1; then
		log "$(command -v "$b") is installed"
		exit 0
	fi
done
SUDO=()
if [[ "$(id -u)" -ne 0 ]]; then
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		SUDO=(sudo)
	else
		log "chromium is missing and this user cannot install it: run \`sudo apt-get install chromium\` (the console's browser tests need it)"
		exit 1
	fi
fi
command -v apt-get >/dev/null 2>&1 || { log "chromium is missing and there is no apt-get: install Chromium and set MESH_CHROMIUM"; exit 1; }
log "installing Debian's chromium with apt-get"
"${SUDO[@]}" apt-get update >&2
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >&2
command -v chromium >/dev/null 2>&1 || { log "chromium still missing after apt-get install"; exit 1; }
log "$(chromium --version 2>/dev/null || echo chromium) installed"
