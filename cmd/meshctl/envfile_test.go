package main

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
)

// TestNodesReadsTheNodesEnvironmentFile: on a packaged host, meshctl nodes
// (as every command) takes the broker from the node's environment file
// (--env-file, MESH_ENV_FILE; /etc/mesh/meshd.env by default) when no flag
// nor variable names it, the password from its MESH_AMQP_PASSWORD_FILE;
// MESH_AMQP_URL wins over the file and --amqp-url over both. Hearing no
// node, it names the virtual host and the address it listened on, and the
// file it took them from, never the password. A file named explicitly
// that cannot be read is an error.
func TestNodesReadsTheNodesEnvironmentFile(t *testing.T) {
	withNode, empty := brokertest.VHost(t), brokertest.VHost(t)
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n, err := runtime.New(ctx, runtime.Config{Node: "packaged", AMQPURL: withNode, StateDir: t.TempDir(),
		HeartbeatInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())

	dir := t.TempDir()
	password := filepath.Join(dir, "amqp-password")
	if err := os.WriteFile(password, []byte("guest\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The URL without its password, as packaging/meshd.env shows it.
	envFile := filepath.Join(dir, "meshd.env")
	if err := os.WriteFile(envFile, []byte("# the node's environment\nMESH_NODE=packaged\n"+
		"MESH_AMQP_URL=\""+strings.Replace(withNode, "guest:guest@", "guest@", 1)+"\"\n"+
		"MESH_AMQP_PASSWORD_FILE="+password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	emptyFile := filepath.Join(dir, "empty.env")
	if err := os.WriteFile(emptyFile, []byte("MESH_AMQP_URL="+empty+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	meshctl := func(env []string, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, bin, args...)
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "MESH_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	vhost := func(url string) string {
		u, err := amqp.ParseURI(url)
		if err != nil {
			t.Fatal(err)
		}
		return u.Vhost
	}
	nobody := func(url, from string) string {
		s := `no node heard within 1s in virtual host "` + vhost(url) + `" at ` + brokertest.Host()
		if from != "" {
			s += " (the broker of " + from + ")"
		}
		return s + "\n"
	}

	for _, tc := range []struct {
		what       string
		env, args  []string
		want       string
		wantNobody string
	}{
		{what: "the file's broker", env: []string{"MESH_ENV_FILE=" + envFile}, want: "packaged"},
		{what: "MESH_AMQP_URL over the file's", env: []string{"MESH_ENV_FILE=" + envFile, "MESH_AMQP_URL=" + empty}, wantNobody: nobody(empty, "")},
		{what: "--amqp-url over MESH_AMQP_URL", env: []string{"MESH_ENV_FILE=" + emptyFile, "MESH_AMQP_URL=" + empty}, args: []string{"--amqp-url", withNode}, want: "packaged"},
		{what: "--env-file over MESH_ENV_FILE", env: []string{"MESH_ENV_FILE=" + envFile}, args: []string{"--env-file", emptyFile}, wantNobody: nobody(empty, emptyFile)},
	} {
		out, err := meshctl(tc.env, append(tc.args, "nodes", "--within", "1s")...)
		switch {
		case err != nil:
			t.Errorf("%s: %v\n%s", tc.what, err, out)
		case tc.want != "" && !strings.Contains(out, tc.want):
			t.Errorf("%s: nodes does not list %s:\n%s", tc.what, tc.want, out)
		case tc.wantNobody != "" && out != tc.wantNobody:
			t.Errorf("%s: nodes said\n\t%q\nwant\n\t%q", tc.what, out, tc.wantNobody)
		}
		if strings.Contains(out, ":guest@") {
			t.Errorf("%s: meshctl printed the password:\n%s", tc.what, out)
		}
	}

	// A file named explicitly must be read; one that names a password
	// file that cannot be read says so.
	if out, err := meshctl([]string{"MESH_ENV_FILE=" + filepath.Join(dir, "missing.env")}, "nodes", "--within", "1s"); err == nil || !strings.Contains(out, "--env-file: open "+filepath.Join(dir, "missing.env")) {
		t.Errorf("a missing --env-file: %v\n%s", err, out)
	}
	if err := os.Remove(password); err != nil {
		t.Fatal(err)
	}
	if out, err := meshctl([]string{"MESH_ENV_FILE=" + envFile}, "nodes", "--within", "1s"); err == nil || !strings.Contains(out, envFile+": MESH_AMQP_PASSWORD_FILE: amqp_password_file: open "+password) {
		t.Errorf("an unreadable password file: %v\n%s", err, out)
	}
}
