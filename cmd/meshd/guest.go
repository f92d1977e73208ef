package main

import (
	"context"
	"log/slog"

	"github.com/meshkit/mesh/internal/guest"
	"github.com/meshkit/mesh/runtime/nodeconfig"
)

// warnGuest warns, at start, when the broker of f's first address accepts
// guest/guest from this host, or when the node itself logs in as guest
// (internal/guest): any local process could then publish as any node and
// module. It tries within guest.Timeout, best effort, and says nothing
// when the broker refuses guest or does not answer (the node's own
// connection says why).
func warnGuest(ctx context.Context, log *slog.Logger, f nodeconfig.File) {
	cfg := f.Runtime()
	tc, err := cfg.TLS.ClientConfig()
	if err != nil {
		return // the node's own connection fails with why
	}
	c := guest.Probe(ctx, cfg.Brokers()[0], tc)
	for _, w := range c.Warnings() {
		log.Warn(w, "broker", c.Addr)
	}
}
