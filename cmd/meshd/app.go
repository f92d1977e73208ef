package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/runtime"
)

func app() *cli.App {
	return &cli.App{
		Name:  "meshd",
		Usage: "run a mesh node",
		Commands: []*cli.Command{{
			Name:  "run",
			Usage: "start a node and run until SIGTERM or SIGINT",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "node", EnvVars: []string{"MESH_NODE"}, Required: true, Usage: "this node's `NAME`, unique on the mesh"},
				&cli.StringFlag{Name: "amqp-url", EnvVars: []string{"MESH_AMQP_URL"}, Value: runtime.DefaultAMQPURL, Usage: "the broker's `URL`"},
				&cli.StringFlag{Name: "state-dir", EnvVars: []string{"MESH_STATE_DIR"}, Usage: "node-local state `DIR` (default ~/.local/state/mesh/NODE)"},
				&cli.StringFlag{Name: "log-level", EnvVars: []string{"MESH_LOG_LEVEL"}, Value: "info", Usage: "debug, info, warn or error"},
				&cli.DurationFlag{Name: "grace", EnvVars: []string{"MESH_GRACE"}, Value: 30 * time.Second, Usage: "how long in-flight handlers may finish on stop"},
			},
			Action: run,
		}},
	}
}

func run(c *cli.Context) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGTERM, os.Interrupt)
	defer stop()

	node, err := runtime.New(ctx, runtime.Config{
		Node:     c.String("node"),
		AMQPURL:  c.String("amqp-url"),
		StateDir: c.String("state-dir"),
		Logger:   log,
	})
	if err != nil {
		return err
	}
	if _, err := node.Emit(ctx, node.Name(), "node."+node.Name()+".joined", map[string]any{}); err != nil {
		log.Warn("could not announce the node", "err", err)
	}
	log.Info("node running; SIGTERM or SIGINT stops it")
	select {
	case <-ctx.Done():
	case <-node.Done():
		// Reconnecting is not built yet: exit non-zero so the supervisor
		// restarts the node; unacked deliveries return to their queues.
		_ = node.Close(context.Background())
		return node.Err()
	}

	shutdown, cancel := context.WithTimeout(context.Background(), c.Duration("grace")+5*time.Second)
	defer cancel()
	if _, err := node.Emit(shutdown, node.Name(), "node."+node.Name()+".left", map[string]any{}); err != nil {
		log.Warn("could not announce the node leaving", "err", err)
	}
	if err := node.Close(shutdown); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	log.Info("node stopped")
	return nil
}
