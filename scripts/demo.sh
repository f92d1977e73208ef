#!/usr/bin/env bash
# make demo: a local broker, meshd running the example modules as module
# processes (examples/mesh.yaml), and meshctl tail showing what travels on
# the mesh, then meshctl call invoking a tool.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
scripts/ensure-rabbitmq.sh
go build -o bin/ ./cmd/meshd ./cmd/meshctl
go build -o bin/modules/ ./examples/modules/...
go build -o bin/modules/audit-logger ./auditlogger/cmd/audit-logger
seconds="${DEMO_SECONDS:-6}"
echo "== meshd runs umami, notifier, billing, tax and the audit logger as module processes for ${seconds}s; meshctl tail 'module.#' shows the events =="
bin/meshctl tail 'module.#' &
tail_pid=$!
bin/meshd run --config examples/mesh.yaml --log-level warn &
meshd_pid=$!
trap 'kill "$tail_pid" "$meshd_pid" 2>/dev/null || true' EXIT
sleep "$seconds"
echo "== meshctl call invoice.create (served by the billing module process, which calls tax.rate) =="
bin/meshctl call invoice.create '{"site":"demo.example","cents":1000}'
echo "== meshctl audit trace: the audit logger's record of a site umami created, and what it caused =="
site=$(bin/meshctl audit query --json --limit 1 --type 'module.umami.site.created' | sed -n 's/.*"id":"\([0-9A-Z]*\)".*/\1/p' | head -n 1)
if [ -n "$site" ]; then bin/meshctl audit trace "$site"; else echo "(no site event in the audit log yet)"; fi
echo "== meshctl audit replay --dry-run: what a replay of umami's events would send again, up to now =="
bin/meshctl audit replay --dry-run --type 'module.umami.#'
kill -TERM "$meshd_pid"
wait "$meshd_pid" && echo "== meshd stopped cleanly (exit 0) on SIGTERM ==" || echo "== meshd exited with status $? =="
sleep 0.5
kill "$tail_pid" 2>/dev/null || true
wait "$tail_pid" 2>/dev/null || true
echo "== done. Try: bin/meshctl tail --json '#'   and in another shell: bin/meshctl emit mesh.demo.hello '{\"hi\":1}' =="
