#!/bin/sh
# Starts a process out of its process group and session (setsid), whose
# parent exits at once (a double fork, as a daemon does), writes its pid
# to $PIDFILE and answers; with $HANG set it hangs instead.
pid=$(setsid sh -c 'sleep 300 >/dev/null & echo $!')
echo "$pid" > "$PIDFILE"
if [ -n "$HANG" ]; then
	exec sleep 300
fi
echo '{"done":true}'
