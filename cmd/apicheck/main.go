package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// An interrupt stops the check; the temporary worktree is still removed.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
