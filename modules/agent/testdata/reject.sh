#!/bin/sh
echo "order 7 has no customer" >&2
exit 65
