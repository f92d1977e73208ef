package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/meshkit/mesh/internal/caps"
	"github.com/meshkit/mesh/runtime/nodeconfig"
)

// changesUsers reports whether meshd can run its modules as users of their
// own: it runs as root, or as a user of its own holding the capabilities
// that takes (caps.ForModuleUsers: the packaged unit, docs/adr/0047-packages-and-the-hardened-unit.md).
func changesUsers() bool {
	return len(missingForModuleUsers()) == 0
}

// dropAmbientCaps empties the ambient and inheritable capability sets of
// a meshd that is not root (systemd's AmbientCapabilities put them there),
// so that no program meshd starts inherits one: a module running as meshd's user or
// as another, unconfined, would otherwise keep CAP_SETUID and could become
// root. meshd keeps them effective, for itself; a module's launcher gets
// the two it needs, and drops them (runtime, internal/confine). It fails
// where meshd cannot drop them (a build with cgo): meshd then refuses to
// start rather than hand them on.
func dropAmbientCaps() error {
	if os.Geteuid() == 0 {
		return nil
	}
	s, err := caps.Current()
	if err != nil || s.Ambient == 0 {
		return nil
	}
	if err := caps.ClearAmbient(); err != nil {
		return fmt.Errorf("meshd holds ambient capabilities (%#x) that every program it starts would inherit, and cannot drop them: %w; build meshd with CGO_ENABLED=0, as make release does, or start it without ambient capabilities", uint64(s.Ambient), err)
	}
	return nil
}

// missingForModuleUsers is what meshd lacks to run its modules as users
// of their own: none where it runs as root or holds them all (or where
// the system has no capabilities to read), else those of
// caps.ForModuleUsers it does not hold effective.
func missingForModuleUsers() []caps.Cap {
	if os.Geteuid() == 0 {
		return nil
	}
	s, err := caps.Current()
	if err != nil {
		return caps.ForModuleUsers
	}
	return s.Effective.Missing(caps.ForModuleUsers...)
}

// capsFix is what to do to give meshd the capabilities in missing: the
// lines to add to its unit, or root.
func capsFix(missing []caps.Cap) string {
	names := capNames(missing)
	return fmt.Sprintf("add to the [Service] of meshd's unit (systemctl edit meshd) AmbientCapabilities=%s and CapabilityBoundingSet=%s, as the packaged unit has them (packaging/meshd.service), or run meshd as root",
		names, names)
}

// capNames is cs's names, space-separated, as a unit writes them.
func capNames(cs []caps.Cap) string {
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = c.String()
	}
	return strings.Join(names, " ")
}

// warnModuleUsers warns, at start, where meshd was meant to run its
// modules as users of their own and cannot (missing): the config gives
// a module a user of its own (user:), meshd holds some of the
// capabilities that takes but not all (a unit that gives them, short of
// one), or it runs as the system service meshd.service (the packaged
// unit). A meshd run by hand as an ordinary user, with no capability and
// no user: in its config, runs its modules as its own user, confined by
// Landlock, as documented (docs/security.md), without a warning.
func warnModuleUsers(log *slog.Logger, f nodeconfig.File, missing []caps.Cap, held caps.Set, unit string) {
	if len(missing) == 0 {
		return
	}
	var why []string
	for i, m := range f.Modules {
		if wantsOwnUser(m) {
			why = append(why, fmt.Sprintf("modules[%d] (%s) says user: %s", i, m.Name, m.User))
		}
	}
	var has []caps.Cap
	for _, c := range caps.ForModuleUsers {
		if held.Has(c) {
			has = append(has, c)
		}
	}
	if len(has) > 0 {
		why = append(why, "meshd holds "+capNames(has)+" of the capabilities that takes")
	}
	if unit != "" {
		why = append(why, "meshd runs as the system service "+unit)
	}
	if len(why) == 0 {
		return
	}
	log.Warn(fmt.Sprintf("meshd cannot give its modules users of their own: it runs as uid %d without %s, so its modules run as meshd's user and an entry that says user: does not start; %s",
		os.Geteuid(), capNames(missing), capsFix(missing)),
		"missing", capNames(missing), "why", why)
}

// warnModuleUsersAtStart is warnModuleUsers with meshd's own
// capabilities and service.
func warnModuleUsersAtStart(log *slog.Logger, f nodeconfig.File) {
	var held caps.Set
	if s, err := caps.Current(); err == nil {
		held = s.Effective
	}
	warnModuleUsers(log, f, missingForModuleUsers(), held, systemService())
}

// wantsOwnUser reports whether entry m asks for a user other than
// meshd's own (user: auto, root, or a name or uid not meshd's).
func wantsOwnUser(m nodeconfig.Module) bool {
	if m.User == "" {
		return false
	}
	if m.User == "auto" {
		return true
	}
	c, err := lookupUser(m.User)
	return err != nil || c.UID != uint32(os.Geteuid()) || c.GID != uint32(os.Getegid())
}

// systemService is the systemd system service meshd runs as, where that
// is meshd's (a unit whose name starts with meshd: meshd.service,
// meshd@NODE.service), from /proc/self/cgroup; "" elsewhere.
func systemService() string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	return meshdService(string(b))
}

// meshdService reads a /proc/PID/cgroup's lines (cgroup v2's 0::PATH or
// v1's N:CONTROLLERS:PATH): the name of the service whose cgroup is under
// /system.slice, if it is meshd's.
func meshdService(cgroup string) string {
	for line := range strings.Lines(cgroup) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/system.slice/") {
			continue
		}
		elems := strings.Split(parts[2], "/")
		for i := len(elems) - 1; i >= 0; i-- {
			if strings.HasSuffix(elems[i], ".service") {
				if strings.HasPrefix(elems[i], "meshd") {
					return elems[i]
				}
				break
			}
		}
	}
	return ""
}
