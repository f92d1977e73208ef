#!/bin/sh
# The tool invoice.issue, served by the agent: it reads the request and its
# metadata (one JSON line) on stdin and answers with an invoice on stdout.
# Any language would do; exit 65 would reject the order for good.
read -r request
echo "issuing an invoice for request $(echo "$request" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')" >&2
printf '{"invoice":"INV-%s","for":%s}\n' "$(date +%s%N)" "$request"
