#!/bin/sh
# Counts the runs going at once (itself included), records the count, says
# it started on the FIFO $DIR/started, and holds until the test releases
# it with a line on the FIFO $DIR/release.
touch "$DIR/run.$$"
ls "$DIR" | grep -c '^run\.' >> "$DIR/seen"
echo started >> "$DIR/started"
read -r go < "$DIR/release"
rm -f "$DIR/run.$$"
echo '{"ok":true}'
