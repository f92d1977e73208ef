package main

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"
)

// meshctl's exit codes (the README lists them).
const (
	exitOK = 0
	// exitFailed: the command ran and failed: the broker refused or
	// could not be reached, a call's tool answered with an error,
	// topology check found differences, a replay was returned.
	exitFailed = 1
	// exitUsage: the command was not run: an unknown command or flag, a
	// flag's bad value, or the wrong number of arguments.
	exitUsage = 2
	// exitUndecided: meshctl schema check could not decide (a keyword
	// its checker does not decide, a document not found).
	exitUndecided = 2
)

// errUsage is what errors in how meshctl was called match (errors.Is).
var errUsage = errors.New("usage")

// usageError is an error in how meshctl was called.
type usageError struct{ err error }

func (e *usageError) Error() string        { return e.err.Error() }
func (e *usageError) Unwrap() error        { return e.err }
func (e *usageError) Is(target error) bool { return target == errUsage }

// usagef is a usage error with a message, as fmt.Errorf makes it.
func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// exitCode is the exit status for what Run returned.
func exitCode(err error) int {
	var ec cli.ExitCoder
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errUsage):
		return exitUsage
	case errors.Is(err, errUndecided):
		return exitUndecided
	case errors.As(err, &ec):
		return exitUsage // urfave/cli's own: "No help topic for ..."
	}
	return exitFailed
}

// markUsageErrors makes the flag errors urfave/cli finds, in a and every
// command under it, usage errors, and keeps urfave/cli from exiting the
// process itself (main does, with exitCode).
func markUsageErrors(a *cli.App) {
	onUsage := func(_ *cli.Context, err error, _ bool) error { return &usageError{fmt.Errorf("%w (see --help)", err)} }
	a.OnUsageError = onUsage
	a.ExitErrHandler = func(*cli.Context, error) {}
	var walk func([]*cli.Command)
	walk = func(cmds []*cli.Command) {
		for _, c := range cmds {
			c.OnUsageError = onUsage
			walk(c.Subcommands)
		}
	}
	walk(a.Commands)
}
