package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/runtime/nodeconfig"
)

// nodeEnvFile is the packaged meshd's environment (packaging/meshd.env,
// systemd's EnvironmentFile): the node's broker and its credentials.
const nodeEnvFile = "/etc/mesh/meshd.env"

// envFileFlags are the variables of the node's environment file meshctl
// takes, each with the flag it sets. MESH_AMQP_PASSWORD_FILE is set into
// the file's URLs as meshd sets it. MESH_NODE is not taken: it is the
// node's own name, and meshctl emits under a name of its own.
var envFileFlags = []struct{ env, flag string }{
	{"MESH_AMQP_URL", "amqp-url"},
	{"MESH_AMQP_URLS", "amqp-urls"},
	{"MESH_TLS_CA_FILE", "tls-ca-file"},
	{"MESH_TLS_CERT_FILE", "tls-cert-file"},
	{"MESH_TLS_KEY_FILE", "tls-key-file"},
	{"MESH_TLS_SERVER_NAME", "tls-server-name"},
}

// envFileMeta is the App.Metadata key of the environment file meshctl
// took its broker from, for messages that name where it listened.
const envFileMeta = "broker-from"

// applyEnvFile is the app's Before: when neither --amqp-url nor
// --amqp-urls (nor their MESH_ variables) names the broker, meshctl takes
// the node's, from --env-file (MESH_ENV_FILE; default the packaged
// /etc/mesh/meshd.env): each of envFileFlags the file sets and no flag or
// variable does. The default file is skipped when it does not exist or
// cannot be read (it is root's, mode 0600); a file named explicitly must
// be read. So the broker is: the flags, then the environment, then the
// node's environment file, then the default.
func applyEnvFile(c *cli.Context) error {
	path := c.String("env-file")
	if path == "" || c.IsSet("amqp-url") || c.IsSet("amqp-urls") {
		return nil
	}
	vars, err := readEnvFile(path)
	if err != nil {
		if !c.IsSet("env-file") && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission)) {
			return nil
		}
		return fmt.Errorf("--env-file: %w", err)
	}
	var urls []string
	if u := vars["MESH_AMQP_URLS"]; u != "" {
		urls = strings.Split(u, ",")
	}
	if pf := vars["MESH_AMQP_PASSWORD_FILE"]; pf != "" {
		f := nodeconfig.File{AMQPURL: vars["MESH_AMQP_URL"], AMQPURLs: urls, AMQPPasswordFile: pf}
		if err := f.ApplyPasswordFile(); err != nil {
			return fmt.Errorf("%s: MESH_AMQP_PASSWORD_FILE: %w", path, err)
		}
		vars["MESH_AMQP_URL"], urls = f.AMQPURL, f.AMQPURLs
	}
	vars["MESH_AMQP_URLS"] = strings.Join(urls, ",")
	took := false
	for _, v := range envFileFlags {
		if val := vars[v.env]; val != "" && !c.IsSet(v.flag) {
			if err := c.Set(v.flag, val); err != nil {
				return fmt.Errorf("%s: %s: %w", path, v.env, err)
			}
			took = took || strings.HasPrefix(v.flag, "amqp-url")
		}
	}
	if took {
		c.App.Metadata[envFileMeta] = path
	}
	return nil
}

// readEnvFile reads an environment file as systemd's EnvironmentFile
// reads it: KEY=VALUE lines, blank lines and lines starting with # or ;
// ignored, a value in single or double quotes unquoted (\" and \\ in
// double quotes), a line ending in \ continued on the next.
func readEnvFile(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	vars := map[string]string{}
	text := strings.ReplaceAll(string(b), "\\\n", "")
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		key, val, ok := strings.Cut(line, "=")
		if !ok {
			continue // systemd ignores such a line too
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		if len(val) >= 2 && val[0] == '\'' && val[len(val)-1] == '\'' {
			val = val[1 : len(val)-1]
		} else if len(val) >= 2 && val[0] == '"' && val[len(val)-1] == '"' {
			val = strings.NewReplacer(`\"`, `"`, `\\`, `\`).Replace(val[1 : len(val)-1])
		}
		vars[key] = val
	}
	return vars, nil
}

// brokerPlace says where meshctl listened: the virtual host and the
// address of its first broker URL, never its credentials, and the
// environment file it took them from, if it did.
func brokerPlace(c *cli.Context) string {
	raw := brokerURLs(c)[0]
	u, err := amqp.ParseURI(raw)
	if err != nil {
		return "at " + redactURL(raw)
	}
	vhost := u.Vhost
	if vhost == "" {
		vhost = "/"
	}
	place := fmt.Sprintf("in virtual host %q at %s:%d", vhost, u.Host, u.Port)
	if from, ok := c.App.Metadata[envFileMeta].(string); ok {
		place += " (the broker of " + from + ")"
	}
	return place
}
