package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// caller is one implementation of request/reply under test.
type rpcSide interface {
	call(ctx context.Context, body []byte) ([]byte, error)
	close()
}

func benchRPC(url string, o options) error {
	fmt.Printf("\n== RPC: echo of a 256-byte JSON body; %d sequential calls, then %d calls from %d concurrent callers ==\n",
		o.rpcSequential, o.rpcCalls, o.rpcCallers)
	var rawP50, rawP99, meshP50, meshP99, rawTP, meshTP []float64
	mk := map[string]func() (rpcSide, error){
		"raw":  func() (rpcSide, error) { return newRawRPC(url) },
		"mesh": func() (rpcSide, error) { return newMeshRPC(url) },
	}
	for r := 0; r < o.rounds; r++ {
		for _, name := range []string{"raw", "mesh"} {
			side, err := mk[name]()
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			p50, p99, err := sequentialCalls(side, o.rpcSequential)
			if err != nil {
				side.close()
				return fmt.Errorf("%s sequential: %w", name, err)
			}
			tp, err := concurrentCalls(side, o.rpcCalls, o.rpcCallers)
			side.close()
			if err != nil {
				return fmt.Errorf("%s concurrent: %w", name, err)
			}
			fmt.Printf("round %d %-4s  round trip p50 %6.3f ms  p99 %6.3f ms   %d callers %8.0f calls/s\n", r+1, name, p50, p99, o.rpcCallers, tp)
			if name == "raw" {
				rawP50, rawP99, rawTP = append(rawP50, p50), append(rawP99, p99), append(rawTP, tp)
			} else {
				meshP50, meshP99, meshTP = append(meshP50, p50), append(meshP99, p99), append(meshTP, tp)
			}
		}
	}
	record("RPC round trip p50 / raw", pairedRatio(meshP50, rawP50), 1.2, false, "")
	record(fmt.Sprintf("RPC %d concurrent callers / raw", o.rpcCallers), pairedRatio(meshTP, rawTP), 0.85, true, "")
	fmt.Printf("round trip p50  raw %.3f ms  mesh %.3f ms   ratio mesh/raw %.2f   (target <= 1.2)\n",
		median(rawP50), median(meshP50), median(meshP50)/median(rawP50))
	fmt.Printf("round trip p99  raw %.3f ms  mesh %.3f ms   ratio mesh/raw %.2f\n",
		median(rawP99), median(meshP99), median(meshP99)/median(rawP99))
	fmt.Printf("%d callers     raw %.0f calls/s  mesh %.0f calls/s   ratio mesh/raw %.2f   (target >= 0.85)\n",
		o.rpcCallers, median(rawTP), median(meshTP), median(meshTP)/median(rawTP))
	return nil
}

func sequentialCalls(s rpcSide, n int) (p50, p99 float64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b := body(0)
	for range 100 { // warm up
		if _, err := s.call(ctx, b); err != nil {
			return 0, 0, err
		}
	}
	lat := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if _, err := s.call(ctx, b); err != nil {
			return 0, 0, err
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	q := func(f float64) float64 { return float64(lat[int(f*float64(len(lat)-1))]) / float64(time.Millisecond) }
	return q(0.5), q(0.99), nil
}

func concurrentCalls(s rpcSide, n, callers int) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b := body(0)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	start := time.Now()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				if _, err := s.call(ctx, b); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// meshRPC serves and calls the echo tool through a node each.
type meshRPC struct {
	server, client *runtime.Node
	url, tool      string
}

func newMeshRPC(url string) (rpcSide, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	state, err := os.MkdirTemp("", "meshbench-rpc-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(state) // nothing in it outlives the nodes' start
	mk := func(name string) (*runtime.Node, error) {
		return runtime.New(ctx, runtime.Config{Node: name, AMQPURL: url, StateDir: filepath.Join(state, name),
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}
	server, err := mk("rpcserver")
	if err != nil {
		return nil, err
	}
	r := &meshRPC{server: server, url: url, tool: fmt.Sprintf("bench.echo%d", meshRuns.Add(1))}
	if _, err := server.Load(ctx, sdk.Module{Name: "echo", Setup: func(m sdk.Mesh) error {
		return m.Serve(r.tool, sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
			return req.Body, nil
		}))
	}}, runtime.ModuleConfig{}); err != nil {
		server.Close(ctx)
		return nil, err
	}
	if r.client, err = mk("rpcclient"); err != nil {
		server.Close(ctx)
		return nil, err
	}
	return r, nil
}

func (r *meshRPC) call(ctx context.Context, b []byte) ([]byte, error) {
	var resp json.RawMessage
	err := r.client.Call(ctx, "bench", r.tool, json.RawMessage(b), &resp)
	return resp, err
}

func (r *meshRPC) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r.client.Close(ctx)
	r.server.Close(ctx)
	_ = deleteQueue(r.url, "serve."+r.tool)
}

// rawRPC is the baseline: plain amqp091-go request/reply with the same
// settings: a durable classic serve queue on a topic exchange, prefetch 32
// with 32 server goroutines replying on the consuming channel, transient
// mandatory requests with an expiration, one exclusive server-named reply
// queue, correlation ids.
type rawRPC struct {
	serverConn, pubConn, subConn *amqp.Connection
	pub                          *amqp.Channel
	replyQueue, queue            string

	mu      sync.Mutex
	pending map[string]chan amqp.Delivery
}

func newRawRPC(url string) (rpcSide, error) {
	r := &rawRPC{pending: make(map[string]chan amqp.Delivery), queue: fmt.Sprintf("raw.serve.echo%d", meshRuns.Add(1))}
	var err error
	fail := func(err error) (rpcSide, error) { r.close(); return nil, err }
	if r.serverConn, err = amqp.Dial(url); err != nil {
		return nil, err
	}
	if r.pubConn, err = amqp.Dial(url); err != nil {
		return fail(err)
	}
	if r.subConn, err = amqp.Dial(url); err != nil {
		return fail(err)
	}
	sch, err := r.serverConn.Channel()
	if err != nil {
		return fail(err)
	}
	if err := sch.ExchangeDeclare("raw.rpc", "topic", true, false, false, false, nil); err != nil {
		return fail(err)
	}
	if _, err := sch.QueueDeclare(r.queue, true, false, false, false, amqp.Table{"x-queue-type": "classic"}); err != nil {
		return fail(err)
	}
	if err := sch.QueueBind(r.queue, r.queue, "raw.rpc", false, nil); err != nil {
		return fail(err)
	}
	if err := sch.Qos(32, 0, false); err != nil {
		return fail(err)
	}
	requests, err := sch.Consume(r.queue, "", false, false, false, false, nil)
	if err != nil {
		return fail(err)
	}
	for range 32 {
		go func() {
			for d := range requests {
				_ = sch.Publish("", d.ReplyTo, false, false, amqp.Publishing{
					Headers:     amqp.Table{"x-status": "ok", "x-source": "echo", "x-node": "rawserver"},
					ContentType: "application/json", CorrelationId: d.CorrelationId, Timestamp: time.Now().UTC(), Body: d.Body,
				})
				_ = d.Ack(false)
			}
		}()
	}
	if r.pub, err = r.pubConn.Channel(); err != nil {
		return fail(err)
	}
	rch, err := r.subConn.Channel()
	if err != nil {
		return fail(err)
	}
	q, err := rch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return fail(err)
	}
	r.replyQueue = q.Name
	replies, err := rch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		return fail(err)
	}
	go func() {
		for d := range replies {
			r.mu.Lock()
			ch, ok := r.pending[d.CorrelationId]
			delete(r.pending, d.CorrelationId)
			r.mu.Unlock()
			if ok {
				ch <- d
			}
		}
	}()
	return r, nil
}

func (r *rawRPC) call(ctx context.Context, b []byte) ([]byte, error) {
	now := time.Now().UTC()
	id := ulid.MustNew(ulid.Timestamp(now), ulid.DefaultEntropy()).String()
	ch := make(chan amqp.Delivery, 1)
	r.mu.Lock()
	r.pending[id] = ch
	r.mu.Unlock()
	// The same metadata as the mesh's requests, so both do the same work.
	err := r.pub.Publish("raw.rpc", r.queue, true, false, amqp.Publishing{
		Headers: amqp.Table{
			"x-event-id": id, "x-source": "bench", "x-node": "rawclient", "x-time": now.Format(time.RFC3339Nano),
			"x-deadline": now.Add(30 * time.Second).Format(time.RFC3339Nano),
		},
		ContentType: "application/json", CorrelationId: id, MessageId: id, ReplyTo: r.replyQueue,
		Expiration: "30000", Timestamp: now, Body: b,
	})
	if err != nil {
		return nil, err
	}
	select {
	case d := <-ch:
		return d.Body, nil
	case <-ctx.Done():
		return nil, errors.New("raw call timed out")
	}
}

func (r *rawRPC) close() {
	if r.serverConn != nil {
		if ch, err := r.serverConn.Channel(); err == nil {
			_, _ = ch.QueueDelete(r.queue, false, false, false)
		}
	}
	for _, c := range []*amqp.Connection{r.serverConn, r.pubConn, r.subConn} {
		if c != nil {
			c.Close()
		}
	}
}
