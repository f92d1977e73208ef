#!/bin/sh
# Before the files are unpacked (deb: install or upgrade; rpm: %pre): the
# mesh system group and user, whose files the package holds. Idempotent:
# an existing group or user is kept as it is.
set -e
if ! getent group mesh >/dev/null; then
	groupadd --system mesh
fi
if ! getent passwd mesh >/dev/null; then
	useradd --system --gid mesh --home-dir /var/lib/mesh --no-create-home \
		--shell /usr/sbin/nologin --comment "mesh node (meshd)" mesh
fi
exit 0
