#!/bin/sh
# Spins on the CPU.
while :; do :; done
