package main

import (
	"bufio"
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/internal/wire"
)

// scaffold holds the templates meshctl new module writes: common/ for
// every kind, and a directory per kind with its module, handler, tool and
// test.
//
//go:embed scaffold
var scaffold embed.FS

// meshModulePath is the Go module a scaffold builds against.
const meshModulePath = "github.com/meshkit/mesh"

// scaffoldKinds are the kinds new module writes, and the tool each
// serves (after the module's name).
var scaffoldKinds = map[string]string{"plain": "greet", "agent": "count", "dispatcher": "status"}

func newCommand() *cli.Command {
	return &cli.Command{
		Name:  "new",
		Usage: "start something new from a template",
		Subcommands: []*cli.Command{{
			Name:      "module",
			Usage:     "write a new module: main.go, a handler, a tool, their meshtest unit tests, a Makefile and the node-config entry",
			ArgsUsage: "NAME",
			Description: "Writes DIR (default ./NAME) as a Go module of its own that builds against the mesh source (--mesh),\n" +
				"then runs go mod tidy there. The module builds, and its tests pass, as written: cd NAME && make test.\n" +
				"Kinds: plain (handles an event, serves a tool), agent (does work asked by a call or an event),\n" +
				"dispatcher (hands each event to a tool elsewhere on the mesh).",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "kind", Value: "plain", Usage: "plain, agent or dispatcher"},
				&cli.StringFlag{Name: "dir", Usage: "where to write it (default ./NAME); it must not exist or be empty"},
				&cli.StringFlag{Name: "mesh", Usage: "the mesh source `DIR` to build against (default: the one this meshctl was built in, or above the working directory)"},
				&cli.StringFlag{Name: "go-module", Usage: "the new module's Go module `PATH` (default example.com/NAME)"},
				&cli.BoolFlag{Name: "with-db", Usage: "keep state in a SQLite database, NAME.db in the directory meshd gives the module (MESH_MODULE_DIR): the handler runs through the inbox and emits through the outbox (sdk/outbox), exactly once (kind plain)"},
				&cli.BoolFlag{Name: "no-tidy", Usage: "do not run go mod tidy afterwards"},
			},
			Action: newModule,
		}},
	}
}

// scaffoldData is what the templates are filled with.
type scaffoldData struct {
	Name, Kind, Tool, GoModule, GoVersion, MeshDir string
	// DB says --with-db: the db templates replace the kind's.
	DB bool
	// Tools and Calls are the module's grants (tools:, calls:), written
	// from here into both mesh.yaml's entry and the unit test's
	// meshtest.Grants, so the test refuses what the node will.
	Tools, Calls []string
}

// scaffoldFuncs render a grant list as mesh.yaml (yamlList) and as Go
// (goList) write it.
var scaffoldFuncs = template.FuncMap{
	"yamlList": func(l []string) string { return "[" + quotedList(l) + "]" },
	"goList":   func(l []string) string { return "[]string{" + quotedList(l) + "}" },
}

// quotedList is l's items quoted and joined by ", ".
func quotedList(l []string) string {
	q := make([]string, len(l))
	for i, s := range l {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, ", ")
}

func newModule(c *cli.Context) error {
	if c.NArg() != 1 {
		return usagef("new module wants NAME, got %d arguments", c.NArg())
	}
	name := c.Args().First()
	if err := wire.ValidateWord("module name", name); err != nil {
		return usagef("%v", err)
	}
	kind := c.String("kind")
	tool, ok := scaffoldKinds[kind]
	if !ok {
		return usagef("--kind %q is not plain, agent or dispatcher", kind)
	}
	if c.Bool("with-db") && kind != "plain" {
		return usagef("--with-db writes a plain module; drop --kind %s or --with-db", kind)
	}
	dir := c.String("dir")
	if dir == "" {
		dir = name
	}
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("new module: %s exists and is not empty", dir)
	}
	meshDir, err := findMeshSource(c.String("mesh"))
	if err != nil {
		return err
	}
	goVersion, err := goDirective(filepath.Join(meshDir, "go.mod"))
	if err != nil {
		return err
	}
	data := scaffoldData{Name: name, Tool: name + "." + tool, GoModule: c.String("go-module"), GoVersion: goVersion, MeshDir: meshDir, DB: c.Bool("with-db"),
		Tools: []string{name + ".*"}, Calls: []string{}}
	if kind != "plain" {
		data.Kind = kind
	}
	if kind == "dispatcher" {
		data.Calls = []string{"invoice.issue"}
	}
	if data.GoModule == "" {
		data.GoModule = "example.com/" + name
	}
	written, err := writeScaffold(dir, kind, data)
	if err != nil {
		return fmt.Errorf("new module: %w", err)
	}
	fmt.Fprintf(c.App.Writer, "wrote %s: module %s (kind %s), serving %s: %s\n", dir, name, kind, data.Tool, strings.Join(written, " "))
	if !c.Bool("no-tidy") {
		goTool, err := exec.LookPath("go")
		if err != nil {
			fmt.Fprintf(c.App.ErrWriter, "go is not on PATH: run go mod tidy in %s before building\n", dir)
			return nil
		}
		tidy := exec.CommandContext(c.Context, goTool, "mod", "tidy")
		tidy.Dir, tidy.Stdout, tidy.Stderr = dir, c.App.ErrWriter, c.App.ErrWriter
		if err := tidy.Run(); err != nil {
			return fmt.Errorf("new module: go mod tidy in %s: %w", dir, err)
		}
	}
	fmt.Fprintf(c.App.Writer, "next: cd %s && make test && make run\n", dir)
	return nil
}

// writeScaffold writes the common templates and those of kind into dir,
// then, with data.DB, the db templates over them. A template's name
// without .tmpl is its file's (gitignore is .gitignore).
func writeScaffold(dir, kind string, data scaffoldData) ([]string, error) {
	var written []string
	subs := []string{"common", kind}
	if data.DB {
		subs = append(subs, "db")
	}
	for _, sub := range subs {
		entries, err := fs.ReadDir(scaffold, path.Join("scaffold", sub))
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			text, err := fs.ReadFile(scaffold, path.Join("scaffold", sub, e.Name()))
			if err != nil {
				return nil, err
			}
			tmpl, err := template.New(e.Name()).Funcs(scaffoldFuncs).Option("missingkey=error").Parse(string(text))
			if err != nil {
				return nil, err
			}
			var out bytes.Buffer
			if err := tmpl.Execute(&out, data); err != nil {
				return nil, err
			}
			file := strings.TrimSuffix(e.Name(), ".tmpl")
			if file == "gitignore" {
				file = ".gitignore"
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, err
			}
			if err := os.WriteFile(filepath.Join(dir, file), out.Bytes(), 0o644); err != nil {
				return nil, err
			}
			written = append(written, file)
		}
	}
	slices.Sort(written)
	return slices.Compact(written), nil // a db template replaces the kind's file of its name
}

// findMeshSource is the mesh source directory: flag if given, else the
// one this meshctl was built in ($MESH/bin/meshctl), else the first
// directory above the working directory whose go.mod is the mesh's.
func findMeshSource(flag string) (string, error) {
	if flag != "" {
		abs, err := filepath.Abs(flag)
		if err != nil {
			return "", err
		}
		if !isMeshSource(abs) {
			return "", usagef("--mesh %s: no go.mod of %s there", flag, meshModulePath)
		}
		return abs, nil
	}
	var candidates []string
	if exe, err := os.Executable(); err == nil {
		if exe, err = filepath.EvalSymlinks(exe); err == nil {
			candidates = append(candidates, filepath.Dir(filepath.Dir(exe)))
		}
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			candidates = append(candidates, d)
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	for _, d := range candidates {
		if isMeshSource(d) {
			return d, nil
		}
	}
	return "", usagef("new module: where is the mesh source? give --mesh DIR (mesh is not published as a Go module yet, so a module builds against a clone)")
}

// isMeshSource says whether dir holds the go.mod of the mesh module.
func isMeshSource(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); strings.HasPrefix(line, "module ") {
			return strings.TrimSpace(strings.TrimPrefix(line, "module ")) == meshModulePath
		}
	}
	return false
}

// goDirective is the go version a go.mod asks for.
func goDirective(gomod string) (string, error) {
	b, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "go "); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", errors.New(gomod + ": no go directive")
}
