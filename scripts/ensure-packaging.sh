#!/usr/bin/env bash
# Makes sure the tools the release test (test/release) reads packages with
# are installed: dpkg-deb and systemd-analyze (Debian has them), and rpm,
# to read the .rpm that make release makes; installs Debian's rpm package
# with apt-get when it is missing (needs root or sudo). Where it cannot,
# it says so and succeeds: the test then reads the .deb alone and says it
# did not read the .rpm. Idempotent; fast when they are there.
set -euo pipefail

log() { echo "ensure-packaging: $*" >&2; }

if command -v rpm >/dev/null 2>&1; then
	exit 0
fi
SUDO=()
if [[ "$(id -u)" -ne 0 ]]; then
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		SUDO=(sudo)
	else
		log "rpm is missing and this user cannot install it: the release test will not read the .rpm (sudo apt-get install rpm)"
		exit 0
	fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
	log "rpm is missing and there is no apt-get: the release test will not read the .rpm"
	exit 0
fi
log "installing Debian's rpm with apt-get (to read the .rpm make release makes)"
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends rpm >&2 ||
	{ "${SUDO[@]}" apt-get update >&2 && "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends rpm >&2; } ||
	log "apt-get could not install rpm: the release test will not read the .rpm"
exit 0
