package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/runtime/nodeconfig"
)

// describeTimeout bounds how long config check waits for one module binary
// to describe itself.
const describeTimeout = 30 * time.Second

// configCheck is `meshd config check`: the configuration run would use,
// validated, and then each module's binary started far enough to describe
// itself (as meshd run starts it: as its user, confined, with its
// settings, in a directory of its own that is thrown away, without
// joining the mesh), and held to its entry: the module protocol, the
// name and kind, and every call, served tool, consumed queue, dead-letter
// handler and history read it declares against the entry's grants. It
// names every problem with its entry and the fix, and exits 1 on any.
func configCheck(c *cli.Context) error {
	f, err := config(c)
	if err != nil {
		return err
	}
	modules := fmt.Sprintf("%d modules", len(f.Modules))
	if len(f.Modules) == 1 {
		modules = "1 module"
	}
	if c.Bool("skip-binaries") || len(f.Modules) == 0 {
		fmt.Fprintf(c.App.Writer, "config ok: node %s, %s\n", f.Node, modules)
		return nil
	}
	if err := checkBinaries(c.Context, c.App.Writer, f, c.String("config")); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	fmt.Fprintf(c.App.Writer, "config ok: node %s, %s; each binary described itself within its entry's grants, of a module protocol this meshd serves (%s)\n",
		f.Node, modules, runtime.Build().ModuleProtocols)
	return nil
}

// checkBinaries describes each module of f and holds it to its entry.
func checkBinaries(ctx context.Context, out io.Writer, f nodeconfig.File, configPath string) error {
	// The modules' directories are made in a state dir of the check's own,
	// thrown away after; the node's own (and the config) stay closed to
	// them, as under meshd run.
	stateDir, err := os.MkdirTemp("", "meshd-config-check-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stateDir)
	iso, err := newIsolation(f, stateDir, configPath)
	if err != nil {
		return err
	}
	iso.out = out
	defer iso.close()
	// The node's own state dir, defaulted as meshd run defaults it.
	if dir := f.Runtime().Resolved().StateDir; dir != "" {
		iso.secrets = append(iso.secrets, dir)
	}
	log := slog.New(slog.DiscardHandler)
	var errs []error
	for i, m := range f.Modules {
		if err := checkBinary(ctx, f.Node, iso, i, m, log); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkBinary describes module i of the config and holds it to its entry.
func checkBinary(ctx context.Context, node string, iso *isolation, i int, m nodeconfig.Module, log *slog.Logger) error {
	entry := fmt.Sprintf("modules[%d] (%s, %s)", i, m.Name, m.Path)
	mc := m.ModuleConfig()
	h, err := iso.apply(node, i, m, &mc)
	if err != nil {
		return err
	}
	iso.report(entry, h)
	ctx, cancel := context.WithTimeout(ctx, describeTimeout)
	defer cancel()
	d, err := runtime.DescribeModule(ctx, m.Path, m.Args, mc, log)
	if err != nil {
		return fmt.Errorf("%s: %w", entry, err)
	}
	var errs []error
	if d.Def.Name != m.Name {
		errs = append(errs, fmt.Errorf("the binary says it is module %q, and its entry says %q: fix the entry's name or its path", d.Def.Name, m.Name))
	}
	if m.Kind != "" && d.Def.Kind != m.Kind {
		errs = append(errs, fmt.Errorf("the binary says it is of kind %q, and its entry says %q", d.Def.Kind, m.Kind))
	}
	if err := runtime.CheckGrants(d, mc); err != nil {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			errs = append(errs, j.Unwrap()...)
		} else {
			errs = append(errs, err)
		}
	}
	for i, err := range errs { // one line each, naming the entry
		errs[i] = fmt.Errorf("%s: %w", entry, err)
	}
	return errors.Join(errs...)
}
