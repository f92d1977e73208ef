#!/usr/bin/env bash
# together.sh NAME COMMAND [NAME COMMAND ...]: runs each COMMAND (a line
# for bash) at once, each with its output to a file of its own, then
# prints each output in the order given, under its NAME, with how long it
# took, and fails if any failed. make test runs the test suites on
# brokers of their own (the fault node, the failover cluster) so: neither
# touches the other's broker, and the two together take as long as the
# longer, not the sum.
set -uo pipefail
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
names=()
pids=()
i=0
while [ $# -ge 2 ]; do
  names+=("$1")
  ( start=$(date +%s); bash -c "$2"; rc=$?; echo "$rc $(( $(date +%s) - start ))" > "$dir/$i.rc" ) > "$dir/$i.out" 2>&1 &
  pids+=($!)
  i=$((i + 1))
  shift 2
done
failed=0
for i in "${!names[@]}"; do
  wait "${pids[$i]}" || true
done
for i in "${!names[@]}"; do
  read -r rc secs < "$dir/$i.rc" || { rc=1; secs=?; }
  echo "== ${names[$i]}: exit $rc after ${secs}s =="
  cat "$dir/$i.out"
  [ "$rc" = 0 ] || failed=1
done
exit "$failed"
