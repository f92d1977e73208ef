#!/bin/sh
# Leaves behind a process in a session of its own that, until it is
# killed, keeps starting more, each in a new session and orphaned at once;
# then hangs.
setsid sh -c 'while :; do setsid sh -c "sleep 300 &"; done' >/dev/null 2>&1 &
exec sleep 300
