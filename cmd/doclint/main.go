// Command doclint reports exported Go names that have no doc comment, so that
// `go doc` of every package in the repository reads as documentation. It is
// run by `make lint`:
//
//	go run ./cmd/doclint [DIR...]
//
// With no arguments it checks the current directory. It walks every Go package
// under each DIR (a trailing /... is allowed and changes nothing), skipping testdata, vendor, bin and hidden directories,
// _test.go files and generated files (those with a "// Code generated ... DO
// NOT EDIT." line before the package clause), and prints one line per missing
// comment:
//
//	file:line: NAME has no doc comment
//
// It requires:
//
//   - a package comment in at least one file of each package, starting with
//     "Package <name>" (for package main any comment will do);
//   - a doc comment on every exported top-level func, type, const and var; a
//     const or var in a parenthesized group is documented by the group's
//     comment or by its own doc or line comment;
//   - a doc comment on every exported method of an exported type.
//
// Fields of structs and methods of interfaces are not checked. doclint exits
// with status 1 when it reports anything, 2 when it cannot read or parse a
// package, and 0 otherwise.
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	dirs := os.Args[1:]
	if len(dirs) == 0 {
		dirs = []string{"."}
	}
	os.Exit(run(dirs, os.Stdout, os.Stderr))
}

// run checks dirs, writes the findings to stdout and errors to stderr, and
// returns the exit status.
func run(dirs []string, stdout, stderr io.Writer) int {
	findings, err := check(dirs)
	if err != nil {
		fmt.Fprintln(stderr, "doclint:", err)
		return 2
	}
	for _, f := range findings {
		fmt.Fprintln(stdout, f)
	}
	if len(findings) > 0 {
		return 1
	}
	return 0
}

// A finding is one name that lacks a doc comment.
type finding struct {
	pos  token.Position
	name string
}

func (f finding) String() string {
	return fmt.Sprintf("%s:%d: %s has no doc comment", f.pos.Filename, f.pos.Line, f.name)
}

// check walks dirs and returns the findings for every package under them,
// sorted by file and line.
func check(dirs []string) ([]finding, error) {
	var pkgDirs []string
	seen := map[string]bool{}
	for _, root := range dirs {
		// Accept the go command's spelling too: ./sdk/... is ./sdk.
		if root = strings.TrimSuffix(root, "/..."); root == "..." || root == "" {
			root = "."
		}
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() {
				return nil
			}
			if path != root && skipDir(d.Name()) {
				return filepath.SkipDir
			}
			if clean := filepath.Clean(path); !seen[clean] {
				seen[clean] = true
				pkgDirs = append(pkgDirs, path)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}

	var findings []finding
	for _, dir := range pkgDirs {
		found, err := checkDir(dir)
		if err != nil {
			return nil, err
		}
		findings = append(findings, found...)
	}
	sort.SliceStable(findings, func(i, j int) bool {
		a, b := findings[i].pos, findings[j].pos
		if a.Filename != b.Filename {
			return a.Filename < b.Filename
		}
		return a.Line < b.Line
	})
	return findings, nil
}

// skipDir reports whether a directory of this name is left out of the walk,
// as the go command leaves it out of ./... .
func skipDir(name string) bool {
	switch name {
	case "testdata", "vendor", "bin":
		return true
	}
	return strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")
}

// checkDir parses the Go files directly in dir and checks each package they
// form. Files are grouped by package name, whatever their build constraints.
func checkDir(dir string) ([]finding, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	pkgs := map[string][]*ast.File{}
	var names []string
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") ||
			strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		if ast.IsGenerated(f) {
			continue
		}
		pkg := f.Name.Name
		if _, ok := pkgs[pkg]; !ok {
			names = append(names, pkg)
		}
		pkgs[pkg] = append(pkgs[pkg], f)
	}

	var findings []finding
	for _, pkg := range names {
		findings = append(findings, checkPackage(fset, pkg, pkgs[pkg])...)
	}
	return findings, nil
}

// checkPackage checks the package comment and the top-level declarations of
// one package, given its non-test, non-generated files in file-name order.
func checkPackage(fset *token.FileSet, pkg string, files []*ast.File) []finding {
	var findings []finding
	if !hasPackageDoc(pkg, files) {
		// Point at doc.go if there is one, else at the first file.
		at := files[0]
		for _, f := range files {
			if filepath.Base(fset.Position(f.Package).Filename) == "doc.go" {
				at = f
				break
			}
		}
		findings = append(findings, finding{fset.Position(at.Package), "package " + pkg})
	}
	for _, f := range files {
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if name, ok := funcName(d); ok && d.Doc == nil {
					findings = append(findings, finding{fset.Position(d.Name.Pos()), name})
				}
			case *ast.GenDecl:
				findings = append(findings, checkGenDecl(fset, d)...)
			}
		}
	}
	return findings
}

// hasPackageDoc reports whether one of files carries the package comment:
// one that starts "Package <pkg>", or for package main any comment.
func hasPackageDoc(pkg string, files []*ast.File) bool {
	for _, f := range files {
		if f.Doc == nil {
			continue
		}
		text := strings.TrimSpace(f.Doc.Text())
		if pkg == "main" && text != "" {
			return true
		}
		if rest, ok := strings.CutPrefix(text, "Package "+pkg); ok &&
			(rest == "" || !isIdentRune(rest[0])) {
			return true
		}
	}
	return false
}

func isIdentRune(c byte) bool {
	return c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// funcName returns the name a function or method is reported under ("F" or
// "T.M") and whether it needs a doc comment: an exported function, or an
// exported method of an exported receiver type.
func funcName(d *ast.FuncDecl) (string, bool) {
	if !d.Name.IsExported() {
		return "", false
	}
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return d.Name.Name, true
	}
	recv := receiverType(d.Recv.List[0].Type)
	if recv == "" || !ast.IsExported(recv) {
		return "", false
	}
	return recv + "." + d.Name.Name, true
}

// receiverType returns the name of the type in a receiver expression such as
// T, *T, T[K] or *T[K, V].
func receiverType(x ast.Expr) string {
	for {
		switch t := x.(type) {
		case *ast.Ident:
			return t.Name
		case *ast.StarExpr:
			x = t.X
		case *ast.ParenExpr:
			x = t.X
		case *ast.IndexExpr:
			x = t.X
		case *ast.IndexListExpr:
			x = t.X
		default:
			return ""
		}
	}
}

// checkGenDecl checks the exported types, consts and vars of one declaration.
func checkGenDecl(fset *token.FileSet, d *ast.GenDecl) []finding {
	var findings []finding
	grouped := d.Lparen.IsValid()
	for _, spec := range d.Specs {
		switch s := spec.(type) {
		case *ast.TypeSpec:
			if s.Name.IsExported() && d.Doc == nil && s.Doc == nil {
				findings = append(findings, finding{fset.Position(s.Name.Pos()), s.Name.Name})
			}
		case *ast.ValueSpec:
			if d.Doc != nil || s.Doc != nil || grouped && s.Comment != nil {
				continue
			}
			for _, n := range s.Names {
				if n.IsExported() {
					findings = append(findings, finding{fset.Position(n.Pos()), n.Name})
				}
			}
		}
	}
	return findings
}
