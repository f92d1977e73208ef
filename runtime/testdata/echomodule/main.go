// Command echomodule is a module binary for the runtime's plugin tests: it
// answers mesh.test.* events as their body says.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/process"
)

// The state of "hold" and "poison" (TestCrashChargesOnlyTheEventAlone):
// how many holds are in flight, and whether a poison came to this process.
var (
	holding  = sync.NewCond(&sync.Mutex{})
	held     int
	poisoned atomic.Bool
)

func main() {
	name := "echo"
	if len(os.Args) > 1 {
		name = os.Args[1] // another instance of the same code, under another name
	}
	if name == "exit-at-start" {
		// A module that cannot start: it says why on stderr, before any
		// handshake, and exits, as one given a database it cannot write.
		fmt.Fprintln(os.Stderr, "open /var/lib/mesh/ledger.db: permission denied")
		os.Exit(3)
	}
	var mesh sdk.Mesh
	err := process.Run(sdk.Module{
		Name:  name,
		Emits: []string{"pong", "called", "tick"},
		Setup: func(m sdk.Mesh) error {
			mesh = m
			if len(os.Args) > 2 {
				// A marker file that, once it exists, makes the binary
				// another module: one more handler, ahead of the others.
				if _, err := os.Stat(os.Args[2]); err == nil {
					if err := m.On("mesh.extra.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error { return nil })); err != nil {
						return err
					}
				}
			}
			if name != "echo" {
				return m.On("mesh."+name+".#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
					os.Exit(4) // crashes on everything it gets
					return nil
				}))
			}
			if err := m.Serve("echo.upper", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
				var s string
				if err := req.Decode(&s); err != nil {
					return nil, sdk.Permanent(err)
				}
				switch s {
				case "":
					return nil, &sdk.ToolError{Code: "empty", Message: "nothing to shout", Permanent: true}
				case "busy":
					return nil, errors.New("too busy to shout")
				case "never":
					return nil, sdk.Permanent(errors.New("will never shout that"))
				}
				return strings.ToUpper(s) + " (asked by " + req.Caller + ")", nil
			})); err != nil {
				return err
			}
			return m.On("mesh.test.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				var cmd struct {
					Do  string
					N   int
					Log string
					Key string
				}
				if err := ev.Decode(&cmd); err != nil {
					return sdk.Permanent(err)
				}
				switch cmd.Do {
				case "pong":
					_, err := mesh.Emit(ctx, "pong", map[string]any{"ping": ev.ID, "attempt": ev.Attempt}, sdk.WithSchema("1"))
					return err
				case "keyed": // a pong with a key (module protocol 8)
					_, err := mesh.Emit(ctx, "pong", map[string]any{"ping": ev.ID, "attempt": ev.Attempt}, sdk.WithSchema("1"), sdk.WithKey(cmd.Key))
					return err
				case "crash":
					os.Exit(3)
				case "hold":
					// Held in flight until the process dies, in a process
					// where a poison came or before any did (no marker in
					// Log yet); handled (a pong) otherwise.
					if _, err := os.Stat(filepath.Join(cmd.Log, "killed")); err == nil && !poisoned.Load() {
						_, err := mesh.Emit(ctx, "pong", map[string]any{"ping": ev.ID, "attempt": ev.Attempt}, sdk.WithSchema("1"))
						return err
					}
					holding.L.Lock()
					held++
					holding.Broadcast()
					holding.L.Unlock()
					select {} // until the poison kills the process
				case "poison":
					// Kills its own process with SIGKILL: the first time
					// once N holds are in flight beside it, then at once.
					poisoned.Store(true)
					marker := filepath.Join(cmd.Log, "killed")
					if _, err := os.Stat(marker); err != nil {
						holding.L.Lock()
						for held < cmd.N {
							holding.Wait()
						}
						holding.L.Unlock()
					}
					if err := os.WriteFile(marker, nil, 0o600); err != nil {
						return err
					}
					_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
					select {}
				case "panic":
					panic("the module broke")
				case "hang":
					select {} // ignores its deadline and never returns
				case "fail":
					return errors.New("not now")
				case "permanent":
					return sdk.Permanent(errors.New("never"))
				case "call":
					var answer string
					if err := mesh.Call(ctx, "test.echo", "hello", &answer); err != nil {
						_, emitErr := mesh.Emit(ctx, "called", map[string]string{"error": err.Error()})
						return emitErr
					}
					_, err := mesh.Emit(ctx, "called", map[string]string{"answer": answer})
					return err
				case "stream":
					// Emits N tick events, one every 2 ms, in the
					// background, writing the id of each emit that
					// succeeded (confirmed, or on the node's disk) to Log.
					go stream(mesh, cmd.N, cmd.Log)
					return nil
				case "late":
					late(ctx, mesh, ev.Attempt, cmd.Log)
					return nil
				case "log":
					mesh.Logger().Warn("echo was asked to log", "attempt", ev.Attempt)
					return nil
				case "forge":
					_, err := mesh.Emit(ctx, "mesh.secret.thing", 1, sdk.AsFullType())
					_, granted := mesh.Emit(ctx, "mesh.granted.thing", 1, sdk.AsFullType())
					_, emitErr := mesh.Emit(ctx, "called", map[string]any{"forbidden": errors.Is(err, sdk.ErrForbidden), "granted": granted == nil})
					return emitErr
				case "bad-name":
					_, err := mesh.Emit(ctx, "bad..name", 1)
					_, emitErr := mesh.Emit(ctx, "called", map[string]bool{"invalid": errors.Is(err, sdk.ErrInvalid)})
					return emitErr
				}
				return fmt.Errorf("unknown command %q", cmd.Do)
			}))
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// stream emits n "tick" events and appends the id of each successful emit,
// one per line, to the file at path.
func stream(mesh sdk.Mesh, n int, path string) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		mesh.Logger().Error("stream: open log", "err", err)
		return
	}
	defer f.Close()
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		id, err := mesh.Emit(ctx, "tick", map[string]int{"i": i})
		cancel()
		if err != nil {
			mesh.Logger().Error("stream: emit", "i", i, "err", err)
			continue
		}
		if _, err := f.WriteString(id + "\n"); err != nil {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// late is a handling that outlives its deadline, as a process stopped past
// its handler's timeout does: attempt n writes dir/started-n, waits for
// dir/release-n, then emits pong, ignoring its deadline (its causation
// and handling stay), and writes the id it got, or the error, to
// dir/emitted-n.
func late(ctx context.Context, mesh sdk.Mesh, attempt int, dir string) {
	name := func(what string) string { return filepath.Join(dir, fmt.Sprintf("%s-%d", what, attempt)) }
	if err := os.WriteFile(name("started"), nil, 0o600); err != nil {
		mesh.Logger().Error("late: started", "err", err)
		return
	}
	for {
		if _, err := os.Stat(name("release")); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	id, err := mesh.Emit(context.WithoutCancel(ctx), "pong", map[string]string{"late": "yes"})
	out := "id " + id
	if err != nil {
		out = "error " + err.Error()
	}
	if err := os.WriteFile(name("emitted"), []byte(out), 0o600); err != nil {
		mesh.Logger().Error("late: emitted", "err", err)
	}
}
