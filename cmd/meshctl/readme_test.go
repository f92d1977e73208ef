package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

// TestREADMEExamples: every meshctl example in docs/commands.md's examples block
// is written with its flags after its arguments, as people type them, and
// meshctl reads it as meant: the command path, each --flag as that flag
// with its value, and every other word as an argument, in order. (What
// each command then does is the other tests' business.)
func TestREADMEExamples(t *testing.T) {
	readme, err := os.ReadFile("../../docs/commands.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "<!-- meshctl examples -->\n```sh\n")
	if !ok {
		t.Fatal("docs/commands.md has no meshctl examples block")
	}
	block, _, _ = strings.Cut(block, "```")
	lines := strings.Split(strings.TrimSpace(block), "\n")
	if len(lines) < 10 {
		t.Fatalf("only %d examples", len(lines))
	}
	for _, line := range lines {
		words, err := shellWords(line)
		if err != nil || len(words) < 2 || words[0] != "meshctl" {
			t.Errorf("example %q: %v", line, err)
			continue
		}
		a := app()
		var got *cli.Context
		capture := func(c *cli.Context) error { got = c; return nil }
		var replace func([]*cli.Command)
		replace = func(cmds []*cli.Command) {
			for _, c := range cmds {
				if c.Action != nil {
					c.Action = capture
				}
				replace(c.Subcommands)
			}
		}
		replace(a.Commands)
		if err := a.Run(interspersed(a, words)); err != nil || got == nil {
			t.Errorf("example %q: %v", line, err)
			continue
		}
		// The words: the command path, then arguments and flags mixed.
		var path []string
		for _, c := range got.Lineage() {
			if c.Command != nil && c.Command.Name != "" {
				path = append([]string{c.Command.Name}, path...)
			}
		}
		if len(path) < 2 || len(path) > len(words) || !slices.Equal(words[:len(path)], path) { // meshctl and its command(s)
			t.Errorf("example %q ran %q", line, path)
			continue
		}
		var args []string
		rest := words[len(path):]
		sawArg, flagAfterArg := false, false
		for i := 0; i < len(rest); i++ {
			w := rest[i]
			if !strings.HasPrefix(w, "--") {
				args = append(args, w)
				sawArg = true
				continue
			}
			flagAfterArg = flagAfterArg || sawArg
			name := strings.TrimPrefix(w, "--")
			f := flagNamed(a, got, name)
			if f == nil || !got.IsSet(name) {
				t.Errorf("example %q: %s was not read as a flag", line, w)
				continue
			}
			if _, isBool := f.(*cli.BoolFlag); isBool {
				continue
			}
			i++
			if i == len(rest) {
				t.Errorf("example %q: %s has no value", line, w)
				break
			}
			if v := got.Value(name); !sameValue(v, rest[i]) {
				t.Errorf("example %q: %s is %v, want %s", line, w, v, rest[i])
			}
		}
		if !slices.Equal(got.Args().Slice(), args) && !(len(args) == 0 && got.NArg() == 0) {
			t.Errorf("example %q: arguments %q, want %q", line, got.Args().Slice(), args)
		}
		if len(args) > 0 && !flagAfterArg && strings.Contains(line, " --") {
			t.Errorf("example %q: its flags come before its arguments; the examples show them after", line)
		}
	}
}

// flagNamed is the flag called name of the command c ran, or of the app.
func flagNamed(a *cli.App, c *cli.Context, name string) cli.Flag {
	for _, fs := range [][]cli.Flag{c.Command.Flags, a.Flags} {
		for _, f := range fs {
			if slices.Contains(f.Names(), name) {
				return f
			}
		}
	}
	return nil
}

// sameValue says whether a flag's parsed value v is what word says.
func sameValue(v any, word string) bool {
	switch v := v.(type) {
	case time.Duration:
		d, err := time.ParseDuration(word)
		return err == nil && d == v
	case cli.StringSlice:
		return slices.Contains(v.Value(), word)
	case *cli.StringSlice:
		return slices.Contains(v.Value(), word)
	case []string:
		return slices.Contains(v, word)
	}
	return fmt.Sprint(v) == word
}

// shellWords splits a line as sh does for plain words and single-quoted
// strings (all the examples use).
func shellWords(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord, quoted := false, false
	for _, r := range line {
		switch {
		case quoted && r == '\'':
			quoted = false
		case quoted:
			cur.WriteRune(r)
		case r == '\'':
			quoted, inWord = true, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case r == '"' || r == '\\' || r == '$' || r == '`':
			return nil, fmt.Errorf("%q: use single quotes", line)
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("%q: unclosed quote", line)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}
