package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBashCompletion: the script `meshctl completion bash` prints, sourced
// in bash, completes commands, subcommands and flags by asking the meshctl
// binary in PATH.
func TestBashCompletion(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash here")
	}
	dir := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "meshctl"), ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	complete := func(words ...string) string {
		t.Helper()
		script := `source <(meshctl completion bash) || exit 3
COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
_meshctl_complete
echo "${COMPREPLY[*]}"`
		cmd := exec.Command(bash, append([]string{"-c", script, "bash"}, words...)...)
		cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("complete %q: %v\n%s", words, err, stderr.String())
		}
		return strings.TrimSpace(string(out))
	}
	for _, c := range []struct {
		words []string
		want  string
	}{
		{[]string{"meshctl", "dl"}, "dlq"},
		{[]string{"meshctl", "t"}, "tail topology"},
		{[]string{"meshctl", "dlq", "re"}, "replay"},
		{[]string{"meshctl", "topology", "p"}, "print permissions"},
		{[]string{"meshctl", "tail", "--j"}, "--json"},
		{[]string{"meshctl", "topology", "check", "--no-"}, "--no-bindings"},
	} {
		if got := complete(c.words...); got != c.want {
			t.Errorf("%q completes to %q, want %q", c.words, got, c.want)
		}
	}
	for _, sh := range []string{"zsh", "fish"} {
		out, err := exec.Command(filepath.Join(dir, "meshctl"), "completion", sh).Output()
		if err != nil || !strings.Contains(string(out), "meshctl") || !strings.Contains(string(out), "dlq") && sh == "fish" {
			t.Errorf("completion %s: %v\n%s", sh, err, out)
		}
	}
}

// TestExitCodes: 0 for success, 2 for a usage error (unknown command or
// flag, a bad flag value, wrong arguments), 1 for a command that ran and
// failed, as the README documents.
func TestExitCodes(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{"meshctl", "completion", "bash"}, exitOK},
		{[]string{"meshctl", "nosuch"}, exitUsage},
		{[]string{"meshctl", "tail"}, exitUsage},
		{[]string{"meshctl", "tail", "x", "--bogus"}, exitUsage},
		{[]string{"meshctl", "call", "tool", "{}", "--timeout", "soon"}, exitUsage},
		{[]string{"meshctl", "graph", "--format", "png"}, exitUsage},
		{[]string{"meshctl", "dlq", "purge", "--amqp-url", "amqp://guest:guest@127.0.0.1:1/"}, exitUsage},
		{[]string{"meshctl", "completion", "tcsh"}, exitUsage},
		{[]string{"meshctl", "emit", "mesh.ops.x", "{}", "--amqp-url", "amqp://guest:guest@127.0.0.1:1/"}, exitFailed},
	} {
		a := app()
		var out bytes.Buffer
		a.Writer, a.ErrWriter = &out, &out
		err := a.Run(interspersed(a, c.args))
		if got := exitCode(err); got != c.want {
			t.Errorf("%q: exit %d (%v), want %d", c.args, got, err, c.want)
		}
	}
}
