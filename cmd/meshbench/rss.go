package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// benchRSS measures the memory of the real meshd binary: idle with no
// module, and with 10 module processes (countplugin), the node and its
// children together, each read from /proc once /readyz says ready and a
// second has passed.
func benchRSS(url string, o options) error {
	dir, err := os.MkdirTemp("", "meshbench-rss-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bins := map[string]string{"meshd": "./cmd/meshd", "countplugin": "./cmd/meshbench/countplugin"}
	for name, pkg := range bins {
		bins[name] = filepath.Join(dir, name)
		if out, err := exec.Command("go", "build", "-o", bins[name], pkg).CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %v\n%s", pkg, err, out)
		}
	}
	fmt.Printf("\n== memory of meshd (RSS, from /proc, 1 s after /readyz says ready) ==\n")
	idle, err := meshdRSS(bins["meshd"], dir, url, "")
	if err != nil {
		return fmt.Errorf("idle: %w", err)
	}
	var modules strings.Builder
	modules.WriteString("modules:\n")
	for i := range 10 {
		fmt.Fprintf(&modules, "  - name: count%d\n    path: %s\n    args: [\"-name\", \"count%d\", \"1000000000\"]\n", i, bins["countplugin"], i)
	}
	ten, err := meshdRSS(bins["meshd"], dir, url, modules.String())
	if err != nil {
		return fmt.Errorf("10 module processes: %w", err)
	}
	fmt.Printf("idle node %.1f MB; node with 10 module processes %.1f MB in all\n", idle, ten)
	record("idle node RSS", idle, 40, false, " MB")
	record("node + 10 module processes, RSS in all", ten, 250, false, " MB")
	return nil
}

// meshdRSS runs meshd with modules (config text) and returns the RSS in MB
// of it and its child processes once ready.
func meshdRSS(meshd, dir, url, modules string) (float64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	addr := ln.Addr().String()
	ln.Close()
	state, err := os.MkdirTemp(dir, "state-")
	if err != nil {
		return 0, err
	}
	cfg := filepath.Join(state, "mesh.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("node: rss\namqp_url: %s\nstate_dir: %s\nhttp_addr: %s\n%s", url, state, addr, modules)), 0o600); err != nil {
		return 0, err
	}
	cmd := exec.Command(meshd, "run", "--config", cfg, "--log-level", "error")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("meshd not ready within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second)
	kb := rssKB(cmd.Process.Pid)
	for _, child := range children(cmd.Process.Pid) {
		kb += rssKB(child)
	}
	return float64(kb) / 1024, nil
}

// rssKB is the resident set of process pid in kB (VmRSS), or 0.
func rssKB(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.Atoi(f[0])
				return n
			}
		}
	}
	return 0
}

// children are the pids whose parent is pid.
func children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after ')'.
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 {
			if f := strings.Fields(s[i+1:]); len(f) > 1 && f[1] == strconv.Itoa(pid) {
				out = append(out, child)
			}
		}
	}
	return out
}
