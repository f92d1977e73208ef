#!/bin/sh
# Holds 100 MB in memory.
x=$(head -c 100000000 /dev/zero | tr '\0' a)
echo "{\"bytes\":${#x}}"
