package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/testdir"
)

// TestTracesExportedWithOTLP: with OTEL_EXPORTER_OTLP_ENDPOINT set, meshd
// exports its spans over OTLP/HTTP; the span of its node.<n>.joined
// announcement reaches the collector.
func TestTracesExportedWithOTLP(t *testing.T) {
	url := brokertest.VHost(t)
	bin := filepath.Join(testdir.Reachable(t), "meshd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	got := make(chan []byte, 16)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method == http.MethodPost && r.URL.Path == "/v1/traces" {
			select {
			case got <- body:
			default:
			}
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	defer collector.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "run")
	cmd.Env = append(os.Environ(), "MESH_NODE=otlp", "MESH_AMQP_URL="+url, "MESH_STATE_DIR="+testdir.Reachable(t),
		"OTEL_EXPORTER_OTLP_ENDPOINT="+collector.URL, "OTEL_BSP_SCHEDULE_DELAY=100")
	var logs lockedBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	for found := false; !found; {
		select {
		case body := <-got:
			found = bytes.Contains(body, []byte("publish node.otlp.joined"))
		case <-ctx.Done():
			t.Fatalf("no span of node.otlp.joined reached the collector; meshd log:\n%s", logs.String())
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("meshd exited with %v; log:\n%s", err, logs.String())
	}
}
