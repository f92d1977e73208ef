//go:build shipped

package shipped

// The command table (issue 60, "The seam, closed"): every command line the
// README and docs/commands.md show that acts on a node, and the guides'
// lines of another shape (docs/where-did-my-event-go.md, docs/console.md,
// docs/operator-guide.md), run as a user runs it, against one node of the
// release. (test/docs runs the guides' runnable blocks whole, with the
// binaries of make build; this table runs their lines with the release's.)
//
// What the table covers. The release's meshd runs once (meshd run --config,
// as startNode runs it) with the three modules the release ships, each with
// a small entry: the audit logger (audit.*, every dead letter), the agent
// (serving invoice.create by a shell script, so the docs' own call line
// runs as written) and the dispatcher (a queue trigger on shop.orders that
// calls invoice.create), heartbeats every second so that the docs'
// --wait 3s lines hear the node. Each row is one command line: the text the
// doc shows (the test checks the file of the release's archive shows it),
// the line run, its placeholders ({node}, {config}, the ids of what earlier
// rows made) filled, and what it must show: its exit code, substrings of
// its output, a JSON field, a file it writes, or its effect on the wire as
// raw amqp091-go reads it (emit, emit --after/--at-most-once, dlq and
// unrouted replay and purge, module remove). The rows run in order as
// subtests, each with a bounded context of its own: meshd version, config
// check, config reference and run (its /healthz, /readyz and /metrics);
// meshctl version, emit (the README's, --schema 2 --node, --causation,
// --schema '', --after --via, --at --via, --at-most-once), tail (three
// lines, each read until the event it waits for, then stopped; --exclude
// checked against a heartbeat seen first), call (an object and a string
// body, and a call nobody serves: exit 1), a flag the command lacks (exit
// 2), nodes, graph (mermaid and dot), features, topology print, check and
// permissions (node and operator), queue migrate, dlq ls, show, purge
// --dry-run, replay (dry and real, into the module's queue) and purge (and
// purge without a filter: exit 2), unrouted ls, show, purge --dry-run,
// replay (dry and real, onto mesh.events) and purge, audit query (by type,
// --causation, --dead), count, get, trace, export (CSV and CloudEvents),
// stats, verify and replay --dry-run, delayed ls, count and cancel (and a
// cancel of an id the node does not hold: exit 1), dispatcher fires, pause
// and resume, schema ls, show, diff and check, console (with its one-time
// login URL; with a token file, read-only: a page served, a page without
// the token sent to log in, an action refused), console token add, list
// and revoke, module remove, new module, completion bash, zsh and fish.
//
// TestEveryCommandHasARow reads meshctl --help and meshd --help of the
// release (and each command's own --help, down the tree) and fails when a
// command has no row, so a new command cannot go untested; skipped lists
// the ones that cannot run here and why.
//
// What it cannot run here: meshd under systemd as PID 1 (the packaged
// unit's User, capabilities and sandbox). What stands in for it: meshd run
// --config as a subprocess, as root, so that each module runs as a user of
// its own confined by Landlock, as under the unit; test/release installs
// the .deb and reads the unit. `meshctl new module` runs, but its project's
// `make test`/`make run` are the scaffold's own case, not this table's.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/freeport"
	"github.com/meshkit/mesh/internal/testdir"
	"github.com/meshkit/mesh/internal/wire"
)

// skipped names the commands the table has no row for, each with why it
// cannot run here. Keep it short: a command that can run gets a row.
// (The CLI library's own "help" command, under every command, is not
// listed: it is not a command of mesh.) Empty today: every command runs.
var skipped = map[string]string{}

// cmdRow is one command line of the docs and what running it must show.
type cmdRow struct {
	// doc is the command line as from shows it (with the doc's own
	// placeholders: NODE, ID, examples/mesh.yaml).
	doc string
	// from is where doc is shown: README.md or docs/commands.md of the
	// release's archive (the test checks it is there), or "meshctl --help"
	// for a command only the help lists.
	from string
	// run is the line run, as a shell would split it, its {placeholders}
	// filled from the fixture; "" runs doc as it is.
	run string
	// code is the exit code it must end with.
	code int
	// want are substrings of its standard output ({placeholders} filled).
	want []string
	// wantErr are substrings of its standard error.
	wantErr []string
	// eventually reruns it (at most until the row's deadline) until want
	// and check are satisfied: for what the audit logger stores, or the
	// dispatcher records, a moment after it happened.
	eventually bool
	// before makes what the row acts on (raw amqp091-go), and may set
	// placeholders.
	before func(t *testing.T, f *fixture)
	// check looks further at its output, or at its effect on the wire; an
	// error makes an eventually row run again, and fails any other.
	check func(t *testing.T, f *fixture, out string) error
	// live is for a command that runs until stopped (tail, console): it
	// gets its output lines as they come and returns when it has seen
	// enough; the command is then stopped.
	live func(t *testing.T, f *fixture, out, errs <-chan string)
	// probe replaces running anything: the shared node is the row's
	// command (meshd run), and probe looks at it.
	probe func(t *testing.T, f *fixture)
	// skip, when set, is why the row is skipped (an issue 60 follow-up).
	skip string
}

// fixture is the shared node and what the rows made.
type fixture struct {
	url, dir string
	n        *node
	ch       *amqp.Channel // raw amqp091-go, confirms on
	tap      <-chan amqp.Delivery
	mu       sync.Mutex
	vars     map[string]string
}

func (f *fixture) set(k, v string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.vars[k] = v
}

func (f *fixture) get(k string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.vars[k]
}

// fill replaces each {name} of s with the fixture's value.
func (f *fixture) fill(s string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, v := range f.vars {
		s = strings.ReplaceAll(s, "{"+k+"}", v)
	}
	return s
}

// unfilled is a placeholder no row has set yet.
var unfilled = regexp.MustCompile(`\{[a-z0-9_]+\}`)

var ulidLine = regexp.MustCompile(`^[0-9A-HJKMNP-TV-Z]{26}\n$`)

// commandRows is the table. Rows run in order: later rows act on what
// earlier ones made ({event}, {delayed}, {dead}, ...).
func commandRows() []cmdRow {
	return []cmdRow{
		// meshd
		{doc: "`meshd version` prints the release, the commit and the module protocols", from: "docs/commands.md", run: "meshd version",
			want: []string{"release: v", "commit: ", "module protocols: "},
			check: func(t *testing.T, f *fixture, out string) error {
				if strings.Contains(out, "commit: unknown") {
					return fmt.Errorf("the release's meshd does not know its commit")
				}
				return nil
			}},
		{doc: "meshd config check [--config FILE]", from: "docs/commands.md", run: "meshd config check --config {config}",
			want: []string{"config ok: node {node}, 4 modules", "audit-logger", "agent", "dispatcher", "echo"}},
		{doc: "meshd config reference", from: "docs/commands.md",
			want: []string{"MESH_AMQP_URL", "`heartbeat_interval`", "`state_dir`"}},
		{doc: "meshd run [--config FILE]", from: "docs/commands.md", probe: probeNode},

		// meshctl emit, and its effect on the wire
		{doc: "meshctl version", from: "meshctl --help", want: []string{"release: v", "module protocols: "}},
		{doc: `bin/meshctl emit module.umami.site.created '{"id":1,"name":"blog"}'`, from: "README.md",
			before: tapEvents("module.umami.#"),
			check:  emitted("readme_event", func(d amqp.Delivery) error { return bodyIs(d, `{"id":1,"name":"blog"}`) })},
		{doc: `meshctl emit mesh.ops.deploy '{"version":"1.4.2"}' --schema 2 --node ops`, from: "docs/commands.md",
			before: tapEvents("mesh.ops.deploy"),
			check: emitted("event", func(d amqp.Delivery) error {
				if d.Headers[wire.HeaderSchema] != "2" || d.Headers[wire.HeaderNode] != "ops" || d.Headers[wire.HeaderSource] != "meshctl" {
					return fmt.Errorf("headers %v, want x-schema 2, x-node ops, x-source meshctl", d.Headers)
				}
				return nil
			})},
		{doc: "[--causation ID]", from: "docs/commands.md", run: `meshctl emit mesh.ops.done '{}' --schema '' --causation {event}`,
			before: tapEvents("mesh.ops.done"),
			check: emitted("caused", func(d amqp.Delivery) error {
				if d.Headers[wire.HeaderCausationID] == nil {
					return fmt.Errorf("--causation sent no %s: %v", wire.HeaderCausationID, d.Headers)
				}
				return nil
			})},
		{doc: "`--schema ''` sends none", from: "docs/commands.md", run: `meshctl emit mesh.ops.note '{"n":1}' --schema ''`,
			before: tapEvents("mesh.ops.note"),
			check: emitted("", func(d amqp.Delivery) error {
				if _, ok := d.Headers[wire.HeaderSchema]; ok {
					return fmt.Errorf("--schema '' sent x-schema %v", d.Headers[wire.HeaderSchema])
				}
				return nil
			})},
		{doc: "[--after D | --at TIME --via NODE]", from: "docs/commands.md", run: `meshctl emit --after 2s --via {node} mesh.ops.later '{"n":2}'`,
			before: tapEvents("mesh.ops.later"),
			check: emitted("", func(d amqp.Delivery) error {
				if d.Headers[wire.HeaderDue] == nil {
					return fmt.Errorf("the delivered event has no %s: %v", wire.HeaderDue, d.Headers)
				}
				return nil
			})},
		{doc: "`--at 2027-01-01T09:00:00Z`", from: "docs/commands.md", run: `meshctl emit --at {at} --via {node} mesh.ops.someday '{}'`,
			check: func(t *testing.T, f *fixture, out string) error {
				if !ulidLine.MatchString(out) {
					return fmt.Errorf("printed %q, want an id", out)
				}
				f.set("delayed", strings.TrimSpace(out))
				return nil
			}},
		{doc: "`--at-most-once` publishes it not persistent and unconfirmed", from: "docs/commands.md", run: `meshctl emit --at-most-once mesh.ops.gauge '{"v":3}' --schema ''`,
			before: tapEvents("mesh.ops.gauge"),
			check: emitted("", func(d amqp.Delivery) error {
				if d.DeliveryMode == amqp.Persistent {
					return fmt.Errorf("--at-most-once sent a persistent message")
				}
				return nil
			})},

		// meshctl tail: runs until stopped
		{doc: `meshctl tail 'module.#' --json`, from: "docs/commands.md", live: tailSees("module.shipped.tailed", true, false)},
		{doc: `meshctl tail '#' --exclude 'node.*.heartbeat' --exclude 'mesh.membership.#'`, from: "docs/commands.md", live: tailSees("module.shipped.excluding", false, true)},
		{doc: `bin/meshctl tail 'module.#'`, from: "README.md", live: tailSees("module.shipped.readme", false, false)},

		// meshctl call
		{doc: `meshctl call invoice.create '{"site":"blog.example","cents":1000}' --timeout 5s`, from: "docs/commands.md",
			// the line as the doc shows it, with a timeout a loaded machine keeps
			run:  `meshctl call invoice.create '{"site":"blog.example","cents":1000}' --timeout 60s`,
			want: []string{`"invoice":"INV-1"`, `"site":"blog.example"`}, check: isJSON},
		{doc: `bin/meshctl call invoice.create '{"site":"demo.example","cents":1000}'`, from: "README.md",
			want: []string{`"invoice":"INV-1"`, `"site":"demo.example"`}, check: isJSON},
		{doc: `meshctl call tax.rate '"shop.example"'`, from: "docs/console.md", run: `meshctl call invoice.create '"shop.example"'`,
			want: []string{`"request":"shop.example"`}, check: isJSON},
		{doc: "on error print it (with the tool's code) and exit 1", from: "docs/commands.md", run: `meshctl call nobody.serves '{}' --timeout 10s`, code: 1,
			wantErr: []string{"nobody.serves"}},
		{doc: "`meshctl audit get ID\n  --bogus`: `flag provided but not defined: -bogus`, exit 2", from: "docs/commands.md",
			run: "meshctl audit get {event} --bogus", code: 2, wantErr: []string{"flag provided but not defined: -bogus"}},

		// the mesh as its heartbeats tell it
		{doc: "bin/meshctl nodes", from: "README.md", want: []string{"{node}", "v0.", "audit-logger", "agent (agent)", "dispatcher (dispatcher)"}},
		{doc: "meshctl nodes --wait 3s --json", from: "docs/commands.md", want: []string{`"node":"{node}"`}, check: isJSON},
		{doc: "meshctl nodes --within 5s --json", from: "docs/commands.md", want: []string{`"node":"{node}"`}, check: isJSON},
		{doc: "meshctl groups --within 5s", from: "docs/commands.md", want: []string{"GROUP", "echoes", "group.echoes.echo.events", "{node}"}},
		// The fixture's group keeps no order: the command refuses it (a
		// change of an ordered group's count: TestAGroupKeepsOrderUnderMeshd).
		{doc: "meshctl groups repartition billing ledger 32 --wait 1m", from: "docs/commands.md", run: "meshctl groups repartition echoes echo 32 --wait 1m", code: 1,
			wantErr: []string{"no such ordered group", "group.echoes.echo.intake"}},
		{doc: "meshctl nodes --wait 2s", from: "docs/where-did-my-event-go.md", want: []string{"{node}", "audit-logger"}},
		{doc: "meshctl graph --wait 2s", from: "docs/where-did-my-event-go.md", want: []string{"flowchart LR", "invoice.create"}},
		{doc: "meshctl graph --format dot --wait 3s", from: "docs/commands.md", want: []string{"digraph", "invoice.create", "audit.query", "shop.orders"}},
		{doc: "`meshctl features`", from: "docs/commands.md", run: "meshctl features", want: []string{"FEATURE", "delays", "{node}"}},

		// topology (before any row binds a queue of its own to the mesh's exchanges)
		{doc: "meshctl topology print|check --config mesh.yaml", from: "docs/commands.md", run: "meshctl topology print --config {config}",
			want: []string{"mesh.events", "mesh.dead-letters", "{node}.audit-logger.events", "{node}.dispatcher.events", "mesh.delay.due"}},
		{doc: "meshctl topology check --config examples/mesh.yaml --json", from: "docs/commands.md", run: "meshctl topology check --config {config} --json",
			want: []string{`"verdict":"ok"`, `"name":"{node}.audit-logger.events"`},
			check: func(t *testing.T, f *fixture, out string) error {
				for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
					var v struct{ Verdict, Kind, Name string }
					if err := json.Unmarshal([]byte(l), &v); err != nil {
						return fmt.Errorf("line %q: %v", l, err)
					}
					if v.Verdict != "ok" && v.Verdict != "warning" && v.Verdict != "WARNING" {
						return fmt.Errorf("the node's own topology differs: %s", l)
					}
				}
				return nil
			}},
		{doc: "meshctl topology permissions --config examples/mesh.yaml --node demo --user mesh-demo", from: "docs/commands.md",
			run:  "meshctl topology permissions --config {config} --node {node} --user mesh-demo",
			want: []string{"rabbitmqctl set_permissions", "'mesh-demo'", "{node}\\.(?:audit-logger|agent|dispatcher|echo)", "shop\\.orders", "group\\.echoes\\.echo\\.events"}},
		{doc: "meshctl topology permissions --config mesh.yaml --user mesh-anchor", from: "docs/operator-guide.md",
			run:  "meshctl topology permissions --config {config} --user mesh-anchor",
			want: []string{"# node {node}: broker user mesh-anchor", "rabbitmqctl set_topic_permissions"}},
		{doc: "meshctl topology permissions --for operator --user mesh-ops", from: "docs/commands.md",
			want: []string{"# operator (meshctl): broker user mesh-ops", "rabbitmqctl set_permissions"}},
		{doc: "meshctl queue migrate --config examples/mesh.yaml --module notifier", from: "docs/commands.md",
			run:  "meshctl queue migrate --config {config} --module audit-logger",
			want: []string{"{node}.audit-logger.events already has the arguments its entry gives it"}},

		// dead letters: forged as the runtime writes them, into a queue of a module that no longer runs
		{doc: "meshctl dlq ls --module billing --older-than 1h --limit 100 --json", from: "docs/commands.md",
			before: forgeDeadLetters, run: "meshctl dlq ls --module ghost --older-than 1h --limit 100 --json",
			want: []string{`"id":"{dead}"`, `"id":"{dead2}"`, `"module":"ghost"`, `"reason":"permanent"`}, check: isJSON},
		{doc: "meshctl dlq show 01JDEADLETTER0000000000000 --json", from: "docs/commands.md", run: "meshctl dlq show {dead} --json",
			want: []string{`"id":"{dead}"`, `"queue":"{node}.ghost.events"`, `"order":42`}, check: isJSON},
		{doc: "meshctl dlq replay --module billing --type 'module.umami.#' --dry-run", from: "docs/commands.md",
			run: "meshctl dlq replay --module ghost --type 'module.shipped.#' --dry-run", want: []string{"2"},
			check: func(t *testing.T, f *fixture, out string) error { return queueHolds(t, f, f.get("ghost"), 0) }},
		{doc: `meshctl dlq purge --id "$bad" --dry-run`, from: "docs/where-did-my-event-go.md", run: "meshctl dlq purge --id {dead} --dry-run",
			want:  []string{"dry run: would purge 1 dead letter"},
			check: func(t *testing.T, f *fixture, out string) error { return queueHolds(t, f, wire.QueueDead, 2) }},
		{doc: "`replay` sends a dead letter, with its original body, headers and id,\n  back to the one queue that gave up on it", from: "docs/commands.md",
			run: "meshctl dlq replay --id {dead}",
			check: func(t *testing.T, f *fixture, out string) error {
				d := getOne(t, f, f.get("ghost"))
				if d.MessageId != f.get("dead") || string(d.Body) != `{"order":42}` {
					return fmt.Errorf("the module's queue got %s %s, want the dead letter %s", d.MessageId, d.Body, f.get("dead"))
				}
				return nil
			}},
		{doc: "`purge` deletes", from: "docs/commands.md", run: "meshctl dlq purge --id {dead2}",
			check: func(t *testing.T, f *fixture, out string) error {
				left, err := run(context.Background(), f, "meshctl dlq ls --id {dead2} --json")
				if err.code != 0 || strings.Contains(left, f.get("dead2")) {
					return fmt.Errorf("after the purge, dlq ls --id shows %q (exit %d)", left, err.code)
				}
				return nil
			}},
		{doc: "without a filter it wants `--all`", from: "docs/commands.md", run: "meshctl dlq purge", code: 2, wantErr: []string{"--all"}},

		// unrouted events: forged onto mesh.events.unrouted (the audit logger takes every event, so none is unrouted here)
		{doc: "meshctl unrouted ls|show|replay|purge", from: "docs/commands.md", before: forgeUnrouted, run: "meshctl unrouted ls --json",
			want: []string{`"id":"{unrouted}"`, `"id":"{unrouted2}"`}, check: isJSON},
		{doc: "meshctl unrouted ls|show|replay|purge", from: "docs/commands.md", run: "meshctl unrouted show {unrouted}",
			want: []string{"{unrouted}", "module.shipped.lost", `"lost": 1`}},
		{doc: "meshctl unrouted purge --older-than 24h --dry-run", from: "docs/commands.md", want: []string{"2"},
			check: func(t *testing.T, f *fixture, out string) error { return queueHolds(t, f, wire.QueueUnrouted, 2) }},
		{doc: "meshctl unrouted replay --type node.anchor.module.started --dry-run", from: "docs/where-did-my-event-go.md",
			run: "meshctl unrouted replay --type module.shipped.lost --dry-run", want: []string{"2"},
			check: func(t *testing.T, f *fixture, out string) error { return queueHolds(t, f, wire.QueueUnrouted, 2) }},
		{doc: "An unrouted event is\n  published to `mesh.events` again", from: "docs/commands.md", run: "meshctl unrouted replay --id {unrouted}",
			before: tapEvents("module.shipped.lost"),
			check:  emittedID("unrouted", nil)},
		{doc: "meshctl unrouted ls|show|replay|purge", from: "docs/commands.md", run: "meshctl unrouted purge --id {unrouted2}",
			check: func(t *testing.T, f *fixture, out string) error { return queueHolds(t, f, wire.QueueUnrouted, 0) }},

		// the audit log (the audit logger stores a moment after the event)
		{doc: "meshctl audit query --type 'module.umami.#' --from 1h --limit 20 --json", from: "docs/commands.md", eventually: true,
			want: []string{`"id":"{readme_event}"`, `"type":"module.umami.site.created"`}, check: isJSON},
		{doc: "bin/meshctl audit query --type 'module.umami.#' --limit 5", from: "README.md", want: []string{"{readme_event}"}},
		{doc: "meshctl audit get 01JSITECREATED000000000000 --json", from: "docs/commands.md", run: "meshctl audit get {event} --json", eventually: true,
			want: []string{`"id":"{event}"`, `"type":"mesh.ops.deploy"`, `"schema":"2"`, `"version":"1.4.2"`}, check: isJSON},
		{doc: `meshctl audit query --causation "$site" --json`, from: "docs/where-did-my-event-go.md", run: "meshctl audit query --causation {event} --json",
			eventually: true, want: []string{`"id":"{caused}"`, `"causation_id":"{event}"`}, check: isJSON},
		{doc: "meshctl audit trace 01JSITECREATED000000000000 --depth 3", from: "docs/commands.md", run: "meshctl audit trace {event} --depth 3",
			want: []string{"{event}", "mesh.ops.deploy", "meshctl@ops", "{caused}", "mesh.ops.done"}},
		{doc: "meshctl audit query --dead", from: "docs/where-did-my-event-go.md", eventually: true, want: []string{"{dead}"}},
		{doc: "meshctl audit export --type 'module.#' --format csv --out events.csv", from: "docs/commands.md",
			check: fileHas("events.csv", "seq,id,type,", "{readme_event},module.umami.site.created")},
		{doc: "meshctl audit export --type 'module.#' --format cloudevents --out events.jsonl", from: "docs/commands.md",
			check: fileHas("events.jsonl", `"specversion":"1.0"`, `"id":"{readme_event}"`)},
		{doc: "meshctl audit count --type 'module.#' --logger demo", from: "docs/commands.md", run: "meshctl audit count --type 'module.#' --logger {node}",
			check: func(t *testing.T, f *fixture, out string) error {
				var n int
				if _, err := fmt.Sscanf(out, "%d", &n); err != nil || n < 1 {
					return fmt.Errorf("printed %q, want a count of at least 1", out)
				}
				return nil
			}},
		{doc: "`stats [--json]` prints rows", from: "docs/commands.md", run: "meshctl audit stats", want: []string{"events ", "dead letters ", "last seq "}},
		{doc: "meshctl audit verify [--db FILE]", from: "docs/commands.md", run: "meshctl audit verify", want: []string{"every row verifies"}},
		{doc: "meshctl audit replay --type 'module.umami.#' --target demo.notifier --rate 50 --dry-run", from: "docs/commands.md",
			run:  "meshctl audit replay --type 'module.umami.#' --target {node}.audit-logger --rate 50 --dry-run",
			want: []string{"{readme_event}", "nothing sent"}},

		// the delay cascade
		{doc: "meshctl delayed ls --via NODE", from: "docs/commands.md", run: "meshctl delayed ls --via {node}",
			want: []string{"{delayed}", "mesh.ops.someday", "{at}"}},
		{doc: "meshctl delayed count [--due-of NODE]", from: "docs/commands.md", run: "meshctl delayed count --due-of {node}",
			want: []string{"waiting in the delay cascade: ", "due for node {node}"}},
		{doc: "meshctl delayed cancel --via NODE ID", from: "docs/commands.md", run: "meshctl delayed cancel --via {node} {delayed}",
			want: []string{"cancelled {delayed}"}},
		{doc: "an\n  id NODE does not hold (delivered already, or scheduled elsewhere) fails with why", from: "docs/commands.md",
			run: "meshctl delayed cancel --via {node} {event}", code: 1, wantErr: []string{"holds no delayed event {event}"}},

		// the dispatcher: an order an outside system puts into shop.orders
		{doc: "meshctl dispatcher fires orders --limit 20 --json", from: "docs/commands.md", before: publishOrder, eventually: true,
			want: []string{`"trigger":"orders"`, `"message_id":"{order}"`}, check: isJSON},
		{doc: "meshctl dispatcher pause orders --timeout 10s", from: "docs/commands.md", want: []string{"trigger orders paused"}},
		{doc: "meshctl dispatcher pause|resume TRIGGER", from: "docs/commands.md", run: "meshctl dispatcher resume orders", want: []string{"trigger orders consuming"}},

		// body schemas (the release's modules declare none)
		{doc: "meshctl schema ls|show|diff|check [--wait 12s] [--json]", from: "docs/commands.md", run: "meshctl schema ls --wait 3s", want: []string{"TYPE", "VERSION"}},
		{doc: "`show TYPE [--version V]` prints a schema", from: "docs/commands.md", run: "meshctl schema show module.audit-logger.checkpoint", code: 1},
		{doc: "`diff OLD NEW` (files or\n  `TYPE@VERSION`)", from: "docs/commands.md", before: writeSchemas, run: "meshctl schema diff v1.json v2.json",
			want: []string{"NEW reads OLD's bodies (backward): incompatible", `requires "a"`}},
		{doc: "`check FILE --type T\n  --version V`", from: "docs/commands.md", run: "meshctl schema check v2.json --type mesh.ops.note --version 2",
			want: []string{"COMPATIBLE"}},
		{doc: "`--offline` checks a binary against the\n  earlier versions it declares itself", from: "docs/commands.md",
			// The audit logger keeps its database in the directory meshd
			// gives it: described, it gets a scratch one (it exited 2,
			// "--db PATH is required outside meshd"), and it declares no
			// schema, which is the answer.
			run: "meshctl schema check {release}/modules/audit-logger --offline", code: 1,
			wantErr: []string{"module audit-logger", "declares no schema"}},

		// the console
		{doc: "meshctl console token add alice --read-only --tokens console-tokens", from: "docs/commands.md",
			check: func(t *testing.T, f *fixture, out string) error {
				if tok := strings.TrimSpace(out); tok == "" || strings.Contains(tok, "\n") || strings.Contains(tok, " ") {
					return fmt.Errorf("printed %q, want the token alone", out)
				}
				return nil
			}},
		{doc: "`token list [--json]`", from: "docs/commands.md", run: "meshctl console token list --tokens console-tokens", want: []string{"alice", "read-only"}},
		{doc: "meshctl console token revoke alice --tokens console-tokens", from: "docs/commands.md",
			check: func(t *testing.T, f *fixture, out string) error {
				list, res := run(context.Background(), f, "meshctl console token list --tokens console-tokens")
				if res.code != 0 || strings.Contains(list, "alice") {
					return fmt.Errorf("after revoke, token list says %q (exit %d)", list, res.code)
				}
				return nil
			}},
		{doc: "meshctl console --addr 127.0.0.1:18461 --token-file console.token --read-only", from: "docs/console.md",
			run: "meshctl console --addr {console2} --token-file console.token --read-only", before: writeConsoleToken, live: consoleGuards},
		{doc: "meshctl console --addr 127.0.0.1:8080 --read-only", from: "docs/commands.md", run: "meshctl console --addr {console} --read-only", live: consoleServes},

		// what the broker keeps of a module that no longer runs (the ghost of the dead letters)
		{doc: "meshctl module remove demo.notifier --yes", from: "docs/commands.md", run: "meshctl module remove {node}.ghost --yes",
			check: func(t *testing.T, f *fixture, out string) error {
				if err := queueGone(t, f, f.get("ghost")); err != nil {
					return err
				}
				return nil
			}},

		// a node gone for good: refused while it runs, its queues deleted once it is gone
		{doc: "meshctl node remove demo --yes", from: "docs/commands.md", run: "meshctl node remove {node} --yes", code: 1,
			wantErr: []string{"{node}"},
			check: func(t *testing.T, f *fixture, out string) error {
				return queueExists(t, f, f.fill("{node}.audit-logger.events"))
			}},
		{doc: "meshctl node remove demo --yes", from: "docs/commands.md", run: "meshctl node remove gone --yes",
			before: func(t *testing.T, f *fixture) {
				// What a node named gone left: its module's queue, as a
				// node declares it, holding an event.
				ch := brokertest.Channel(t, f.url)
				if _, err := ch.QueueDeclare("gone.ledger.events", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
					t.Fatal(err)
				}
				if err := ch.PublishWithContext(context.Background(), "", "gone.ledger.events", false, false, amqp.Publishing{Body: []byte("{}")}); err != nil {
					t.Fatal(err)
				}
			},
			check: func(t *testing.T, f *fixture, out string) error {
				if err := queueGone(t, f, "gone.ledger.events"); err != nil {
					return err
				}
				return queueExists(t, f, f.fill("{node}.audit-logger.events"))
			}},

		// a new module, written against the mesh source (the release's meshctl was not built in a clone)
		{doc: "meshctl new module greeter --kind agent --dir ./greeter", from: "docs/commands.md",
			run: "meshctl new module greeter --kind agent --dir ./greeter --mesh {mesh}", want: []string{"module greeter (kind agent)"},
			check: fileHas("greeter/mesh.yaml", "name: greeter", "kind: agent")},

		// completion
		{doc: "meshctl completion bash", from: "docs/commands.md", want: []string{"_meshctl_complete()", "complete -o bashdefault -o default -F _meshctl_complete meshctl"}},
		{doc: "meshctl completion bash|zsh|fish", from: "docs/commands.md", run: "meshctl completion zsh", want: []string{"meshctl", "compdef"}},
		{doc: "meshctl completion bash|zsh|fish", from: "docs/commands.md", run: "meshctl completion fish", want: []string{"complete -c meshctl"}},
	}
}

// TestCommandTable runs the table against one node of the release.
func TestCommandTable(t *testing.T) {
	rows := commandRows()
	checkDocsShow(t, rows)
	url := brokertest.VHost(t)
	name := uniqueName("table")
	raw := brokertest.Channel(t, url)
	if err := raw.Confirm(false); err != nil {
		t.Fatal(err)
	}
	// The dispatcher's trigger consumes a queue an outside system owns.
	if _, err := raw.QueueDeclare("shop.orders", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	scripts := testdir.Reachable(t)
	script := filepath.Join(scripts, "invoice.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nread -r request\nprintf '{\"invoice\":\"INV-1\",\"for\":%s}\\n' \"$request\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, url, name, fmt.Sprintf(`  - name: audit-logger
    path: %s
    tools: ["audit.*"]
    dead_letters: ["#"]
  - name: agent
    kind: agent
    path: %s
    tools: ["invoice.create"]
    config:
      tools:
        - key: invoice.create
          command: %s
          timeout: 60s
  - name: dispatcher
    kind: dispatcher
    path: %s
    tools: ["dispatcher.*"]
    consumes: ["shop.orders"]
    calls: ["invoice.create"]
    config:
      triggers:
        - name: orders
          queue: shop.orders
          tool: invoice.create
          timeout: 25s
  - name: echo
    path: %s
    tools: ["echo.upper"]
    group: echoes
# a node setting after the list: heartbeats every second, so --wait 3s hears them
heartbeat_interval: 1s
`, binary("modules/audit-logger"), binary("modules/agent"), script, binary("modules/dispatcher"), userModule(t, "./runtime/testdata/echomodule")))
	mesh, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{url: url, dir: testdir.Reachable(t), n: n, ch: raw, vars: map[string]string{
		"node": name, "config": n.config, "release": release, "mesh": mesh, "console": freeAddr(t), "console2": freeAddr(t),
		// a time a month ahead, to the second, as the doc's --at shows one
		"at": time.Now().UTC().Add(30 * 24 * time.Hour).Truncate(time.Second).Format(time.RFC3339),
	}}
	// The mesh's and the modules' queues exist once the node is ready; a
	// dispatcher restarted until shop.orders existed is up by its heartbeat.
	for _, r := range rows {
		title := strings.Join(strings.Fields(r.doc), " ")
		if r.run != "" {
			title = r.run
		}
		t.Run(title, func(t *testing.T) {
			if r.skip != "" {
				t.Skip(r.skip)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if r.before != nil {
				r.before(t, f)
			}
			line := r.run
			if line == "" {
				line = r.doc
			}
			if left := unfilled.FindString(f.fill(line)); left != "" {
				t.Fatalf("%s needs %s, which an earlier row did not make (see its failure)", line, left)
			}
			switch {
			case r.probe != nil:
				r.probe(t, f)
			case r.live != nil:
				runLive(ctx, t, f, line, r.live)
			default:
				runRow(ctx, t, f, r, line)
			}
		})
	}
}

// result is how a command ended.
type result struct {
	code   int
	stderr string
	err    error // it could not be run at all
}

// command makes the exec.Cmd of line (split as a shell would; the first
// word names the release's binary), run in f.dir as a user runs it: the
// broker from MESH_AMQP_URL, a home of its own.
func command(ctx context.Context, f *fixture, line string) *exec.Cmd {
	words := splitLine(line)
	for i := range words {
		words[i] = f.fill(words[i])
	}
	bin := binary("bin/" + filepath.Base(words[0]))
	cmd := exec.CommandContext(ctx, bin, words[1:]...)
	cmd.Dir = f.dir
	cmd.Env = append(os.Environ(), "MESH_AMQP_URL="+f.url, "HOME="+f.dir, "XDG_CONFIG_HOME="+filepath.Join(f.dir, ".config"), "PATH=/usr/local/go/bin:"+os.Getenv("PATH"))
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// run runs line to its end and returns its standard output and how it
// ended.
func run(ctx context.Context, f *fixture, line string) (string, result) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
	}
	cmd := command(ctx, f, line)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := result{stderr: stderr.String()}
	if exit, ok := err.(*exec.ExitError); ok {
		res.code = exit.ExitCode()
	} else if err != nil {
		res.err = err
	}
	if ctx.Err() != nil {
		res.err = fmt.Errorf("%s did not end within its bound: %w", line, ctx.Err())
	}
	return stdout.String(), res
}

// runRow runs r's line and holds it to r, again until it holds when r is
// eventually.
func runRow(ctx context.Context, t *testing.T, f *fixture, r cmdRow, line string) {
	t.Helper()
	for {
		out, res := run(ctx, f, line)
		if res.err != nil {
			t.Fatalf("%s: %v\nstdout: %s\nstderr: %s", f.fill(line), res.err, out, res.stderr)
		}
		var problem error
		if res.code != r.code {
			problem = fmt.Errorf("exited %d, want %d", res.code, r.code)
		}
		for _, w := range r.want {
			if problem == nil && !strings.Contains(out, f.fill(w)) {
				problem = fmt.Errorf("printed no %q", f.fill(w))
			}
		}
		for _, w := range r.wantErr {
			if problem == nil && !strings.Contains(res.stderr, f.fill(w)) {
				problem = fmt.Errorf("said no %q on stderr", f.fill(w))
			}
		}
		if problem == nil && r.check != nil {
			problem = r.check(t, f, out)
		}
		if problem == nil {
			return
		}
		if !r.eventually || ctx.Err() != nil {
			t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", f.fill(line), problem, out, res.stderr)
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// runLive starts line, hands its output lines to live, and stops it (with
// SIGINT, as a user's Ctrl-C) once live returns.
func runLive(ctx context.Context, t *testing.T, f *fixture, line string, live func(*testing.T, *fixture, <-chan string, <-chan string)) {
	t.Helper()
	cmd := command(ctx, f, line)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out, errs := lines(stdout), lines(stderr)
	done := make(chan struct{})
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	live(t, f, out, errs)
}

// lines sends r's lines until it ends, then closes.
func lines(r io.Reader) <-chan string {
	c := make(chan string, 1024)
	go func() {
		defer close(c)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			c <- sc.Text()
		}
	}()
	return c
}

// await reads c until a line containing s, failing when c ends or within
// two minutes; it returns the lines read.
func await(t *testing.T, c <-chan string, s string) []string {
	t.Helper()
	var seen []string
	limit := time.After(2 * time.Minute)
	for {
		select {
		case l, ok := <-c:
			if !ok {
				t.Fatalf("the command ended before it printed %q; it printed:\n%s", s, strings.Join(seen, "\n"))
			}
			seen = append(seen, l)
			if strings.Contains(l, s) {
				return seen
			}
		case <-limit:
			t.Fatalf("no %q within 2 minutes; it printed:\n%s", s, strings.Join(seen, "\n"))
		}
	}
}

// tailSees is a tail row: once tail says it follows, meshctl emits an event
// of typ, which tail must print (as a JSON object when asJSON). With
// noHeartbeat, a heartbeat the raw tap saw before the emit must not be
// printed before it (tail leaves heartbeats out).
func tailSees(typ string, asJSON, noHeartbeat bool) func(*testing.T, *fixture, <-chan string, <-chan string) {
	return func(t *testing.T, f *fixture, out, errs <-chan string) {
		await(t, errs, "tail: following")
		if noHeartbeat {
			beats := brokertest.Tap(t, f.url, wire.ExchangeEvents, "node.*.heartbeat")
			select {
			case <-beats:
			case <-time.After(2 * time.Minute):
				t.Fatal("no heartbeat within 2 minutes")
			}
		}
		id, res := run(context.Background(), f, "meshctl emit "+typ+` '{"tailed":true}' --schema ''`)
		if res.err != nil || res.code != 0 {
			t.Fatalf("emit: exit %d, %v: %s", res.code, res.err, res.stderr)
		}
		id = strings.TrimSpace(id)
		seen := await(t, out, id)
		last := seen[len(seen)-1]
		if asJSON {
			var ev struct{ ID, Type string }
			if err := json.Unmarshal([]byte(last), &ev); err != nil || ev.ID != id || ev.Type != typ {
				t.Errorf("--json printed %q (%v), want an object with id %s and type %s", last, err, id, typ)
			}
		}
		if noHeartbeat {
			for _, l := range seen {
				if strings.Contains(l, ".heartbeat") {
					t.Errorf("tail --exclude 'node.*.heartbeat' printed a heartbeat: %q", l)
				}
			}
		}
	}
}

// consoleServes is the console row: it visits the one-time login URL the
// console prints, then reads the overview with the cookie it got.
func consoleServes(t *testing.T, f *fixture, out, errs <-chan string) {
	seen := await(t, out, "log in (this URL works once")
	login := seen[len(seen)-1]
	login = login[strings.Index(login, "http://"):]
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Jar: jar, Timeout: time.Minute}
	resp, err := client.Get(login)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET the login URL: %s\n%s", resp.Status, body)
	}
	resp, err = client.Get("http://" + f.get("console") + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "<html") {
		t.Fatalf("GET / after logging in: %s\n%.2000s", resp.Status, body)
	}
	// A second visit of the one-time URL is refused.
	again, err := (&http.Client{Timeout: time.Minute}).Get(login)
	if err != nil {
		t.Fatal(err)
	}
	again.Body.Close()
	if again.StatusCode == http.StatusOK {
		t.Errorf("the one-time login URL let a second visit in")
	}
}

// writeConsoleToken writes the operator's token file console.token, as
// docs/console.md does.
func writeConsoleToken(t *testing.T, f *fixture) {
	if err := os.WriteFile(filepath.Join(f.dir, "console.token"), []byte("a-console-token-of-my-own\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// consoleGuards is the row of a read-only console with a token file:
// with the token a page is served; without it a page sends to the login
// page (303); an action with it is refused (403), read-only.
func consoleGuards(t *testing.T, f *fixture, out, errs <-chan string) {
	await(t, out, "meshctl console on http://"+f.get("console2")+"/ (read-only)")
	base := "http://" + f.get("console2")
	client := &http.Client{Timeout: time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path, token, body string) (*http.Response, string) {
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	const token = "a-console-token-of-my-own"
	if resp, body := do("GET", "/", token, ""); resp.StatusCode != http.StatusOK {
		t.Errorf("GET / with the token: %s\n%.1000s", resp.Status, body)
	}
	if resp, _ := do("GET", "/audit", "", ""); resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "/login") {
		t.Errorf("GET /audit without a token: %s to %q, want 303 to the login page", resp.Status, resp.Header.Get("Location"))
	}
	if resp, body := do("POST", "/api/dispatcher/pause", token, `{"trigger":"orders"}`); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "read-only") {
		t.Errorf("an action on a read-only console: %s %s, want 403", resp.Status, body)
	}
}

// probeNode is meshd run's row: the shared node, run as startNode runs
// it, answers /healthz, /readyz and /metrics.
func probeNode(t *testing.T, f *fixture) {
	for path, want := range map[string]string{"/healthz": "", "/readyz": "ready", "/metrics": "mesh_"} {
		resp, err := http.Get("http://" + f.n.http + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %s, want 200 with %q:\n%.500s", path, resp.Status, want, body)
		}
	}
}

// tapEvents is a before that taps mesh.events with key for the row.
func tapEvents(key string) func(*testing.T, *fixture) {
	return func(t *testing.T, f *fixture) { f.tap = brokertest.Tap(t, f.url, wire.ExchangeEvents, key) }
}

// emitted checks that emit printed an id alone, and that the row's tap sees
// the event with that id, held to also; it keeps the id as {name} when
// name is set.
func emitted(name string, also func(amqp.Delivery) error) func(*testing.T, *fixture, string) error {
	return func(t *testing.T, f *fixture, out string) error {
		if !ulidLine.MatchString(out) {
			return fmt.Errorf("printed %q, want an id alone", out)
		}
		id := strings.TrimSpace(out)
		if name != "" {
			f.set(name, id)
		}
		return sees(f, id, also)
	}
}

// emittedID checks that the row's tap sees the event {name}.
func emittedID(name string, also func(amqp.Delivery) error) func(*testing.T, *fixture, string) error {
	return func(t *testing.T, f *fixture, out string) error { return sees(f, f.get(name), also) }
}

func sees(f *fixture, id string, also func(amqp.Delivery) error) error {
	limit := time.After(2 * time.Minute)
	for {
		select {
		case d := <-f.tap:
			if d.MessageId != id {
				continue
			}
			if d.Headers[wire.HeaderEventID] != id {
				return fmt.Errorf("the event on the wire carries %s %v, want %s", wire.HeaderEventID, d.Headers[wire.HeaderEventID], id)
			}
			if also != nil {
				return also(d)
			}
			return nil
		case <-limit:
			return fmt.Errorf("the event %s did not reach mesh.events within 2 minutes", id)
		}
	}
}

func bodyIs(d amqp.Delivery, want string) error {
	if string(d.Body) != want {
		return fmt.Errorf("body %s, want %s", d.Body, want)
	}
	return nil
}

// isJSON checks every line of out is a JSON object.
func isJSON(t *testing.T, f *fixture, out string) error {
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var v map[string]any
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			return fmt.Errorf("a line is not a JSON object: %q: %v", l, err)
		}
	}
	return nil
}

// fileHas checks the file name (in the row's directory) holds each of
// want.
func fileHas(name string, want ...string) func(*testing.T, *fixture, string) error {
	return func(t *testing.T, f *fixture, out string) error {
		b, err := os.ReadFile(filepath.Join(f.dir, name))
		if err != nil {
			return err
		}
		for _, w := range want {
			if !strings.Contains(string(b), f.fill(w)) {
				return fmt.Errorf("%s has no %q:\n%.2000s", name, f.fill(w), b)
			}
		}
		return nil
	}
}

// publish publishes a message with raw amqp091-go and waits for its
// confirm.
func publish(t *testing.T, f *fixture, exchange, key string, p amqp.Publishing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dc, err := f.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, p)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("publish to %s %q: acked %v, %v", exchange, key, ok, err)
	}
}

// event is a conforming event of typ from source shop, at when.
func event(typ, body string, when time.Time, more amqp.Table) (string, amqp.Publishing) {
	id := ulid.Make().String()
	h := amqp.Table{wire.HeaderEventID: id, wire.HeaderSource: "shop", wire.HeaderNode: "shop1", wire.HeaderTime: when.UTC().Format(time.RFC3339Nano)}
	for k, v := range more {
		h[k] = v
	}
	return id, amqp.Publishing{Headers: h, ContentType: wire.ContentTypeJSON, DeliveryMode: amqp.Persistent, MessageId: id, Timestamp: when, Body: []byte(body)}
}

// forgeDeadLetters declares the queue of a module "ghost" of the node (one
// that no longer runs) and puts two dead letters of it into the dead
// letters, as the runtime writes them, given up on two hours ago:
// {dead} and {dead2}.
func forgeDeadLetters(t *testing.T, f *fixture) {
	ghost := wire.ModuleQueue(f.get("node"), "ghost")
	if _, err := f.ch.QueueDeclare(ghost, true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": wire.ExchangeDead}); err != nil {
		t.Fatal(err)
	}
	f.set("ghost", ghost)
	then := time.Now().Add(-2 * time.Hour)
	for i, name := range []string{"dead", "dead2"} {
		id, p := event("module.shipped.order.created", fmt.Sprintf(`{"order":%d}`, 42+i), then, amqp.Table{
			wire.HeaderDeadQueue: ghost, wire.HeaderDeadAttempts: int64(3), wire.HeaderDeadReason: wire.DeadReasonPermanent,
			wire.HeaderDeadError: "card declined", wire.HeaderDeadTime: then.UTC().Format(time.RFC3339Nano),
		})
		publish(t, f, wire.ExchangeDead, "module.shipped.order.created", p)
		f.set(name, id)
	}
}

// forgeUnrouted puts two events no queue was bound for, two days old,
// into mesh.unrouted: {unrouted} and {unrouted2}.
func forgeUnrouted(t *testing.T, f *fixture) {
	then := time.Now().Add(-48 * time.Hour)
	for i, name := range []string{"unrouted", "unrouted2"} {
		id, p := event("module.shipped.lost", fmt.Sprintf(`{"lost":%d}`, i+1), then, nil)
		publish(t, f, wire.ExchangeUnrouted, "module.shipped.lost", p)
		f.set(name, id)
	}
}

// publishOrder puts an order into shop.orders as an outside system does
// (not an event of the mesh): {order}.
func publishOrder(t *testing.T, f *fixture) {
	id := ulid.Make().String()
	publish(t, f, "", "shop.orders", amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: id, Body: []byte(`{"order":7}`)})
	f.set("order", id)
}

// writeSchemas writes two versions of a body schema, the second requiring
// what the first leaves optional.
func writeSchemas(t *testing.T, f *fixture) {
	for name, doc := range map[string]string{
		"v1.json": `{"type":"object","properties":{"a":{"type":"string"}}}`,
		"v2.json": `{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}`,
	} {
		if err := os.WriteFile(filepath.Join(f.dir, name), []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// getOne takes one message from queue with raw amqp091-go, waiting for it.
func getOne(t *testing.T, f *fixture, queue string) amqp.Delivery {
	t.Helper()
	ch := brokertest.Channel(t, f.url)
	msgs, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-msgs:
		return d
	case <-time.After(2 * time.Minute):
		t.Fatalf("nothing came into %s within 2 minutes", queue)
		return amqp.Delivery{}
	}
}

// queueHolds checks queue holds n messages ready, as the broker counts
// them (a passive declare).
func queueHolds(t *testing.T, f *fixture, queue string, n int) error {
	ch := brokertest.Channel(t, f.url)
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("%s: %v", queue, err)
	}
	if q.Messages != n {
		return fmt.Errorf("%s holds %d messages, want %d", queue, q.Messages, n)
	}
	return nil
}

// queueGone checks queue no longer exists.
func queueGone(t *testing.T, f *fixture, queue string) error {
	ch := brokertest.Channel(t, f.url)
	if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err == nil {
		return fmt.Errorf("%s still exists", queue)
	}
	return nil
}

// queueExists says why queue is not on the broker, or nil.
func queueExists(t *testing.T, f *fixture, queue string) error {
	ch := brokertest.Channel(t, f.url)
	if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("%s is gone: %w", queue, err)
	}
	return nil
}

// freeAddr is a loopback address no one listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	return freeport.Addr(t)
}

// splitLine splits a command line as a shell does for the lines the docs
// show: words apart at spaces, 'single' and "double" quotes kept together.
func splitLine(s string) []string {
	var words []string
	var w strings.Builder
	in, quote := false, rune(0)
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			w.WriteRune(r)
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == ' ' || r == '\n' || r == '\t':
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, w.String())
	}
	return words
}

// checkDocsShow fails for a row whose doc line its file (in the release's
// archive) does not show.
func checkDocsShow(t *testing.T, rows []cmdRow) {
	t.Helper()
	files := map[string]string{}
	for _, r := range rows {
		if strings.HasSuffix(r.from, "--help") {
			continue
		}
		text, ok := files[r.from]
		if !ok {
			b, err := os.ReadFile(filepath.Join(release, r.from))
			if err != nil {
				t.Fatalf("the release has no %s: %v", r.from, err)
			}
			text = string(b)
			files[r.from] = text
		}
		if !strings.Contains(text, r.doc) {
			t.Errorf("%s does not show %q: the row is stale (change it with the doc)", r.from, r.doc)
		}
	}
}

// TestEveryCommandHasARow reads the commands of the release's meshctl and
// meshd from their --help, down the tree, and fails for one that no row
// of the table runs and skipped does not name.
func TestEveryCommandHasARow(t *testing.T) {
	var runs [][]string
	for _, r := range commandRows() {
		line := r.run
		if line == "" {
			line = r.doc
		}
		words := splitLine(line)
		words[0] = filepath.Base(words[0])
		runs = append(runs, words)
	}
	var missing []string
	for _, prog := range []string{"meshctl", "meshd"} {
		for _, path := range commandTree(t, []string{prog}) {
			name := strings.Join(path, " ")
			if _, ok := skipped[name]; ok {
				continue
			}
			covered := false
			for _, w := range runs {
				if len(w) >= len(path) && strings.Join(w[:len(path)], " ") == name {
					covered = true
					break
				}
			}
			if !covered {
				missing = append(missing, name)
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("no row of the command table runs these commands of the release (add a row, or say in skipped why it cannot run here):\n  %s", strings.Join(missing, "\n  "))
	}
}

// commandTree lists path's commands, and theirs, from the --help of the
// release's binary.
func commandTree(t *testing.T, path []string) [][]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary("bin/"+path[0]), append(path[1:], "--help")...).Output()
	if err != nil {
		t.Fatalf("%s --help: %v", strings.Join(path, " "), err)
	}
	var tree [][]string
	in := false
	for _, l := range strings.Split(string(out), "\n") {
		switch {
		case strings.TrimSpace(l) == "COMMANDS:":
			in = true
		case in && strings.TrimSpace(l) == "":
			in = false
		case in && strings.HasPrefix(l, "   ") && !strings.HasPrefix(l, "    "):
			name := strings.TrimSuffix(strings.Fields(l)[0], ",")
			if name == "help" {
				continue // the CLI library's help, under every command
			}
			sub := append(append([]string{}, path...), name)
			tree = append(tree, sub)
			tree = append(tree, commandTree(t, sub)...)
		}
	}
	return tree
}
