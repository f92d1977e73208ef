package dispatcher_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/meshkit/mesh/modules/dispatcher"
	"github.com/meshkit/mesh/runtime"
)

// nodePublisher is a CloudEvents producer in Node.js with amqplib: one
// event in each binary binding's headers, then one in structured mode.
const nodePublisher = `
const amqp = require("amqplib");
(async () => {
  const conn = await amqp.connect(process.argv[2]);
  const ch = await conn.createConfirmChannel();
  const q = process.argv[3];
  for (const p of ["cloudEvents_", "cloudEvents:", "ce-"]) {
    const h = {};
    h[p + "specversion"] = "1.0"; h[p + "id"] = "id-" + p; h[p + "source"] = "/node/" + p; h[p + "type"] = "com.example.node";
    ch.sendToQueue(q, Buffer.from(JSON.stringify({ via: p })), { headers: h, contentType: "application/json", persistent: true });
  }
  const ev = { specversion: "1.0", id: "id-structured", source: "/node/structured", type: "com.example.node",
    datacontenttype: "application/json", data: { via: "structured" } };
  ch.sendToQueue(q, Buffer.from(JSON.stringify(ev)), { contentType: "application/cloudevents+json", persistent: true });
  await ch.waitForConfirms();
  await conn.close();
})().catch((e) => { console.error(e); process.exit(1); });
`

// TestCloudEventsFromNode: a Node.js amqplib publisher sends CloudEvents
// in each header style and in structured mode into a queue a trigger
// consumes; the tool receives each one's id, source, type and data.
func TestCloudEventsFromNode(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("this test needs Node.js (Debian's nodejs and npm): a CloudEvents producer of another language")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatal("this test needs npm, to install amqplib")
	}
	dir := t.TempDir()
	if out, err := exec.Command(npm, "install", "--prefix", dir, "--no-audit", "--no-fund", "--silent", "amqplib@0.10.4").CombinedOutput(); err != nil {
		t.Fatalf("npm install amqplib: %v\n%s", err, out)
	}
	script := filepath.Join(dir, "publish.js")
	if err := os.WriteFile(script, []byte(nodePublisher), 0o644); err != nil {
		t.Fatal(err)
	}

	w := newWorld(t)
	ts := &tools{calls: map[string][]json.RawMessage{}}
	w.load(t, ts.module(), runtime.ModuleConfig{})
	w.queue(t, "node.events")
	fired := make(firings, 10)
	d, err := dispatcher.Open(dispatcher.Config{Store: filepath.Join(t.TempDir(), "fires.db"),
		Triggers: []dispatcher.Trigger{{Name: "node", Queue: "node.events", Tool: "t.ok"}}, OnFire: func(x dispatcher.Fire) { fired <- x }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	w.load(t, d.Module(), runtime.ModuleConfig{})

	cmd := exec.CommandContext(w.ctx, node, script, w.url, "node.events")
	cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(dir, "node_modules"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("node publisher: %v\n%s", err, out)
	}
	fired.wait(t, w.ctx, 4)
	got := map[string]bool{}
	ts.mu.Lock()
	calls := append([]json.RawMessage(nil), ts.calls["t.ok"]...)
	ts.mu.Unlock()
	for _, c := range calls {
		var req struct {
			Message struct {
				Via string `json:"via"`
			} `json:"message"`
			Meta dispatcher.Meta `json:"meta"`
		}
		if err := json.Unmarshal(c, &req); err != nil {
			t.Fatal(err)
		}
		via := req.Message.Via
		if req.Meta.MessageID != "id-"+via || req.Meta.Source != "/node/"+via || req.Meta.RoutingKey != "com.example.node" {
			t.Errorf("the tool got %s", c)
		}
		got[via] = true
	}
	for _, via := range []string{"cloudEvents_", "cloudEvents:", "ce-", "structured"} {
		if !got[via] {
			t.Errorf("no call for the event sent %s (calls: %s)", via, calls)
		}
	}
}
