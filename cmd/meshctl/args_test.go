package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// TestInterspersedFlags: flags after arguments are moved where urfave/cli
// reads them (after the command that defines them, with their values);
// arguments keep their order; a token that is no flag of the command stays
// an argument; nothing after "--" moves.
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
		{"meshctl emit mesh.ops.x -- --json", "meshctl emit mesh.ops.x -- --json"},
		{"meshctl emit mesh.ops.tail {} --node n", "meshctl --node n emit mesh.ops.tail {}"},
		{"meshctl tail module.# --help", "meshctl tail --help module.#"},
		{"meshctl", "meshctl"},
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
