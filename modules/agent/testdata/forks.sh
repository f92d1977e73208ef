#!/bin/sh
# Starts four processes at once and waits for them.
sleep 1 & sleep 1 & sleep 1 & sleep 1 &
wait
echo '{"done":true}'
