package main

import (
	"bytes"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// TestInterspersedFlags: flags after arguments are moved where urfave/cli
// reads them (after the command that defines them, with their values);
// arguments keep their order; a token that is no flag of the command stays
// an argument, unless it is written as one (it goes after the leaf, which
// reports it); nothing after "--" moves, and "--" goes before the
// arguments, where the flag parser drops it.
func TestInterspersedFlags(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"meshctl tail module.# --json", "meshctl tail --json module.#"},
		{"meshctl call echo.upper \"hi\" --timeout 5s", "meshctl call --timeout 5s echo.upper \"hi\""},
		{"meshctl call echo.upper \"hi\" --timeout=5s", "meshctl call --timeout=5s echo.upper \"hi\""},
		{"meshctl tail module.# --amqp-url amqp://x --json", "meshctl --amqp-url amqp://x tail --json module.#"},
		{"meshctl --amqp-url amqp://x tail --json module.#", "meshctl --amqp-url amqp://x tail --json module.#"},
		{"meshctl emit mesh.ops.x -1 --schema 2", "meshctl emit --schema 2 mesh.ops.x -1"},
		{"meshctl dlq ls --module billing --limit 5", "meshctl dlq ls --module billing --limit 5"},
		{"meshctl dlq show ID1 ID2 --json", "meshctl dlq show --json ID1 ID2"},
		{"meshctl emit mesh.ops.x -- --json", "meshctl emit -- mesh.ops.x --json"},
		{"meshctl emit mesh.ops.tail {} --node n", "meshctl --node n emit mesh.ops.tail {}"},
		{"meshctl tail module.# --help", "meshctl tail --help module.#"},
		{"meshctl", "meshctl"},
		// No flag of the path, written as a flag: after the leaf, which reports it.
		{"meshctl audit get ID --bogus", "meshctl audit get --bogus ID"},
		{"meshctl audit get ID --bogus=1", "meshctl audit get --bogus=1 ID"},
		{"meshctl audit get ID -x --timeout 5s", "meshctl audit get --timeout 5s -x ID"},
		{"meshctl audit --bogus get ID", "meshctl audit get --bogus ID"},
		{"meshctl dlq show ID1 --bogus ID2 --json", "meshctl dlq show --json --bogus ID1 ID2"},
		{"meshctl --bogus", "meshctl --bogus"},
		// Not written as a flag: an argument, where it was.
		{"meshctl emit mesh.ops.x -1", "meshctl emit mesh.ops.x -1"},
		{"meshctl emit mesh.ops.x -1.5e3 --node n", "meshctl --node n emit mesh.ops.x -1.5e3"},
		{"meshctl emit mesh.ops.x -{}", "meshctl emit mesh.ops.x -{}"},
		{"meshctl emit mesh.ops.x -", "meshctl emit mesh.ops.x -"},
		{"meshctl emit mesh.ops.x ---x", "meshctl emit mesh.ops.x ---x"},
		{"meshctl emit mesh.ops.x -- --bogus -x", "meshctl emit -- mesh.ops.x --bogus -x"},
		{"meshctl emit mesh.ops.x --node n -- --", "meshctl --node n emit -- mesh.ops.x --"},
		{"meshctl emit -- mesh.ops.x -1", "meshctl emit -- mesh.ops.x -1"},
		{"meshctl emit mesh.ops.x {} --", "meshctl emit -- mesh.ops.x {}"},
		// Shell completion: urfave/cli looks for its flag last.
		{"meshctl tail --j --generate-bash-completion", "meshctl tail --j --generate-bash-completion"},
		{"meshctl tail x --j --generate-bash-completion", "meshctl tail --j x --generate-bash-completion"},
	} {
		a := app()
		got := strings.Join(interspersed(a, strings.Fields(c.in)), " ")
		if got != c.want {
			t.Errorf("%s\n got  %s\n want %s", c.in, got, c.want)
		}
	}
}

// TestFlagsAfterArguments: the commands the issue names parse as the user
// meant them.
func TestFlagsAfterArguments(t *testing.T) {
	a := app()
	var pattern string
	var json bool
	for _, cmd := range a.Commands {
		if cmd.Name == "tail" {
			cmd.Action = func(c *cli.Context) error {
				pattern, json = c.Args().First(), c.Bool("json")
				if c.NArg() != 1 {
					t.Errorf("tail got %d arguments: %v", c.NArg(), c.Args().Slice())
				}
				return nil
			}
		}
	}
	if err := a.Run(interspersed(a, []string{"meshctl", "tail", "module.#", "--json"})); err != nil {
		t.Fatal(err)
	}
	if pattern != "module.#" || !json {
		t.Errorf("tail module.# --json: pattern %q, json %v", pattern, json)
	}
	if !slices.Equal(interspersed(a, []string{"x"}), []string{"x"}) {
		t.Error("a lone program name changed")
	}
}

// TestUnknownFlagAfterArguments: a flag no command of the path defines is
// reported as an unknown flag, named, with the usage exit code, wherever
// it is written; a token that starts with "-" but is no flag (a JSON body
// of -1) is still an argument.
func TestUnknownFlagAfterArguments(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string   // in the error; "" for none
		ran  []string // the arguments the command was given, when it ran
	}{
		{args: []string{"audit", "get", "01JID", "--bogus"}, want: "flag provided but not defined: -bogus"},
		{args: []string{"audit", "get", "01JID", "--bogus=1"}, want: "flag provided but not defined: -bogus"},
		{args: []string{"audit", "get", "01JID", "-x"}, want: "flag provided but not defined: -x"},
		{args: []string{"audit", "get", "--bogus", "01JID"}, want: "flag provided but not defined: -bogus"},
		{args: []string{"audit", "--bogus", "get", "01JID"}, want: "flag provided but not defined: -bogus"},
		{args: []string{"tail", "module.#", "--jsn"}, want: "flag provided but not defined: -jsn"},
		{args: []string{"dlq", "show", "ID1", "ID2", "--json", "--bogus"}, want: "flag provided but not defined: -bogus"},
		{args: []string{"emit", "mesh.ops.x", "{}", "--shema", "2"}, want: "flag provided but not defined: -shema"},
		{args: []string{"--bogus", "tail", "x"}, want: "flag provided but not defined: -bogus"},
		{args: []string{"audit", "get", "01JID", "01JOTHER"}, want: "get wants one ID, got 2 arguments"},
		{args: []string{"emit", "mesh.ops.x", "-1"}, ran: []string{"mesh.ops.x", "-1"}},
		{args: []string{"emit", "mesh.ops.x", "-1", "--schema", "2"}, ran: []string{"mesh.ops.x", "-1"}},
		{args: []string{"emit", "mesh.ops.x", "--", "-x"}, ran: []string{"mesh.ops.x", "-x"}},
		{args: []string{"emit", "--", "mesh.ops.x", "--bogus"}, ran: []string{"mesh.ops.x", "--bogus"}},
		{args: []string{"emit", "mesh.ops.x", "--", "--"}, ran: []string{"mesh.ops.x", "--"}},
		{args: []string{"audit", "get", "01JID", "--json"}, ran: []string{"01JID"}},
	} {
		a := app()
		var out strings.Builder
		a.Writer, a.ErrWriter = &out, &out
		var ran []string
		var stub func([]*cli.Command)
		stub = func(cmds []*cli.Command) { // no broker: what the command is given is enough
			for _, cmd := range cmds {
				if action := cmd.Action; action != nil {
					cmd.Action = func(c *cli.Context) error {
						if c.Command.Name == "get" && c.NArg() != 1 {
							return action(c) // its own usage error
						}
						ran = c.Args().Slice()
						return nil
					}
				}
				stub(cmd.Subcommands)
			}
		}
		stub(a.Commands)
		err := a.Run(interspersed(a, append([]string{"meshctl"}, c.args...)))
		switch {
		case c.want == "" && (err != nil || !slices.Equal(ran, c.ran)):
			t.Errorf("%q: %v; the command got %q, want %q", c.args, err, ran, c.ran)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%q: error %v, want one saying %q", c.args, err, c.want)
		case c.want != "" && exitCode(err) != exitUsage:
			t.Errorf("%q: exit %d (%v), want %d", c.args, exitCode(err), err, exitUsage)
		}
	}
}

// TestUnknownFlagExit runs the built meshctl with a flag it does not know
// after the arguments: it says which flag, on stderr, and exits 2 without
// touching the broker.
func TestUnknownFlagExit(t *testing.T) {
	bin := build(t)
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"audit", "get", "01JID", "--bogus"}, "-bogus"},
		{[]string{"audit", "get", "01JID", "--bogus=1"}, "-bogus"},
		{[]string{"dlq", "show", "01JID", "-x"}, "-x"},
		{[]string{"emit", "mesh.ops.x", "-1", "--bogus"}, "-bogus"},
	} {
		// A broker that is not there: were the command run, it would fail (exit 1).
		cmd := exec.Command(bin, append([]string{"--amqp-url", "amqp://guest:guest@127.0.0.1:1/"}, c.args...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != exitUsage {
			t.Errorf("%q: %v, want exit %d\n%s", c.args, err, exitUsage, stderr.String())
			continue
		}
		want := "meshctl: flag provided but not defined: " + c.flag + " (see --help)\n"
		if stderr.String() != want || stdout.Len() != 0 {
			t.Errorf("%q: stderr %q, stdout %q; want stderr %q", c.args, stderr.String(), stdout.String(), want)
		}
	}
}
