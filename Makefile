# mesh — run `make` or `make help` to list targets.

export PATH := $(PATH):/usr/local/go/bin

GO     ?= go
ENSURE := scripts/ensure-rabbitmq.sh
BROWSER := scripts/ensure-chromium.sh
POSTGRES := scripts/ensure-postgres.sh
PACKAGING := scripts/ensure-packaging.sh

# Every binary says which release and commit it is (meshd version): VERSION, and the commit (which
# wins over the go command's stamp, and stands in where it stamps none: -buildvcs=false, a git worktree).
VERSION_PKG := github.com/meshkit/mesh/internal/version
COMMIT  := $(shell git rev-parse --short=12 HEAD 2>/dev/null)$(shell git diff --quiet HEAD -- 2>/dev/null || echo +dirty)
LDFLAGS := -X $(VERSION_PKG).release=$(shell cat VERSION) -X $(VERSION_PKG).commit=$(COMMIT)
BUILD   := $(GO) build -ldflags "$(LDFLAGS)"

# The packages whose tests take longest, named first so that go test starts
# them first: the rest then fill the other core, rather than these running
# alone at the end (go test ./... starts packages in the order named).
LONGEST_FIRST := ./runtime ./cmd/meshctl ./test/conformance ./test/docs ./cmd/meshd ./cmd/meshctl/console ./test/hostile ./internal/deadletters

.DEFAULT_GOAL := help
.PHONY: help build test soak bench demo demo-live screenshots lint fuzz generate clean release

help: ## List targets with their descriptions
	@grep -E '^[a-zA-Z_-]+:.*?## .*$$' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}'

# go list -export compiles every package and fails on any error, as go build ./... does, but
# links no command: a build with nothing changed takes seconds, not half a minute (the doc
# check, test/docs, runs make build in each guide).
build: ## Build all packages, the binaries bin/meshd and bin/meshctl, the shipped module binaries bin/modules/audit-logger, agent and dispatcher, the example modules (bin/modules/umami, notifier, billing, tax, ledger) and bin/ordersource
	$(GO) list -export ./... >/dev/null
	$(BUILD) -o bin/meshd ./cmd/meshd
	$(BUILD) -o bin/meshctl ./cmd/meshctl
	$(BUILD) -o bin/modules/audit-logger ./auditlogger/cmd/audit-logger
	$(BUILD) -o bin/modules/agent ./modules/agent/cmd/agent
	$(BUILD) -o bin/modules/dispatcher ./modules/dispatcher/cmd/dispatcher
	$(BUILD) -o bin/modules/ ./examples/modules/...
	$(BUILD) -o bin/ordersource ./examples/ordersource

test: ## Run the whole test suite (race detector, about 35 min on 2 cores) against a local RabbitMQ (each test in a virtual host of its own, deleted after) and, for the console, Debian's headless Chromium, and PostgreSQL's server binaries for the database tests, and rpm to read the release's .rpm (all installed where missing), then the fault tests on a private broker node and the failover tests on a private three-node cluster, one after the other, beside a two-minute soak on another cluster and then the release test (test/release) and the as-shipped suite (test/shipped); it checks the shared broker was never stopped or changed
	$(ENSURE)
	$(BROWSER)
	$(POSTGRES)
	$(PACKAGING)
	@mkdir -p bin && scripts/broker-untouched.sh mark bin/.shared-broker
	$(GO) test -race -count=1 -timeout 20m $(LONGEST_FIRST) ./...
	@echo "on brokers of their own, at once: the fault tests, then the failover tests; and the soak (each prints when both are done):"
	scripts/together.sh \
		"fault tests (they stop, cut and alarm a broker: a private node on 127.0.0.1:5711, made and removed by them), then failover tests (on a local three-node cluster, scripts/cluster.sh, made and removed by them)" \
		"$(GO) test -race -count=1 -p 1 -v -timeout 20m -tags fault ./test/fault && $(GO) test -race -count=1 -p 1 -v -timeout 20m -tags failover ./test/fault" \
		"soak (a minute of faults on a seed of its own and on a random one, on a cluster of its own; then the order checker: an ordered group of three meshd under SIGKILLs, a node joining and one leaving, its partition count changed live 16 -> 32 -> 16, 10,000 keys x 20 events; make soak runs longer), then the release test (make release twice, compared; as root, the .deb installed, run, upgraded and purged on this machine), then the as-shipped suite (test/shipped: the release's own binaries, run as users run them)" \
		"SOAK=1m SOAK_SEEDS=24,random $(GO) test -race -count=1 -v -timeout 30m -tags soak -run TestSoak ./test/soak && rm -rf bin/release && mkdir -p bin/release && RELEASE_KEEP_DIST=$(CURDIR)/bin/release $(GO) test -count=1 -v -timeout 15m -tags release ./test/release && SHIPPED_DIST=$(CURDIR)/bin/release $(GO) test -count=1 -v -timeout 15m -tags shipped ./test/shipped"
	@scripts/broker-untouched.sh check bin/.shared-broker

soak: ## Run the nemesis soak (test/soak): SOAK=10m of seeded faults on three nodes and a three-node cluster, then a checker over the history; then the order checker (TestSoakOrder: ORDER_KEYS=10000 keys x ORDER_EVENTS=20 through an ordered group under faults, its partition count changed live twice); SOAK_SEEDS=S1,S2 repeats schedules
	$(ENSURE)
	$(GO) test -count=1 -v -tags soak -timeout 0 -run TestSoak ./test/soak

release: ## Build the release of this commit into dist/ (RELEASE_DIR): for linux/amd64 and linux/arm64 (RELEASE_ARCHS), an archive of meshd, meshctl, the shipped modules, the docs, a sample config and the systemd unit, its CycloneDX SBOM, a .deb and an .rpm (nfpm; tools pinned in tools/go.mod), and SHA256SUMS; reproducible: two builds of one commit are the same bytes (docs/adr/0047-packages-and-the-hardened-unit.md)
	scripts/release.sh $(or $(RELEASE_DIR),dist)

bench: ## Run throughput/latency benchmarks beside a raw amqp091-go baseline
	$(ENSURE)
	$(GO) run ./cmd/meshbench

demo: ## Run meshd with the example modules as module processes for a few seconds (DEMO_SECONDS, default 6), shown live by meshctl tail, then call a tool, trace and draw the mesh; MESH_AMQP_URL picks the broker and virtual host
	scripts/demo.sh

demo-live: ## Run the demo, then keep its mesh running with the web console on http://127.0.0.1:8080/ (DEMO_CONSOLE_ADDR) until Ctrl-C
	DEMO_LIVE=1 scripts/demo.sh

screenshots: ## Take the console guide's pictures (docs/images/console-*.png): the demo mesh in a virtual host of its own, fed, and meshctl console on it in headless Chromium
	scripts/screenshots.sh

lint: ## Fail on unformatted files (gofmt -l), on packages and exported names without a doc comment (cmd/doclint), then go vet, then on an incompatible change to the sdk's exported API since the previous release (apidiff, cmd/apicheck) that no bullet of the release in progress's Breaking section in CHANGELOG.md names in backquotes as package.Name (`sdk.ErrRefused`, `process.Run`, a method `meshtest.Mesh.On`, a field `sdk.Config.Timeout`)
	@files="$$(gofmt -l .)"; \
	if [ -n "$$files" ]; then echo "gofmt needed on:"; echo "$$files"; exit 1; fi
	$(GO) run ./cmd/doclint .
	$(GO) vet ./...
	$(GO) run ./cmd/apicheck

fuzz: ## Fuzz event-type validation, subscription filters, emit naming and bodies, header decoding, topic matching, event keys and slots, the dedup log, dead-letter headers (as meshctl and a DeadLetters handler read them), replay targets, meshctl's terminal escaping, caller patterns, permission patterns, coalesced acks, the console's login redirect, audit filter and tokens file, the CloudEvents reader, body schemas (and the bounds on what checking a body may cost) and their compatibility checker, event digests, the dedup digest file, outbox rows' options, the shape of mesh.yaml, the audit chain's hash and checkpoints, 20s each
	$(GO) test -run='^$$' -fuzz=FuzzValidateEventType -fuzztime=20s ./internal/wire
	$(GO) test -run='^$$' -fuzz=FuzzDecodeMeta -fuzztime=20s ./internal/wire
	$(GO) test -run='^$$' -fuzz=FuzzMatchPattern -fuzztime=20s ./internal/wire
	$(GO) test -run='^$$' -fuzz=FuzzCheckKey -fuzztime=20s ./internal/wire
	$(GO) test -run='^$$' -fuzz=FuzzOrderKeyOf -fuzztime=20s ./runtime
	$(GO) test -run='^$$' -fuzz=FuzzValidateSubscription -fuzztime=20s ./internal/wire
	$(GO) test -run='^$$' -fuzz=FuzzFilter -fuzztime=20s ./internal/filter
	$(GO) test -run='^$$' -fuzz=FuzzValidateToolKey -fuzztime=20s ./internal/wire
	$(GO) test -run='^$$' -fuzz=FuzzEmitType -fuzztime=20s ./internal/wire
	$(GO) test -run='^$$' -fuzz=FuzzEncodeBody -fuzztime=20s ./internal/wire
	$(GO) test -run='^$$' -fuzz=FuzzOpenLog -fuzztime=20s -fuzzminimizetime=100x ./internal/dedup
	$(GO) test -run='^$$' -fuzz=FuzzMessageOf -fuzztime=20s ./internal/deadletters
	$(GO) test -run='^$$' -fuzz=FuzzSplitModuleQueue -fuzztime=20s ./internal/deadletters
	$(GO) test -run='^$$' -fuzz=FuzzMatchTopic -fuzztime=20s ./auditlogger/store
	$(GO) test -run='^$$' -fuzz=FuzzChainHash -fuzztime=20s ./auditlogger/store
	$(GO) test -run='^$$' -fuzz=FuzzCheckpoint -fuzztime=20s ./auditlogger
	$(GO) test -run='^$$' -fuzz=FuzzDeadEventOf -fuzztime=20s ./runtime
	$(GO) test -run='^$$' -fuzz=FuzzAcker -fuzztime=20s ./runtime
	$(GO) test -run='^$$' -fuzz=FuzzCallerPattern -fuzztime=20s ./runtime
	$(GO) test -run='^$$' -fuzz=FuzzReplayTarget -fuzztime=20s ./cmd/meshctl
	$(GO) test -run='^$$' -fuzz=FuzzEscapeText -fuzztime=20s ./cmd/meshctl
	$(GO) test -run='^$$' -fuzz=FuzzEscapeJSON -fuzztime=20s ./cmd/meshctl
	$(GO) test -run='^$$' -fuzz=FuzzPatternRegexp -fuzztime=20s ./runtime/nodeconfig
	$(GO) test -run='^$$' -fuzz=FuzzLoadShape -fuzztime=20s ./runtime/nodeconfig
	$(GO) test -run='^$$' -fuzz=FuzzRead -fuzztime=20s ./internal/cloudevents
	$(GO) test -run='^$$' -fuzz=FuzzSafeNext -fuzztime=20s ./cmd/meshctl/console
	$(GO) test -run='^$$' -fuzz=FuzzAuditFilterOf -fuzztime=20s ./cmd/meshctl/console
	$(GO) test -run='^$$' -fuzz=FuzzParseTokens -fuzztime=20s ./cmd/meshctl/console
	$(GO) test -run='^$$' -fuzz=FuzzValidate -fuzztime=20s ./internal/schema
	$(GO) test -run='^$$' -fuzz=FuzzCompileAndValidate -fuzztime=20s ./internal/schema
	$(GO) test -run='^$$' -fuzz=FuzzCanRead -fuzztime=20s ./internal/schema
	$(GO) test -run='^$$' -fuzz=FuzzFile -fuzztime=20s ./sdk/schema
	$(GO) test -run='^$$' -fuzz=FuzzDigest -fuzztime=20s ./internal/wire
	$(GO) test -run='^$$' -fuzz=FuzzOpenDigests -fuzztime=20s ./internal/dedup
	$(GO) test -run='^$$' -fuzz=FuzzDecodeOptions -fuzztime=20s ./internal/outboxstore

generate: ## Regenerate the plugin protocol's Go code from internal/plugin/pb/module.proto (needs protoc)
	@command -v protoc >/dev/null || { echo "generate needs protoc: apt-get install protobuf-compiler"; exit 1; }
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
	cd internal/plugin/pb && PATH="$$PATH:$$($(GO) env GOPATH)/bin" protoc \
		--go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative module.proto

clean: ## Remove built binaries and release artifacts (dist)
	rm -rf bin dist
