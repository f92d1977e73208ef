// Command meshscale measures what a mesh of many nodes costs a broker or
// cluster: it runs N nodes (runtime.Node, in one process) with M in-process
// modules each, plus an audit logger on the first node, in a virtual host
// of its own; streams events between the modules; and reports the
// broker's queues, bindings, connections, channels and memory, and the
// event path's throughput. Run it for 1 node and for 20, against one
// broker or the local cluster (scripts/cluster.sh), to put the figures
// side by side (docs/scaling.md):
//
//	go run ./cmd/meshscale -nodes 1
//	go run ./cmd/meshscale -nodes 20 -amqp-urls "$(scripts/cluster.sh urls)" -management-url http://127.0.0.1:15701
//
// Module k of node i is "n<i>m<k>"; it handles the ticks its neighbour
// n<i>m<k+1> emits, so each event is delivered once to a module and once to
// the audit logger, which is bound to "#".
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

type options struct {
	nodes, modules, events, emitters int
	urls                             []string
	management                       string
	audit                            bool
}

func main() {
	var o options
	var urls string
	flag.IntVar(&o.nodes, "nodes", 20, "mesh nodes")
	flag.IntVar(&o.modules, "modules", 5, "modules per node")
	flag.IntVar(&o.events, "events", 20000, "events to stream, spread over every module")
	flag.IntVar(&o.emitters, "emitters", 64, "concurrent emitters in all")
	flag.StringVar(&urls, "amqp-urls", runtime.DefaultAMQPURL, "the broker's addresses, comma-separated (a virtual host of the run's own is used)")
	flag.StringVar(&o.management, "management-url", "http://127.0.0.1:15672", "the management API of one broker node")
	flag.BoolVar(&o.audit, "audit", true, "run an audit logger on the first node")
	flag.Parse()
	o.urls = strings.Split(urls, ",")
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "meshscale:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	api, err := newAPI(o.management, o.urls[0])
	if err != nil {
		return err
	}
	vhost := fmt.Sprintf("mesh-scale-%d", time.Now().UnixNano())
	if err := api.do(http.MethodPut, "/api/vhosts/"+neturl.PathEscape(vhost), nil, nil); err != nil {
		return fmt.Errorf("make the virtual host: %w", err)
	}
	defer api.do(http.MethodDelete, "/api/vhosts/"+neturl.PathEscape(vhost), nil, nil)
	perm := map[string]string{"configure": ".*", "write": ".*", "read": ".*"}
	if err := api.do(http.MethodPut, "/api/permissions/"+neturl.PathEscape(vhost)+"/"+neturl.PathEscape(api.user), perm, nil); err != nil {
		return fmt.Errorf("grant the virtual host: %w", err)
	}
	var urls []string
	for _, u := range o.urls {
		p, err := neturl.Parse(u)
		if err != nil {
			return fmt.Errorf("-amqp-urls: %v", err)
		}
		p.Path = "/" + vhost
		urls = append(urls, p.String())
	}
	state, err := os.MkdirTemp("", "meshscale-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(state)
	before, err := api.memory()
	if err != nil {
		return err
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var handled atomic.Int64
	var meshes []sdk.Mesh
	var nodes []*runtime.Node
	defer func() {
		for _, n := range nodes {
			_ = n.Close(context.Background())
		}
	}()
	start := time.Now()
	for i := range o.nodes {
		n, err := runtime.New(ctx, runtime.Config{Node: fmt.Sprintf("scale%02d", i), AMQPURLs: urls,
			StateDir: filepath.Join(state, fmt.Sprint(i)), Logger: quiet, HeartbeatInterval: runtime.DefaultHeartbeatInterval})
		if err != nil {
			return fmt.Errorf("node %d: %w", i, err)
		}
		nodes = append(nodes, n)
		for k := range o.modules {
			name := fmt.Sprintf("n%dm%d", i, k)
			next := fmt.Sprintf("n%dm%d", i, (k+1)%o.modules)
			m, err := n.Load(ctx, sdk.Module{Name: name, Emits: []string{"tick"}, Setup: func(m sdk.Mesh) error {
				return m.On("module."+next+".tick", sdk.HandlerFunc(func(context.Context, sdk.Event) error {
					handled.Add(1)
					return nil
				}))
			}}, runtime.ModuleConfig{Concurrency: 4})
			if err != nil {
				return fmt.Errorf("node %d module %s: %w", i, name, err)
			}
			meshes = append(meshes, m.Mesh())
		}
	}
	var logger *auditlogger.Logger
	if o.audit {
		if logger, err = auditlogger.Open(filepath.Join(state, "audit.db"), auditlogger.Options{}); err != nil {
			return err
		}
		defer logger.Close()
		if _, err := nodes[0].Load(ctx, logger.Module(), runtime.ModuleConfig{Prefetch: 256, Concurrency: 256}); err != nil {
			return fmt.Errorf("audit logger: %w", err)
		}
	}
	fmt.Printf("meshscale: %d nodes × %d modules%s on %d broker address(es), started in %v\n",
		o.nodes, o.modules, map[bool]string{true: " + an audit logger", false: ""}[o.audit], len(urls), time.Since(start).Round(time.Millisecond))

	// The stream: every module emits its share, the emitters spread over
	// the modules.
	start = time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, o.emitters)
	for e := range o.emitters {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(o.events); i = next.Add(1) {
				m := meshes[(int(i)+e)%len(meshes)]
				if _, err := m.Emit(ctx, "tick", map[string]int64{"i": i}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return fmt.Errorf("emit: %w", err)
	}
	for handled.Load() < int64(o.events) {
		if ctx.Err() != nil {
			return fmt.Errorf("only %d of %d events handled", handled.Load(), o.events)
		}
		time.Sleep(10 * time.Millisecond)
	}
	elapsed := time.Since(start)
	fmt.Printf("event path: %d events emitted and handled in %v: %.0f events/s\n", o.events, elapsed.Round(time.Millisecond), float64(o.events)/elapsed.Seconds())

	// The management API refreshes its figures every few seconds: wait
	// until it counts every node's two connections.
	var tot totals
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
		if tot, err = api.totals(vhost); err != nil {
			return err
		}
		if tot.Connections >= 2*o.nodes || time.Now().After(deadline) {
			break
		}
	}
	after, err := api.memory()
	if err != nil {
		return err
	}
	fmt.Printf("broker (virtual host %s): queues %d, bindings %d, connections %d, channels %d, consumers %d\n",
		vhost, tot.Queues, tot.Bindings, tot.Connections, tot.Channels, tot.Consumers)
	fmt.Printf("broker memory (all nodes): %.1f MB before, %.1f MB with the mesh running (+%.1f MB)\n",
		float64(before)/1e6, float64(after)/1e6, float64(after-before)/1e6)
	fmt.Printf("per mesh node: %.1f queues, %.1f bindings, %.1f connections, %.1f channels, %.2f MB of broker memory\n",
		float64(tot.Queues)/float64(o.nodes), float64(tot.Bindings)/float64(o.nodes), float64(tot.Connections)/float64(o.nodes),
		float64(tot.Channels)/float64(o.nodes), float64(after-before)/1e6/float64(o.nodes))
	return nil
}

// api is a client of the RabbitMQ management API.
type api struct {
	base, user, pass string
	http             *http.Client
}

func newAPI(base, amqpURL string) (*api, error) {
	u, err := neturl.Parse(amqpURL)
	if err != nil {
		return nil, fmt.Errorf("-amqp-urls: %v", err)
	}
	a := &api{base: strings.TrimSuffix(base, "/"), user: "guest", pass: "guest", http: &http.Client{Timeout: 30 * time.Second}}
	if u.User != nil {
		a.user = u.User.Username()
		a.pass, _ = u.User.Password()
	}
	return a, nil
}

func (a *api) do(method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, a.base+path, body)
	if err != nil {
		return err
	}
	req.SetBasicAuth(a.user, a.pass)
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.http.Do(req)
	if err != nil {
		return fmt.Errorf("management API: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		msg, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("management API %s %s: %s %s", method, path, resp.Status, msg)
	}
	if out != nil {
		return json.NewDecoder(resp.Body).Decode(out)
	}
	return nil
}

// memory is the memory all broker nodes use, in bytes.
func (a *api) memory() (int64, error) {
	var nodes []struct {
		Name    string `json:"name"`
		MemUsed int64  `json:"mem_used"`
	}
	if err := a.do(http.MethodGet, "/api/nodes", nil, &nodes); err != nil {
		return 0, err
	}
	var sum int64
	for _, n := range nodes {
		sum += n.MemUsed
	}
	if len(nodes) == 0 {
		return 0, errors.New("management API: no broker node")
	}
	return sum, nil
}

type totals struct {
	Queues, Bindings, Connections, Channels, Consumers int
}

// totals counts the broker objects of vhost.
func (a *api) totals(vhost string) (totals, error) {
	var t totals
	v := neturl.PathEscape(vhost)
	var list []json.RawMessage
	for _, c := range []struct {
		path string
		n    *int
	}{{"/api/queues/" + v, &t.Queues}, {"/api/bindings/" + v, &t.Bindings}, {"/api/vhosts/" + v + "/connections", &t.Connections},
		{"/api/vhosts/" + v + "/channels", &t.Channels}, {"/api/consumers/" + v, &t.Consumers}} {
		list = nil
		if err := a.do(http.MethodGet, c.path, nil, &list); err != nil {
			return t, err
		}
		*c.n = len(list)
	}
	return t, nil
}
