#!/usr/bin/env bash
# make demo: a local broker, a node running the example modules in-process,
# and meshctl tail showing what travels on the mesh.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
scripts/ensure-rabbitmq.sh
go build -o bin/ ./cmd/meshctl ./cmd/meshdemo
seconds="${DEMO_SECONDS:-6}"
echo "== meshctl tail 'module.#' beside a node running umami and notifier for ${seconds}s =="
bin/meshctl tail 'module.#' &
tail_pid=$!
trap 'kill "$tail_pid" 2>/dev/null || true' EXIT
sleep 1 # let tail bind its queue before the first event
bin/meshdemo --duration "${seconds}s" --interval 1s
sleep 0.5
kill "$tail_pid" 2>/dev/null || true
wait "$tail_pid" 2>/dev/null || true
echo "== done. Try: bin/meshctl tail --json '#'   and in another shell: bin/meshctl emit mesh.demo.hello '{\"hi\":1}' =="
