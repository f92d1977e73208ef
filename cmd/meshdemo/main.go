// Command meshdemo runs a node with the example modules in-process: umami
// emits module.umami.site.created, notifier handles each one and emits
// module.notifier.notification.sent. `make demo` runs it beside
// `meshctl tail`.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/meshkit/mesh/examples/notifier"
	"github.com/meshkit/mesh/examples/umami"
	"github.com/meshkit/mesh/runtime"
)

func main() {
	duration := flag.Duration("duration", 0, "stop after this long (default: on SIGINT or SIGTERM)")
	interval := flag.Duration("interval", time.Second, "how often umami creates a site")
	node := flag.String("node", "demo", "node name")
	state := flag.String("state-dir", "", "state dir (default: a temporary one)")
	flag.Parse()
	if err := run(*node, *state, *duration, *interval); err != nil {
		fmt.Fprintln(os.Stderr, "meshdemo:", err)
		os.Exit(1)
	}
}

func run(name, state string, duration, interval time.Duration) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, duration)
		defer cancel()
	}
	if state == "" {
		dir, err := os.MkdirTemp("", "meshdemo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		state = dir
	}
	url := os.Getenv("MESH_AMQP_URL")
	node, err := runtime.New(ctx, runtime.Config{
		Node:     name,
		AMQPURL:  url,
		StateDir: state,
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		node.Close(ctx)
	}()
	if _, err := node.Load(ctx, notifier.Module(os.Stdout), runtime.ModuleConfig{}); err != nil {
		return err
	}
	if _, err := node.Load(ctx, umami.Module(interval), runtime.ModuleConfig{}); err != nil {
		return err
	}
	fmt.Printf("meshdemo: node %q runs modules umami and notifier\n", name)
	<-ctx.Done()
	return nil
}
