#!/bin/sh
echo "hello, not json"
