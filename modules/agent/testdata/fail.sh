#!/bin/sh
echo "database unreachable" >&2
exit 3
