#!/bin/sh
# Before the files are removed (deb: remove, or upgrade; rpm: %preun, 0 on
# erase, 1 on upgrade): on removal, stop and disable meshd (it drains
# first). An upgrade leaves it running; postinstall restarts it.
set -e
case "$1" in
remove | 0)
	if [ -d /run/systemd/system ]; then
		systemctl disable --now meshd.service >/dev/null 2>&1 || true
	fi
	;;
esac
exit 0
