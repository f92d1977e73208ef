package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/cmd/meshctl/console"
)

// consoleTokensFlag is --tokens, the operators' tokens file, of meshctl
// console and its token subcommands.
func consoleTokensFlag() cli.Flag {
	return &cli.StringFlag{Name: "tokens", EnvVars: []string{"MESH_CONSOLE_TOKENS"},
		Usage: "the operators' tokens `FILE` (default $XDG_CONFIG_HOME/mesh/console-tokens, else ~/.config/mesh/console-tokens)"}
}

// consoleTokenFile is the tokens file --tokens names, or the default one
// in the user's config directory.
func consoleTokenFile(c *cli.Context) (*console.TokenFile, error) {
	if p := c.String("tokens"); p != "" {
		return console.OpenTokenFile(p), nil
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return nil, usagef("the operators' tokens file: no config directory (%v): give --tokens FILE", err)
	}
	return console.OpenTokenFile(filepath.Join(dir, "mesh", "console-tokens")), nil
}

// consoleTokenCommand is `meshctl console token`: the operators' tokens.
func consoleTokenCommand() *cli.Command {
	return &cli.Command{
		Name: "token",
		Usage: "make, list and revoke the operators' console tokens (the file keeps only their SHA-256; " +
			"a running console sees a change at its next request)",
		Subcommands: []*cli.Command{{
			Name:      "add",
			Usage:     "make a token for NAME and print it, once (alone on stdout); actions taken with it are logged with NAME",
			ArgsUsage: "NAME",
			Flags: []cli.Flag{
				&cli.BoolFlag{Name: "read-only", Usage: "the token may view every page but take no action"},
				consoleTokensFlag(),
			},
			Action: consoleTokenAdd,
		}, {
			Name:   "list",
			Usage:  "list the tokens: name, access, created (never the token)",
			Flags:  []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print one JSON object per line"}, consoleTokensFlag()},
			Action: consoleTokenList,
		}, {
			Name:      "revoke",
			Usage:     "remove NAME's token: a running console refuses it from its next request",
			ArgsUsage: "NAME",
			Flags:     []cli.Flag{consoleTokensFlag()},
			Action:    consoleTokenRevoke,
		}},
	}
}

func consoleTokenAdd(c *cli.Context) error {
	if c.NArg() != 1 {
		return usagef("token add wants one NAME, got %d arguments", c.NArg())
	}
	name := c.Args().First()
	if err := console.ValidTokenName(name); err != nil {
		return usagef("%v", err)
	}
	tf, err := consoleTokenFile(c)
	if err != nil {
		return err
	}
	secret, err := tf.Add(name, c.Bool("read-only"), time.Now())
	if err != nil {
		return err
	}
	fmt.Fprintln(c.App.Writer, secret)
	fmt.Fprintf(c.App.ErrWriter, "token %s (%s) added to %s; it is shown this once. Log in with it at the console's /login, or send it as Authorization: Bearer.\n",
		name, tokenAccess(c.Bool("read-only")), tf.Path())
	return nil
}

func consoleTokenList(c *cli.Context) error {
	if c.NArg() != 0 {
		return usagef("token list takes no arguments, got %q", c.Args().Slice())
	}
	tf, err := consoleTokenFile(c)
	if err != nil {
		return err
	}
	ts, err := tf.Tokens()
	if err != nil {
		return err
	}
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		for _, t := range ts {
			if err := enc.Encode(map[string]string{"name": t.Name, "access": tokenAccess(t.ReadOnly), "created": t.Created.UTC().Format(time.RFC3339)}); err != nil {
				return err
			}
		}
		return nil
	}
	if len(ts) == 0 {
		fmt.Fprintf(c.App.Writer, "no tokens in %s\n", tf.Path())
		return nil
	}
	w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tACCESS\tCREATED")
	for _, t := range ts {
		fmt.Fprintf(w, "%s\t%s\t%s\n", t.Name, tokenAccess(t.ReadOnly), t.Created.UTC().Format(time.RFC3339))
	}
	return w.Flush()
}

func consoleTokenRevoke(c *cli.Context) error {
	if c.NArg() != 1 {
		return usagef("token revoke wants one NAME, got %d arguments", c.NArg())
	}
	tf, err := consoleTokenFile(c)
	if err != nil {
		return err
	}
	if err := tf.Revoke(c.Args().First()); err != nil {
		if errors.Is(err, console.ErrNoToken) {
			return fmt.Errorf("%w (meshctl console token list lists them)", err)
		}
		return err
	}
	fmt.Fprintf(c.App.Writer, "revoked %s (%s): a running console refuses it from its next request\n", c.Args().First(), tf.Path())
	return nil
}

// tokenAccess names a token's access as the tokens file does.
func tokenAccess(readOnly bool) string {
	if readOnly {
		return "read-only"
	}
	return "read-write"
}
