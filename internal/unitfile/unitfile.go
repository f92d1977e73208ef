// Package unitfile reads a systemd unit file, packaging/meshd.service
// above all, so that the tests that start meshd as the packaged unit
// starts it (test/hostile, test/release, an as-shipped suite) take its
// user, capabilities, no_new_privs, umask and working directory from the
// file the package installs rather than restating them.
//
//	u, err := unitfile.Read("packaging/meshd.service")
//	svc, err := u.Service()
//	cmd := exec.Command("setpriv", append(svc.Setpriv(uid, gid), "meshd", "run")...)
//
// It reads what systemd.syntax(7) defines: [Section] headers, Key=Value
// lines, comments (# and ;) and lines continued with a backslash. Of the
// settings, Service reads only the few a test needs to start meshd as
// systemd would; it refuses what it cannot render faithfully (an inverted
// capability list) rather than guess.
package unitfile

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
)

// Unit is a parsed unit file: each section's assignments, in file order.
type Unit struct {
	sections map[string][]assignment
}

// assignment is one Key=Value line.
type assignment struct {
	key, value string
	line       int
}

// Read parses the unit file at path.
func Read(path string) (*Unit, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("unit file: %w", err)
	}
	defer f.Close()
	u, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("unit file %s: %w", path, err)
	}
	return u, nil
}

// Parse parses a unit file's text.
func Parse(r io.Reader) (*Unit, error) {
	u := &Unit{sections: map[string][]assignment{}}
	section := ""
	sc := bufio.NewScanner(r)
	n, pending, start := 0, "", 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if pending == "" && (line == "" || line[0] == '#' || line[0] == ';') {
			continue
		}
		if pending != "" && (strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";")) {
			continue // a comment within a continued line is skipped
		}
		if pending == "" {
			start = n
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			pending += cont + " "
			continue
		}
		line, pending = pending+line, ""
		if strings.HasPrefix(line, "[") {
			if !strings.HasSuffix(line, "]") {
				return nil, fmt.Errorf("line %d: a section header without ]: %q", start, line)
			}
			section = line[1 : len(line)-1]
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("line %d: not Key=Value: %q", start, line)
		}
		if section == "" {
			return nil, fmt.Errorf("line %d: %s before any [section]", start, strings.TrimSpace(key))
		}
		u.sections[section] = append(u.sections[section], assignment{key: strings.TrimSpace(key), value: strings.TrimSpace(value), line: start})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if pending != "" {
		return nil, fmt.Errorf("line %d: the file ends within a continued line", start)
	}
	return u, nil
}

// Values is every value assigned to key in section, in file order (an
// empty one included: for list settings it resets what came before).
func (u *Unit) Values(section, key string) []string {
	var vs []string
	for _, a := range u.sections[section] {
		if a.key == key {
			vs = append(vs, a.value)
		}
	}
	return vs
}

// Value is the last value assigned to key in section, as systemd takes a
// setting of one value; ok is false if none is.
func (u *Unit) Value(section, key string) (value string, ok bool) {
	vs := u.Values(section, key)
	if len(vs) == 0 {
		return "", false
	}
	return vs[len(vs)-1], true
}

// Service is how the unit's [Service] starts its process: what a test
// needs to start it the same way without systemd.
type Service struct {
	// User and Group are User= and Group= (empty: root's).
	User, Group string
	// AmbientCapabilities and CapabilityBoundingSet are the capabilities'
	// names as the unit writes them (CAP_SETUID), every assignment
	// merged as systemd merges them. Bounded is false where the unit sets
	// no CapabilityBoundingSet= (the process keeps the full bounding set).
	AmbientCapabilities, CapabilityBoundingSet []string
	Bounded                                    bool
	// NoNewPrivileges is NoNewPrivileges=.
	NoNewPrivileges bool
	// UMask is UMask= (systemd's default, 0022, where the unit sets none).
	UMask fs.FileMode
	// WorkingDirectory is WorkingDirectory= ("" where unset).
	WorkingDirectory string
	// ExecStart is ExecStart='s command line, split on white space, its
	// special prefixes (-, @, :, +, !) removed.
	ExecStart []string
}

// Service reads the unit's [Service] section.
func (u *Unit) Service() (Service, error) {
	const s = "[Service]"
	if _, ok := u.sections["Service"]; !ok {
		return Service{}, errors.New("unit file: no " + s + " section")
	}
	svc := Service{UMask: 0o022}
	svc.User, _ = u.Value("Service", "User")
	svc.Group, _ = u.Value("Service", "Group")
	svc.WorkingDirectory, _ = u.Value("Service", "WorkingDirectory")
	svc.WorkingDirectory = strings.TrimPrefix(svc.WorkingDirectory, "-")
	var err error
	if svc.AmbientCapabilities, err = capabilities(u.Values("Service", "AmbientCapabilities")); err != nil {
		return Service{}, fmt.Errorf("unit file: AmbientCapabilities=: %w", err)
	}
	if bs := u.Values("Service", "CapabilityBoundingSet"); len(bs) > 0 {
		svc.Bounded = true
		if svc.CapabilityBoundingSet, err = capabilities(bs); err != nil {
			return Service{}, fmt.Errorf("unit file: CapabilityBoundingSet=: %w", err)
		}
	}
	if v, ok := u.Value("Service", "NoNewPrivileges"); ok {
		if svc.NoNewPrivileges, err = boolean(v); err != nil {
			return Service{}, fmt.Errorf("unit file: NoNewPrivileges=: %w", err)
		}
	}
	if v, ok := u.Value("Service", "UMask"); ok {
		m, err := strconv.ParseUint(v, 8, 32)
		if err != nil || m > 0o777 {
			return Service{}, fmt.Errorf("unit file: UMask=%s is not an octal mode", v)
		}
		svc.UMask = fs.FileMode(m)
	}
	if v, ok := u.Value("Service", "ExecStart"); ok {
		svc.ExecStart = strings.Fields(v)
		if len(svc.ExecStart) > 0 {
			svc.ExecStart[0] = strings.TrimLeft(svc.ExecStart[0], "-@:+!")
		}
	}
	return svc, nil
}

// capabilities merges a list setting's assignments as systemd does: each
// adds its capabilities, an empty one clears the list. An inverted list
// (~CAP_X: all but) is refused: a test could not say what it holds.
func capabilities(assignments []string) ([]string, error) {
	var caps []string
	seen := map[string]bool{}
	for _, a := range assignments {
		if a == "" {
			caps, seen = nil, map[string]bool{}
			continue
		}
		if strings.HasPrefix(a, "~") {
			return nil, fmt.Errorf("%q: an inverted list is not read here", a)
		}
		for _, c := range strings.Fields(a) {
			c = strings.ToUpper(c)
			if !strings.HasPrefix(c, "CAP_") {
				return nil, fmt.Errorf("%q is not a capability's name", c)
			}
			if !seen[c] {
				seen[c] = true
				caps = append(caps, c)
			}
		}
	}
	return caps, nil
}

// boolean reads a systemd boolean.
func boolean(v string) (bool, error) {
	switch strings.ToLower(v) {
	case "1", "yes", "y", "true", "t", "on":
		return true, nil
	case "0", "no", "n", "false", "f", "off":
		return false, nil
	}
	return false, fmt.Errorf("%q is not a boolean", v)
}

// SetprivCaps is caps as setpriv(1) writes a list of them:
// +setuid,+setgid.
func SetprivCaps(caps []string) string {
	out := make([]string, len(caps))
	for i, c := range caps {
		out[i] = "+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
	}
	return strings.Join(out, ",")
}

// Setpriv is the setpriv(1) command (its argv, to which the command to
// run is appended) that starts a process as the unit's User= (here uid
// and gid, which the caller resolves: the unit's user, or a stand-in where
// the machine has none), with its supplementary groups, the unit's
// AmbientCapabilities= raised (inheritable and ambient, so permitted and
// effective after the exec), its CapabilityBoundingSet= as the whole
// bounding set, and no_new_privs where NoNewPrivileges=yes. The umask and
// working directory are the caller's to set (Shell, cmd.Dir).
func (s Service) Setpriv(uid, gid int) []string {
	argv := []string{"setpriv", "--reuid=" + strconv.Itoa(uid), "--regid=" + strconv.Itoa(gid), "--init-groups"}
	if len(s.AmbientCapabilities) > 0 {
		c := SetprivCaps(s.AmbientCapabilities)
		argv = append(argv, "--inh-caps="+c, "--ambient-caps="+c)
	}
	if s.Bounded {
		b := "-all"
		if len(s.CapabilityBoundingSet) > 0 {
			b += "," + SetprivCaps(s.CapabilityBoundingSet)
		}
		argv = append(argv, "--bounding-set="+b)
	}
	if s.NoNewPrivileges {
		argv = append(argv, "--no-new-privs")
	}
	return argv
}

// Shell wraps argv in sh -c so that it runs with the unit's umask:
// appended to Setpriv's argv, it starts argv as the unit would (but for
// the working directory: set cmd.Dir to WorkingDirectory).
func (s Service) Shell(argv ...string) []string {
	return append([]string{"sh", "-c", fmt.Sprintf(`umask %04o && exec "$@"`, s.UMask), "sh"}, argv...)
}
