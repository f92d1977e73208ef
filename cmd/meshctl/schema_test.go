package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/examples/billing"
	"github.com/meshkit/mesh/examples/notifier"
	"github.com/meshkit/mesh/examples/umami"
	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestSchemaCheckOnTheExamples: on a live mesh of the example modules and
// an audit logger, meshctl schema lists umami's site.created version 1
// and the notifier reading it, shows its document from the audit log,
// and checks new versions as CI would before a deploy: the umami binary
// as built passes (exit 0); a version 2 that only adds a field breaks the
// notifier, which reads version 1 alone (exit 1, naming it); version 1
// changed in place is refused; a retyped field fails the rule and the
// audit log's sample of bodies; a keyword the checker does not decide
// leaves it undecided (exit 2).
func TestSchemaCheckOnTheExamples(t *testing.T) {
	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n, err := runtime.New(ctx, runtime.Config{Node: "demo", AMQPURL: url, StateDir: t.TempDir(), HeartbeatInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	l, err := auditlogger.Open(filepath.Join(t.TempDir(), "audit.db"), auditlogger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := n.Load(ctx, l.Module(), runtime.ModuleConfig{}); err != nil {
		t.Fatal(err)
	}
	for _, def := range []sdk.Module{billing.Module(), billing.Tax(), notifier.Module(io.Discard), umami.Module(20 * time.Millisecond)} {
		if _, err := n.Load(ctx, def, runtime.ModuleConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	// The announcement and a few bodies in the audit log.
	for {
		a, _ := l.Store().Count(ctx, store.Filter{Types: []string{"node.demo.schemas"}})
		b, _ := l.Store().Count(ctx, store.Filter{Types: []string{"module.umami.site.created"}})
		if a >= 2 && b >= 3 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the audit log holds %d announcements and %d sites", a, b)
		case <-time.After(20 * time.Millisecond):
		}
	}
	dir := t.TempDir()
	file := func(name, doc string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	run := func(want int, args ...string) string {
		t.Helper()
		out, err := runMeshctl(url, append([]string{"schema"}, append(args[:1:1], append([]string{"--wait", "1s"}, args[1:]...)...)...)...)
		if got := exitCode(err); got != want {
			t.Fatalf("meshctl schema %s: exit %d (%v), want %d\n%s", strings.Join(args, " "), got, err, want, out)
		}
		return out
	}

	var ls struct {
		Types []schemaType `json:"types"`
	}
	if err := json.Unmarshal([]byte(run(0, "ls", "--json")), &ls); err != nil {
		t.Fatal(err)
	}
	var site *schemaType
	for i := range ls.Types {
		if ls.Types[i].Type == "module.umami.site.created" {
			site = &ls.Types[i]
		}
	}
	if site == nil || len(site.Versions) != 1 || site.Versions[0].Version != "1" || !site.Versions[0].Current ||
		len(site.Consumers) != 2 || site.Consumers[0].Module != "audit-logger" || site.Consumers[0].Reads[0] != "*" ||
		site.Consumers[1].Module != "notifier" || strings.Join(site.Consumers[1].Reads, ",") != "1" {
		t.Fatalf("ls: %+v", ls.Types)
	}
	if out := run(0, "ls"); !strings.Contains(out, "demo/notifier 1") || !strings.Contains(out, "1 (current)") {
		t.Errorf("ls:\n%s", out)
	}
	if out := run(0, "show", "module.umami.site.created"); !strings.Contains(out, `"name"`) || !strings.Contains(out, `"required"`) {
		t.Errorf("show:\n%s", out)
	}

	// meshctl emit sets the version the live modules declare, and checks
	// the body against its document as a module's emit would.
	out, err := runMeshctl(url, "emit", "module.umami.site.created", `{"id": 7, "name": "blog"}`)
	if err != nil {
		t.Fatalf("emit of a conforming site: %v\n%s", err, out)
	}
	id := strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])
	for {
		ev, err := l.Store().Get(ctx, id)
		if err == nil {
			if ev.Schema != "1" {
				t.Errorf("meshctl emit sent schema %q, want the declared version 1", ev.Schema)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the emitted site %s never reached the audit log: %v", id, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if out, err := runMeshctl(url, "emit", "module.umami.site.created", `{"name": "blog"}`); err == nil ||
		!strings.Contains(err.Error(), "(version 1): /: required: missing property 'id'") || !strings.Contains(err.Error(), "--schema VERSION") {
		t.Errorf("emit of a site without its id: %v, want it refused naming the rule\n%s", err, out)
	}
	if out, err := runMeshctl(url, "emit", "--schema", "", "module.umami.site.created", `{"name": "blog"}`); err != nil {
		t.Errorf("emit with --schema '': %v\n%s", err, out)
	}

	// The binary as built: what is live.
	bin := filepath.Join(dir, "umami")
	if out, err := exec.Command("go", "build", "-o", bin, "../../examples/modules/umami").CombinedOutput(); err != nil {
		t.Fatalf("build umami: %v\n%s", err, out)
	}
	if out := run(0, "check", "--rule", "full", bin); !strings.Contains(out, "module.umami.site.created version 1, rule full: COMPATIBLE") {
		t.Errorf("check of the binary as built:\n%s", out)
	}

	const added = `{"type": "object", "required": ["id", "name"], "properties": {"id": {"type": "integer"}, "name": {"type": "string"}, "plan": {"type": "string"}}}`
	out = run(1, "check", "--type", "module.umami.site.created", "--version", "2", "--rule", "full_transitive", file("v2.json", added))
	if !strings.Contains(out, "against 1 (backward): compatible") || !strings.Contains(out, "consumer demo/notifier (module.umami.site.created) reads 1: incompatible: it reads versions 1: version 2 would be dead-lettered") {
		t.Errorf("check of an added field as version 2:\n%s", out)
	}
	if out := run(1, "check", "--type", "module.umami.site.created", "--version", "1", file("v1.json", added)); !strings.Contains(out, "a changed schema needs a new version") {
		t.Errorf("check of version 1 changed in place:\n%s", out)
	}

	const retyped = `{"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}`
	var res struct {
		Results []schemaCheckResult `json:"results"`
	}
	raw := run(1, "check", "--type", "module.umami.site.created", "--version", "2", "--sample", "3", "--json", file("retyped.json", retyped))
	if err := json.Unmarshal([]byte(raw), &res); err != nil {
		t.Fatalf("%v\n%s", err, raw)
	}
	r := res.Results[0]
	if r.Verdict != "incompatible" || r.Rule.Verdict != "incompatible" || r.Samples == nil || r.Samples.Checked != 3 || len(r.Samples.Refused) != 3 ||
		!strings.Contains(r.Samples.Refused[0].Error, "/id: type:") {
		t.Errorf("check of a retyped id: %s", raw)
	}

	// No consumer of notification.sent: the rule alone, undecided on oneOf.
	const undecided = `{"type": "object", "properties": {"to": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}}`
	if out := run(2, "check", "--type", "module.notifier.notification.sent", "--version", "2", file("sent.json", undecided)); !strings.Contains(out, "UNKNOWN") {
		t.Errorf("check with oneOf:\n%s", out)
	}
	run(2, "check", "--type", "module.umami.site.created", file("x.json", `{}`)) // no --version: a usage error
}

// TestSchemaCheckOffline: a module binary is checked against the earlier
// versions it declares itself, with no broker at all: its compatible
// event passes, its retyped one fails the rule (exit 1), and no rule
// passes both.
func TestSchemaCheckOffline(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "shop")
	if out, err := exec.Command("go", "build", "-o", bin, "./testdata/schemamodule").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	const nowhere = "amqp://guest:guest@127.0.0.1:1/" // nothing listens: offline touches no broker
	out, err := runMeshctl(nowhere, "schema", "check", "--offline", "--json", bin)
	if exitCode(err) != exitFailed {
		t.Fatalf("exit %d (%v), want 1\n%s", exitCode(err), err, out)
	}
	var res struct {
		Results []schemaCheckResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(res.Results) != 2 {
		t.Errorf("%d results, want the two events' (not the tool's): %s", len(res.Results), out)
	}
	verdicts := map[string]string{}
	for _, r := range res.Results {
		verdicts[r.Type+"@"+r.Version] = string(r.Verdict)
		if len(r.Rule.Against) != 1 || r.Rule.Against[0].Version != "1" {
			t.Errorf("%s checked against %+v, want version 1", r.Type, r.Rule.Against)
		}
	}
	if verdicts["module.shop.order.placed@2"] != "incompatible" || verdicts["module.shop.order.shipped@2"] != "compatible" {
		t.Errorf("verdicts %v", verdicts)
	}
	if out, err := runMeshctl(nowhere, "schema", "check", "--offline", "--rule", "none", bin); err != nil {
		t.Errorf("rule none: %v\n%s", err, out)
	}
	if _, err := runMeshctl(nowhere, "schema", "check", "--offline", "--sample", "3", bin); exitCode(err) != exitUsage {
		t.Errorf("--offline --sample: %v, want a usage error", err)
	}
}

// TestEmitChecksTheBodyWithoutAnAuditLog: with no audit logger on the
// mesh, meshctl emit still checks the body: the roll call asks the nodes
// to announce their schemas again, and the document comes from them.
func TestEmitChecksTheBodyWithoutAnAuditLog(t *testing.T) {
	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := runtime.New(ctx, runtime.Config{Node: "solo", AMQPURL: url, StateDir: t.TempDir(), HeartbeatInterval: time.Hour,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	if _, err := n.Load(ctx, umami.Module(time.Hour), runtime.ModuleConfig{}); err != nil {
		t.Fatal(err)
	}
	out, err := runMeshctl(url, "emit", "module.umami.site.created", `{"name": "blog"}`)
	if err == nil || !strings.Contains(err.Error(), "(version 1): /: required: missing property 'id'") {
		t.Errorf("emit of a site without its id, no audit log: %v, want it refused naming the rule\n%s", err, out)
	}
	// At once again: the node answers this roll call when its second is
	// up, not never.
	if out, err := runMeshctl(url, "emit", "module.umami.site.created", `{"id": "seven", "name": "blog"}`); err == nil || !strings.Contains(err.Error(), "/id: type:") {
		t.Errorf("a second emit at once, of a site with a text id: %v, want it refused\n%s", err, out)
	}
	if out, err := runMeshctl(url, "emit", "module.umami.site.created", `{"id": 1, "name": "blog"}`); err != nil || strings.Contains(out, "unchecked") {
		t.Errorf("emit of a conforming site: %v\n%s", err, out)
	}
}
