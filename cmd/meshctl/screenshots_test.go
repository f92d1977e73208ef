//go:build screenshots

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The pictures of the console guide (docs/console.md). make screenshots
// (scripts/screenshots.sh) starts the demo mesh in a virtual host of its
// own, feeds it (sites, orders, a group of dead letters the notifier gave
// up on while tax was gone, a body it cannot read), starts meshctl console
// on it and runs this test with
//
//	MESH_SCREENSHOTS_URL    the console, http://127.0.0.1:PORT
//	MESH_SCREENSHOTS_TOKEN  a token of the console's (meshctl console token add)
//	MESH_SCREENSHOTS_DIR    where the PNGs go (docs/images)
//
// It walks the guide's story in Debian's headless Chromium: the overview's
// unhealthy list, the graph, the dead letters, a group, a dead letter, its
// audit record, the audit search, a trace, the dispatcher (paused and
// resumed), the group's replay (confirmation, then the result), the
// replayed event handled, the unreadable one purged, the overview healthy
// again, and the live page with events arriving. Each page must load
// (200) without an error shown or reported by the browser.

// shotWidth and shotHeight are the browser's viewport in CSS pixels: a
// picture is shotWidth wide and as tall as its page, at least shotHeight.
const shotWidth, shotHeight = 1280, 800

// maxShot bounds a picture's size.
const maxShot = 500 << 10

func TestScreenshots(t *testing.T) {
	base, dir, token := os.Getenv("MESH_SCREENSHOTS_URL"), os.Getenv("MESH_SCREENSHOTS_DIR"), os.Getenv("MESH_SCREENSHOTS_TOKEN")
	if base == "" || dir == "" {
		t.Skip("make screenshots runs it (scripts/screenshots.sh), with MESH_SCREENSHOTS_URL, MESH_SCREENSHOTS_TOKEN and MESH_SCREENSHOTS_DIR")
	}
	if token == "" {
		t.Fatal("MESH_SCREENSHOTS_TOKEN is not set: the console needs a token (scripts/screenshots.sh makes one with meshctl console token add)")
	}
	base = strings.TrimSuffix(base, "/")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// The console hears the demo node's heartbeat (every 2 s).
	waitFor(t, ctx, "the console to hear the demo node", func() bool {
		req, _ := http.NewRequest(http.MethodGet, base+"/graph?format=json", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return bytes.Contains(body, []byte("demo/umami")) && bytes.Contains(body, []byte("demo/tax"))
	})

	b := newBrowser(t, ctx)
	b.base = base
	b.run(t, chromedp.EmulateViewport(shotWidth, shotHeight))
	b.login(t, token)
	open := func(path, visible string) {
		t.Helper()
		b.navigatedBy(t, chromedp.Navigate(base+path))
		b.run(t, chromedp.WaitVisible(visible, chromedp.ByQuery))
	}
	// reloadUntil reloads the page until cond holds: the management API's
	// counts trail by its statistics interval (5 s), the audit log by a
	// delivery.
	reloadUntil := func(what, visible string, cond func() bool) {
		t.Helper()
		waitFor(t, ctx, what, func() bool {
			b.run(t, chromedp.Reload(), chromedp.WaitVisible(visible, chromedp.ByQuery))
			return cond()
		})
	}
	has := func(sel, text string) bool {
		t.Helper()
		return strings.Contains(b.text(t, sel), text)
	}
	shot := func(name string) {
		t.Helper()
		var shown string
		b.eval(t, `(document.querySelector("main > p.error") || {textContent: ""}).textContent`, &shown)
		if shown != "" {
			t.Fatalf("%s: the page shows an error: %s", name, shown)
		}
		if errs := b.takeErrors(); len(errs) > 0 {
			t.Fatalf("%s: the browser reported %v", name, errs)
		}
		var png []byte
		b.run(t, chromedp.FullScreenshot(&png, 100)) // 100: PNG (less is JPEG)
		if len(png) > maxShot {
			t.Errorf("%s is %d KB, more than %d KB", name, len(png)>>10, maxShot>>10)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d KB", path, len(png)>>10)
	}
	// groupLink is the page of the dead-letter group whose row has text.
	groupLink := func(text string) string {
		t.Helper()
		open("/dlq", "#groups")
		var href string
		b.eval(t, `(() => { const r = Array.from(document.querySelectorAll("#groups tbody tr")).find(r => r.textContent.includes(`+jsString(text)+`));
			return r ? r.querySelector("a").getAttribute("href") : ""; })()`, &href)
		if href == "" {
			t.Fatalf("no dead-letter group with %q: %s", text, b.text(t, "#groups"))
		}
		return href
	}
	// act clicks an action's button on a group's page, shows the
	// confirmation (taking it as name, if not ""), confirms, and waits for
	// the result.
	act := func(button, confirmName string) string {
		t.Helper()
		b.run(t, chromedp.Click(button, chromedp.ByQuery), chromedp.WaitVisible("#confirm", chromedp.ByQuery))
		if confirmName != "" {
			shot(confirmName)
		}
		b.run(t, chromedp.Click("#confirm-yes", chromedp.ByQuery), chromedp.WaitVisible(`#result[data-finished="true"]`, chromedp.ByQuery))
		return b.text(t, "#result")
	}

	// Something is failing: the overview says where.
	open("/", "#problems")
	// Only the dead letters: the script's browses of the keeper queues
	// (meshctl dlq ls, unrouted ls) count as redeliveries until the
	// management API's next sample.
	reloadUntil("the overview to list the dead letters, and only them", "#problems", func() bool {
		var n int
		b.eval(t, `document.querySelectorAll("#problems li").length`, &n)
		return n == 1 && has("#problems", "dead letters wait in mesh.dead-letters") && has("#nodes", "demo")
	})
	shot("console-overview.png")

	open("/graph", "#graph")
	shot("console-graph.png")

	// The dead letters, grouped; the group of the sites the notifier gave
	// up on while tax was gone; one of them; its audit record.
	open("/dlq", "#groups")
	if !has("#groups", "delivery_limit") || !has("#groups", "permanent") {
		t.Fatalf("want a delivery_limit group and a permanent one: %s", b.text(t, "#groups"))
	}
	shot("console-dlq.png")
	taxGroup := groupLink("delivery_limit")
	open(taxGroup, "#messages")
	if !has("#group", "no server for this tool") {
		t.Errorf("the group's error: %s", b.text(t, "#group"))
	}
	var ids []string
	b.eval(t, `Array.from(document.querySelectorAll("#messages input.pick")).map(c => c.value)`, &ids)
	if len(ids) < 3 {
		t.Fatalf("the group lists %v, want at least 3", ids)
	}
	shot("console-dlq-group.png")
	failed := ids[0]
	open("/dlq/message/"+failed, "#message")
	shot("console-dlq-message.png")
	open("/audit/event/"+failed, "#event")
	reloadUntil("the audit log to record the dead letter", "#event", func() bool {
		var n int
		b.eval(t, `document.querySelectorAll("#fates li.dead").length`, &n)
		return n > 0
	})
	shot("console-event.png")

	// The audit log's search: every event some queue gave up on.
	open("/audit?dead=1", "#events")
	shot("console-audit.png")

	// A site that went through, as a chain: umami's event, the notifier's.
	open("/audit?type=module.umami.site.created&source=umami&limit=1", "#events")
	sites := b.rowIDs(t, "#events")
	if len(sites) != 1 {
		t.Fatalf("umami's first site: %v", sites)
	}
	open("/audit/trace/"+sites[0], "#timeline")
	var tree []string
	b.eval(t, `Array.from(document.querySelectorAll("#tree a")).map(a => a.textContent)`, &tree)
	if want := "module.umami.site.created module.notifier.notification.sent"; strings.Join(tree, " ") != want {
		t.Errorf("the trace's tree: %v, want %s", tree, want)
	}
	shot("console-trace.png")

	// The dispatcher's trigger, paused meanwhile and resumed.
	open("/dispatcher", "#fires")
	shot("console-dispatcher.png")
	b.run(t, chromedp.Click(`button[data-trigger="orders"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`button[data-trigger="orders"][data-action="resume"]`, chromedp.ByQuery),
		chromedp.WaitVisible("#result", chromedp.ByQuery))
	shot("console-dispatcher-paused.png")
	b.run(t, chromedp.Click(`button[data-trigger="orders"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`button[data-trigger="orders"][data-action="pause"]`, chromedp.ByQuery))

	// tax is back (the script saw tax.rate answer): the group is replayed,
	// confirmed, with its progress and result.
	open(taxGroup, "#replay-group")
	b.eval(t, `Array.from(document.querySelectorAll("#messages input.pick")).map(c => c.value)`, &ids)
	want := fmt.Sprintf("replayed %d of %d dead letters", len(ids), len(ids))
	if got := act("#replay-group", "console-dlq-replay.png"); !strings.Contains(got, want) {
		t.Fatalf("the replay's result: %q, want %q", got, want)
	}
	shot("console-dlq-replayed.png")

	// Handled this time: the audit log has what it caused.
	open("/audit/event/"+failed, "#event")
	reloadUntil("the replayed event's notification", "#event", func() bool {
		var n int
		b.eval(t, `document.querySelectorAll("#effects li").length`, &n)
		return n > 0
	})
	shot("console-event-handled.png")
	open("/audit/trace/"+failed, "#timeline")
	shot("console-trace-replayed.png")

	// The body no replay can cure: purged, once read.
	open(groupLink("permanent"), "#purge-group")
	if got := act("#purge-group", ""); !strings.Contains(got, "purged 1 of 1 dead letters") {
		t.Fatalf("the purge's result: %q", got)
	}
	open("/", "#problems")
	// Browsing mesh.dead-letters (the pages above) puts each message back:
	// the management API counts those as redeliveries, and the overview
	// lists them until its next sample.
	reloadUntil("the overview to list nothing unhealthy", "#problems", func() bool {
		var n int
		b.eval(t, `document.querySelectorAll("#problems li").length`, &n)
		return n == 0
	})
	shot("console-overview-handled.png")

	// Live: umami's sites and the notifier's notifications as they pass.
	open("/live?pattern=module.%23", `#live[data-ready="true"]`)
	b.run(t, chromedp.WaitVisible("#live-events tbody tr:nth-child(6)", chromedp.ByQuery))
	shot("console-live.png")
}
