#!/bin/sh
# Leaves a grandchild in its process group, writes its pid, and hangs.
sleep 300 &
echo $! > "$PIDFILE"
sleep 300
