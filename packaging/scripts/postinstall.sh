#!/bin/sh
# After the files are unpacked (deb: configure, with the version upgraded
# from, if any; rpm: %post, 1 on install, 2 on upgrade). The service is not
# enabled nor started on install: the node needs its broker and name in
# /etc/mesh first (docs/operator-guide.md). On upgrade a running meshd is
# restarted onto the new binary (it drains first). Idempotent.
set -e
upgrade=
case "$1" in
configure) [ -n "$2" ] && upgrade=1 ;;
2) upgrade=1 ;;
esac
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
	if [ -n "$upgrade" ]; then
		systemctl try-restart meshd.service >/dev/null 2>&1 || true
	fi
fi
exit 0
