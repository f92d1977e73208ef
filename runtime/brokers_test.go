package runtime_test

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
)

// TestBrokers: the broker's addresses are AMQPURL then AMQPURLs, each once,
// and the default only when neither is set; Validate refuses an address
// that is no AMQP URL and addresses that name different users, without
// showing a password.
func TestBrokers(t *testing.T) {
	a, b, c := "amqp://u:pa@h1:5672/v", "amqp://u:pb@h2:5672/v", "amqps://u:pc@h3:5671/v"
	for _, tc := range []struct {
		cfg  runtime.Config
		want []string
	}{
		{runtime.Config{}, []string{runtime.DefaultAMQPURL}},
		{runtime.Config{AMQPURL: a}, []string{a}},
		{runtime.Config{AMQPURLs: []string{b, c}}, []string{b, c}},
		{runtime.Config{AMQPURL: a, AMQPURLs: []string{b, a, c, b}}, []string{a, b, c}},
	} {
		if got := tc.cfg.Brokers(); !slices.Equal(got, tc.want) {
			t.Errorf("%+v: brokers %q, want %q", tc.cfg, got, tc.want)
		}
		tc.cfg.Node = "n"
		if err := tc.cfg.Validate(); err != nil {
			t.Errorf("%+v: %v", tc.cfg, err)
		}
	}
	for _, tc := range []struct {
		urls []string
		want []string
	}{
		{[]string{a, "amqp://other:secret@h2:5672/v"}, []string{`uses the user "other"`, `uses "u"`, "every address must use the same user"}},
		{[]string{a, "http://u:secret@h2/"}, []string{"http://u:xxxxx@h2/", "scheme"}},
		{[]string{"amqp://u:secret@h2:port/v"}, []string{"amqp_url/amqp_urls"}},
	} {
		err := runtime.Config{Node: "n", AMQPURLs: tc.urls}.Validate()
		if err == nil {
			t.Errorf("%q: valid", tc.urls)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: %v, want it to say %q", tc.urls, err, w)
			}
		}
		if strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "pa@") {
			t.Errorf("%q: the error shows a password: %v", tc.urls, err)
		}
	}
}

// TestFailoverToTheNextAddress: a node given three addresses of one broker
// (two proxies and a port nobody listens on) connects through one; when
// that one goes down it reconnects through the next that answers, and
// after that one goes down too, back through the first: each time both
// its connections go to one address, and its module handles what is
// emitted.
func TestFailoverToTheNextAddress(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	proxies := []*brokertest.Proxy{brokertest.NewProxy(t), brokertest.NewProxy(t)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nobody listens there now
	via := func(addr string) string { return strings.Replace(url, brokertest.Host(), addr, 1) }
	n := testNode(t, via(proxies[0].Addr()), "failover", func(c *runtime.Config) {
		c.AMQPURLs = []string{via(dead), via(proxies[1].Addr())}
		c.ReconnectMin, c.ReconnectMax = 20*time.Millisecond, 100*time.Millisecond
	})
	resumed := make(chan struct{}, 1)
	n.SetTestHooks(runtime.TestHooks{Resumed: func() { resumed <- struct{}{} }})
	rec := newRecorder(nil)
	load(t, n, lateModule("a", rec, nil), runtime.ModuleConfig{})
	// through reports which proxy the node's two connections go through.
	through := func() int {
		t.Helper()
		a, b := proxies[0].Conns(), proxies[1].Conns()
		switch {
		case a == 2 && b == 0:
			return 0
		case a == 0 && b == 2:
			return 1
		}
		t.Fatalf("the node has %d connections through one proxy and %d through the other, want 2 through one", a, b)
		return -1
	}
	handled := func() {
		t.Helper()
		id, err := n.Emit(emitCtx(t), "test", "mesh.late.a.tick", map[string]int{"i": 1})
		if err != nil {
			t.Fatalf("emit: %v", err)
		}
		if ev := rec.next(t); ev.ID != id {
			t.Fatalf("handled %s, want %s", ev.ID, id)
		}
	}
	handled()
	first := through()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range []int{first, 1 - first} {
		proxies[p].Down()
		proxies[1-p].Up()
		select {
		case <-resumed:
		case <-ctx.Done():
			t.Fatalf("the node did not reconnect after proxy %d went down", p)
		}
		if now := through(); now != 1-p {
			t.Fatalf("after proxy %d went down the node is through proxy %d", p, now)
		}
		handled()
	}
}
