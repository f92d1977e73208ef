#!/bin/sh
# After the files are removed (deb: remove, purge, upgrade, ...; rpm:
# %postun, 0 on erase). Purge (deb only) deletes what the package's node
# made and kept: the state dir (spool, records, modules' databases), the
# config directory and the mesh user and group. Idempotent.
set -e
case "$1" in
purge)
	rm -rf /var/lib/mesh /etc/mesh
	if getent passwd mesh >/dev/null; then userdel mesh >/dev/null 2>&1 || true; fi
	if getent group mesh >/dev/null; then groupdel mesh >/dev/null 2>&1 || true; fi
	;;
esac
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
