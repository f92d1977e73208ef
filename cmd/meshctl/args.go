package main

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/urfave/cli/v2"
)

// interspersed rewrites args (os.Args) so that flags may come after
// arguments, as with git, kubectl and docker: urfave/cli v2 stops reading
// flags at the first argument (`meshctl tail 'module.#' --json` would take
// --json as a second pattern). It walks the command path, and moves each
// flag it finds after an argument to just after the command that defines
// it (a global flag after the app's name), with its value when it takes
// one. A token that looks like a flag ("-" or "--" then a letter: --bogus,
// --bogus=1, -x) but is no flag of the path goes just after the leaf
// command, where urfave/cli reports it as an unknown flag, naming it,
// rather than as an argument too many. Any other token starting with "-"
// (-1, -, -{...}) stays where it is, among the arguments (a JSON body of
// -1, say). Everything after "--" is left alone, as arguments after the
// others; the "--" goes before them all, where the flag parser takes it
// as the end of the flags and drops it. A last --generate-bash-completion
// stays last, where urfave/cli looks for it.
func interspersed(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	var completion []string
	if args[len(args)-1] == "--generate-bash-completion" {
		args, completion = args[:len(args)-1], args[len(args)-1:]
	}
	// levels[i] is the i-th command on the path (the app is level 0): its
	// flags, and the tokens that go right after its name.
	type level struct {
		flags map[string]cli.Flag
		moved []string
	}
	flagsOf := func(fs []cli.Flag) map[string]cli.Flag {
		m := make(map[string]cli.Flag)
		for _, f := range fs {
			for _, name := range f.Names() {
				m[name] = f
			}
		}
		return m
	}
	levels := []*level{{flags: flagsOf(app.Flags)}}
	path := []string{args[0]} // the app and command names, in order
	var positional []string   // the leaf's arguments, in order
	var unknown []string      // flag-like tokens no command of the path defines
	var verbatim []string     // the arguments after "--"
	dashes := false           // there was a "--"
	commands := app.Commands
	leaf := false                                  // an argument has been seen: no more subcommands
	find := func(name string) (*level, cli.Flag) { // the innermost level defining name
		for i := len(levels) - 1; i >= 0; i-- {
			if f, ok := levels[i].flags[name]; ok {
				return levels[i], f
			}
		}
		return nil, nil
	}
	rest := args[1:]
	for i := 0; i < len(rest); i++ {
		tok := rest[i]
		if tok == "--" {
			verbatim, dashes = rest[i+1:], true
			break
		}
		if strings.HasPrefix(tok, "-") && tok != "-" {
			name, _, hasValue := strings.Cut(strings.TrimLeft(tok, "-"), "=")
			if name == "help" || name == "h" { // urfave/cli's own, on every command
				levels[len(levels)-1].moved = append(levels[len(levels)-1].moved, tok)
				continue
			}
			if lv, f := find(name); lv != nil {
				lv.moved = append(lv.moved, tok)
				if !hasValue && takesValue(f) && i+1 < len(rest) {
					i++
					lv.moved = append(lv.moved, rest[i])
				}
				continue
			}
			if looksLikeFlag(tok) { // meant as a flag, but none of the path's: the leaf reports it
				unknown = append(unknown, tok)
				continue
			}
			positional = append(positional, tok) // not a flag: an argument (-1, -{...})
			leaf = true
			continue
		}
		if !leaf {
			if c := commandNamed(commands, tok); c != nil {
				path = append(path, tok)
				levels = append(levels, &level{flags: flagsOf(c.Flags)})
				commands = c.Subcommands
				continue
			}
		}
		positional = append(positional, tok)
		leaf = true
	}
	last := levels[len(levels)-1]
	last.moved = append(last.moved, unknown...)
	out := make([]string, 0, len(args)+len(completion))
	for i, name := range path {
		out = append(out, name)
		out = append(out, levels[i].moved...)
	}
	if dashes {
		// "--" before every argument, where the flag parser reads it as
		// the end of the flags (after an argument it would be one).
		out = append(out, "--")
	}
	out = append(out, positional...)
	out = append(out, verbatim...)
	return append(out, completion...)
}

// looksLikeFlag says whether tok is written as a flag: "-" or "--", then
// a letter (-x, --bogus, --bogus=1). "-1", "-" and "-{...}" are not: they
// can be arguments (a JSON body, standard input).
func looksLikeFlag(tok string) bool {
	name, ok := strings.CutPrefix(tok, "--")
	if !ok {
		name, ok = strings.CutPrefix(tok, "-")
	}
	if !ok {
		return false
	}
	r, _ := utf8.DecodeRuneInString(name)
	return unicode.IsLetter(r)
}

// commandNamed returns the command of cmds called name (or by an alias).
func commandNamed(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// takesValue says whether f reads the next token as its value: every flag
// but a boolean one.
func takesValue(f cli.Flag) bool {
	_, isBool := f.(*cli.BoolFlag)
	return !isBool
}
