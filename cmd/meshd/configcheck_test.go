package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/confine"
	"github.com/meshkit/mesh/internal/testdir"
)

// TestConfigCheckHoldsBinariesToTheirEntries: meshd config check starts
// each module binary far enough to describe itself and fails, naming the
// entry and the fix, for what meshd run would refuse: a binary of a
// protocol outside the window, another name, and every call, served
// tool, consumed queue and dead-letter handler the binary declares that
// its entry does not grant (the attacker's case: a binary that declares
// more than it is granted is refused before it joins any mesh). A config
// that grants what each binary declares passes.
func TestConfigCheckHoldsBinariesToTheirEntries(t *testing.T) {
	dir := testdir.Reachable(t)
	meshd := filepath.Join(dir, "meshd")
	if out, err := exec.Command("go", "build", "-o", meshd, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	tax := buildExample(t, dir, "tax", "")
	notifier := buildExample(t, dir, "notifier", "")
	staleBin := buildExample(t, testdir.Reachable(t), "umami", stale)
	dispatcher := filepath.Join(dir, "dispatcher")
	audit := filepath.Join(dir, "audit-logger")
	for pkg, out := range map[string]string{"../../modules/dispatcher/cmd/dispatcher": dispatcher, "../../auditlogger/cmd/audit-logger": audit} {
		if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, b)
		}
	}
	check := func(config string) (string, error) {
		cfg := filepath.Join(t.TempDir(), "mesh.yaml")
		if err := os.WriteFile(cfg, []byte("node: anchor\nstate_dir: "+filepath.Join(t.TempDir(), "state")+"\n"+config), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(meshd, "config", "check", "--config", cfg).CombinedOutput()
		return string(out), err
	}
	dispatch := `
    config:
      triggers:
        - name: orders
          queue: shop.orders
          tool: invoice.issue`

	good := fmt.Sprintf(`modules:
  - name: tax
    kind: agent
    path: %s
    tools: ["tax.rate"]
  - name: notifier
    path: %s
    calls: ["invoice.*"]
  - name: dispatcher
    kind: dispatcher
    path: %s
    tools: ["dispatcher.*"]
    consumes: ["shop.orders"]
    calls: ["invoice.issue"]%s
  - name: audit-logger
    path: %s
    tools: ["audit.*"]
    dead_letters: ["#"]
`, tax, notifier, dispatcher, dispatch, audit)
	out, err := check(good)
	if err != nil || !strings.Contains(out, "config ok: node anchor, 4 modules; each binary described itself") {
		t.Fatalf("a config granting what each binary declares: %v\n%s", err, out)
	}
	if !strings.Contains(out, "modules[0] (tax, "+tax+"): runs as ") || (confine.ABI() >= confine.NetworkABI && !strings.Contains(out, ", network: none\n")) {
		t.Errorf("config check does not say how each module runs, network included:\n%s", out)
	}

	bad := fmt.Sprintf(`modules:
  - name: tax
    kind: agent
    path: %s
  - name: notifier
    path: %s
  - name: dispatcher
    kind: dispatcher
    path: %s
    tools: ["dispatcher.*"]%s
  - name: audit-logger
    path: %s
    tools: ["audit.*"]
  - name: billing
    path: %s
  - name: umami
    path: %s
  - name: history-logger
    path: %s
    args: ["--history"]
    tools: ["audit.*"]
`, tax, notifier, dispatcher, dispatch, audit, tax, staleBin, audit)
	out, err = check(bad)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("config check of a config that grants less than the binaries declare: %v, want exit 1\n%s", err, out)
	}
	for _, want := range []string{
		`modules[0] (tax, ` + tax + `): forbidden: the binary serves tax.rate, which its entry does not grant: add "tax.rate" to tools:`,
		`modules[1] (notifier, ` + notifier + `): forbidden: the binary calls invoice.create, which its entry does not grant: add "invoice.create" to calls:`,
		`modules[2] (dispatcher, ` + dispatcher + `): forbidden: the binary consumes the queue shop.orders, which its entry does not grant: add "shop.orders" to consumes:`,
		`the binary calls invoice.issue, which its entry does not grant`,
		`modules[3] (audit-logger, ` + audit + `): forbidden: the binary receives dead letters, which its entry does not grant: add the event types' patterns to dead_letters:`,
		`modules[4] (billing, ` + tax + `): the binary says it is module "tax", and its entry says "billing"`,
		`modules[5] (umami, ` + staleBin + `): start module ` + staleBin + `: module protocol outside this meshd's window: the binary speaks module protocol 99`,
		`modules[6] (history-logger, ` + audit + `): forbidden: the binary reads the mesh's history, which its entry does not grant: set history: true`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("config check does not say\n\t%s\nit said:\n%s", want, out)
		}
	}
	if out, err := check(bad[:strings.Index(bad, "  - name: notifier")]); err == nil || strings.Contains(out, "notifier") {
		t.Errorf("one bad entry: %v\n%s", err, out)
	}
	// --skip-binaries checks the file alone.
	cfg := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(cfg, []byte("node: anchor\n"+bad), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(meshd, "config", "check", "--skip-binaries", "--config", cfg).CombinedOutput(); err != nil || !strings.Contains(string(out), "config ok: node anchor, 7 modules\n") {
		t.Errorf("--skip-binaries: %v\n%s", err, out)
	}
}

// TestConfigCheckSaysWhyAModuleDied: a module binary that writes its
// reason to stderr and exits as it starts is reported by meshd config
// check with its own words and its exit status, as meshd run reports it
// (here with required: true, so meshd exits naming it), not with
// go-plugin's text about the handshake it never made.
func TestConfigCheckSaysWhyAModuleDied(t *testing.T) {
	dir := testdir.Reachable(t)
	meshd, module := buildMeshdAndEcho(t, dir)
	const words = "open /var/lib/mesh/ledger.db: permission denied"
	entry := fmt.Sprintf("modules:\n  - name: ledger\n    path: %s\n    args: [\"exit-at-start\"]\n", module)
	cfg := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(cfg, []byte("node: anchor\nstate_dir: "+filepath.Join(t.TempDir(), "state")+"\n"+entry), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(meshd, "config", "check", "--config", cfg).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("config check of a module that exits at start: %v, want exit 1\n%s", err, out)
	}
	for _, want := range []string{"modules[0] (ledger, " + module + "): start module " + module, "exit status 3", words} {
		if !strings.Contains(string(out), want) {
			t.Errorf("config check does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "Unrecognized remote plugin message") {
		t.Errorf("config check gives go-plugin's words for the module's:\n%s", out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, _, logs, _ := startMeshd(t, ctx, "node: anchor\namqp_url: "+brokertest.VHost(t)+"\n"+strings.Replace(entry, "  - name: ledger\n", "  - name: ledger\n    required: true\n", 1))
	if err := cmd.Wait(); !errors.As(err, &exit) || !strings.Contains(logs.String(), "exit status 3") || !strings.Contains(logs.String(), words) {
		t.Errorf("meshd run with a required module that exits at start: %v, want exit naming its words\n%s", err, logs.String())
	}
}

// TestLogDurationsAreReadable: meshd logs a duration as Go writes it
// ("100ms"), not as the JSON handler's nanoseconds (100000000): here the
// retry_in of a module process that went away as it started.
func TestLogDurationsAreReadable(t *testing.T) {
	_, module := buildMeshdAndEcho(t, testdir.Reachable(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, _, logs, _ := startMeshd(t, ctx, fmt.Sprintf("node: anchor\namqp_url: %s\nmodules:\n  - name: ledger\n    required: true\n    path: %s\n    args: [\"exit-at-start\"]\n", brokertest.VHost(t), module))
	_ = cmd.Wait() // it exits: its required module did not start
	retries := 0
	for line := range strings.Lines(logs.String()) {
		var entry map[string]any
		if json.Unmarshal([]byte(line), &entry) != nil {
			continue
		}
		v, ok := entry["retry_in"]
		if !ok {
			continue
		}
		retries++
		if s, ok := v.(string); !ok {
			t.Errorf("retry_in is %v, not a duration as Go writes it: %s", v, line)
		} else if _, err := time.ParseDuration(s); err != nil {
			t.Errorf("retry_in %q: %v", s, err)
		}
	}
	if retries == 0 {
		t.Fatalf("meshd logged no retry_in:\n%s", logs.String())
	}
}
