#!/bin/sh
# Answers at once but leaves a background process behind in its group.
sleep 300 &
echo $! > "$PIDFILE"
echo '{"done":true}'
