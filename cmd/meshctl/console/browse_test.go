package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/wire"
)

// got is what getAsync got, or why not.
type got struct {
	status int
	body   string
	err    error
}

// getAsync sends a GET with testToken, from a goroutine of its own.
func getAsync(u string) <-chan got {
	out := make(chan got, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := noRedirect.Do(req)
		if err != nil {
			out <- got{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		out <- got{status: resp.StatusCode, body: string(b), err: err}
	}()
	return out
}

func (f *fakeMesh) readCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.reads)
}

// TestPagesShareOneRead: the pages of a keeper queue asked for while it
// is read wait for that read, and those asked for within keptFresh of it
// are shown it (a group's page after its queue's page reads nothing);
// later pages read again. The groups' read keeps summaries alone.
func TestPagesShareOneRead(t *testing.T) {
	f := &fakeMesh{reading: make(chan chan struct{}), kept: []deadletters.Message{
		{ID: "a", Type: "mesh.a.b", Source: "s", Body: []byte("body"), Size: 4},
		{ID: "b", Type: "mesh.a.b", Source: "s", Body: []byte("body"), Size: 4},
	}}
	c := &clock{now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	_, ts := serve(t, f, Config{Now: c.Now})
	var pages []<-chan got
	pages = append(pages, getAsync(ts.URL+"/unrouted"))
	read := <-f.reading // the first page reads
	for range 3 {
		pages = append(pages, getAsync(ts.URL+"/unrouted"))
	}
	// The three wait for the read running: none reads again. (Each is
	// let go only with the read, so whether it joined it before or
	// after it ended, it sees it.)
	close(read)
	for i, p := range pages {
		g := <-p
		if g.err != nil || g.status != http.StatusOK || !strings.Contains(g.body, "2 unrouted events") || !strings.Contains(g.body, "12:00:00") {
			t.Errorf("page %d: %d %v %.300s", i, g.status, g.err, g.body)
		}
	}
	if n := f.readCount(); n != 1 {
		t.Fatalf("4 pages asked at once read the queue %d times, want once: %v", n, f.reads)
	}
	if !strings.Contains(f.reads[0], "\x00true\x00") { // Summaries
		t.Errorf("the groups' read does not ask for summaries: %q", f.reads[0])
	}
	key := groupsOf(unroutedKeeper, f.kept)[0].Key
	c.add(keptFresh)
	if g := <-getAsync(ts.URL + "/unrouted/group/" + key); g.status != http.StatusOK || !strings.Contains(g.body, `value="b"`) {
		t.Errorf("the group's page: %d %.300s", g.status, g.body)
	}
	if n := f.readCount(); n != 1 {
		t.Errorf("the group's page %v after the read read again", keptFresh)
	}
	c.add(time.Millisecond)
	page := getAsync(ts.URL + "/unrouted")
	close(<-f.reading)
	if g := <-page; g.status != http.StatusOK || f.readCount() != 2 {
		t.Errorf("a page after the read went stale: %d, %d reads in all, want 2", g.status, f.readCount())
	}
}

// TestReadsAreBounded: with maxBrowses reads running, another page is
// refused (503, saying why) once it has waited its turn; then it reads.
func TestReadsAreBounded(t *testing.T) {
	f := &fakeMesh{reading: make(chan chan struct{}), kept: []deadletters.Message{{ID: "a", Queue: "n.m.events"}}}
	s, ts := serve(t, f, Config{})
	s.kept.wait = 0 // refused at once: the test waits for no clock
	var pages []<-chan got
	var reads []chan struct{}
	for _, p := range []string{"/dlq", "/unrouted"}[:maxBrowses] {
		pages = append(pages, getAsync(ts.URL+p))
		reads = append(reads, <-f.reading)
	}
	g := <-getAsync(ts.URL + "/dlq/message/a")
	if g.status != http.StatusServiceUnavailable || !strings.Contains(g.body, fmt.Sprintf("%d reads of the keeper queues are running", maxBrowses)) {
		t.Errorf("a page past %d reads: %d %.300s", maxBrowses, g.status, g.body)
	}
	for _, r := range reads {
		close(r)
	}
	for _, p := range pages {
		if g := <-p; g.status != http.StatusOK {
			t.Errorf("a page within the bound: %d", g.status)
		}
	}
	msg := getAsync(ts.URL + "/dlq/message/a")
	close(<-f.reading)
	if g := <-msg; g.status != http.StatusOK {
		t.Errorf("the message's page once the reads ended: %d %.300s", g.status, g.body)
	}
}

// jobOf polls a job until cond holds of it.
func jobOf(t *testing.T, base, id string, cond func(job) bool) job {
	t.Helper()
	for {
		_, b := do(t, http.MethodGet, base+"/api/jobs/"+id, "", nil)
		var jb job
		if err := json.Unmarshal([]byte(b), &jb); err != nil {
			t.Fatal(err)
		}
		if cond(jb) {
			return jb
		}
	}
}

// TestAReplayWaitsForThePagesReadingItsQueue: a replay started while a
// page reads its queue waits for that read (which holds the messages it
// would replay) and says so; meanwhile no other read of the queue
// begins (a page not shared is refused, 503), a page of the other queue
// reads; once the replay ended, the queue is read again.
func TestAReplayWaitsForThePagesReadingItsQueue(t *testing.T) {
	f := &fakeMesh{reading: make(chan chan struct{}), kept: []deadletters.Message{{ID: "a", Queue: "n.m.events", Reason: "rejected"}}}
	_, ts := serve(t, f, Config{})
	csrf := map[string]string{"X-Mesh-CSRF": csrfOf(t, ts)}
	page := getAsync(ts.URL + "/dlq")
	read := <-f.reading // the page reads mesh.dead-letters
	resp, body := do(t, http.MethodPost, ts.URL+"/api/dlq/replay", `{"ids":["a"],"queue":"n.m.events"}`, csrf)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("replay: %d %s", resp.StatusCode, body)
	}
	var started struct{ Job string }
	_ = json.Unmarshal([]byte(body), &started)
	jb := jobOf(t, ts.URL, started.Job, func(j job) bool { return j.Waiting != "" || j.Finished })
	if jb.Finished || !strings.Contains(jb.Waiting, "mesh.dead-letters") {
		t.Fatalf("the replay did not wait for the page's read: %+v", jb)
	}
	if g := <-getAsync(ts.URL + "/dlq/message/a"); g.status != http.StatusServiceUnavailable || !strings.Contains(g.body, "a replay or purge of the queue is running") {
		t.Errorf("a read of the queue while a replay waits: %d %.300s", g.status, g.body)
	}
	other := getAsync(ts.URL + "/unrouted")
	close(<-f.reading) // the other queue is read meanwhile
	if g := <-other; g.status != http.StatusOK {
		t.Errorf("the other queue's page: %d", g.status)
	}
	f.mu.Lock()
	replayed := len(f.replayed)
	f.mu.Unlock()
	if replayed != 0 {
		t.Fatal("the replay ran while a page read its queue")
	}
	close(read) // the page's read ends: the replay's turn
	if g := <-page; g.status != http.StatusOK || !strings.Contains(g.body, "1 dead letter") {
		t.Errorf("the page: %d %.300s", g.status, g.body)
	}
	jb = jobOf(t, ts.URL, started.Job, func(j job) bool { return j.Finished })
	if jb.Summary != "replayed 1 of 1 dead letters" || jb.Waiting != "" {
		t.Errorf("the replay: %+v", jb)
	}
	reads := f.readCount()
	again := getAsync(ts.URL + "/dlq")
	close(<-f.reading)
	if g := <-again; g.status != http.StatusOK || f.readCount() != reads+1 {
		t.Errorf("the page after the replay: %d; %d reads, want %d (what was read before it forgotten)", g.status, f.readCount(), reads+1)
	}
}

// TestAMessagePageShowsAPartOfALargeBody: a message's page reads a
// bounded part of its body and links the whole, which is a download.
func TestAMessagePageShowsAPartOfALargeBody(t *testing.T) {
	large := []byte("{" + strings.Repeat("é", messageBodyShown)) // 2 bytes a character, after 1: cut in one
	f := &fakeMesh{kept: []deadletters.Message{{ID: "big/1", Queue: "n.m.events", Body: large, Size: len(large)}}}
	_, ts := serve(t, f, Config{})
	resp, body := do(t, http.MethodGet, ts.URL+"/dlq/message/big%2F1", "", nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, fmt.Sprintf("The first %d bytes of %d", messageBodyShown-1, len(large))) ||
		!strings.Contains(body, `href="/dlq/message/big%2F1/body"`) || strings.Contains(body, "not text") {
		t.Errorf("the page of a large body: %d %.500s", resp.StatusCode, body)
	}
	if !strings.Contains(f.reads[0], fmt.Sprintf("\x00%d", messageBodyShown)) {
		t.Errorf("the page's read does not bound the body: %q", f.reads[0])
	}
	resp, body = do(t, http.MethodGet, ts.URL+"/dlq/message/big%2F1/body", "", nil)
	if resp.StatusCode != http.StatusOK || body != string(large) || resp.Header.Get("Content-Type") != "application/octet-stream" ||
		resp.Header.Get("Content-Disposition") != `attachment; filename=big_1.body` {
		t.Errorf("the download: %d %q %q, %d bytes", resp.StatusCode, resp.Header.Get("Content-Type"), resp.Header.Get("Content-Disposition"), len(body))
	}
	if resp, _ := do(t, http.MethodGet, ts.URL+"/dlq/message/nope/body", "", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("the download of no message: %d", resp.StatusCode)
	}
}

// TestAPageSaysHowFarALongReadGot: a page that stops waiting for a long
// read (its time is up) says how far the read got; the read goes on,
// and the page asked for again is shown it.
func TestAPageSaysHowFarALongReadGot(t *testing.T) {
	f := &fakeMesh{reading: make(chan chan struct{}), kept: []deadletters.Message{{ID: "a", Queue: "n.m.events"}, {ID: "b", Queue: "n.m.events"}}}
	s, _ := serve(t, f, Config{})
	late := timeUp{Context: context.Background(), up: make(chan struct{})}
	got := make(chan error, 1)
	go func() {
		_, _, err := s.kept.get(late, wire.QueueDead, KeptQuery{Summaries: true})
		got <- err
	}()
	read := <-f.reading // it has read 1 of 2
	close(late.up)
	if err := <-got; !errors.Is(err, errStillRead) || !strings.Contains(err.Error(), "1 of its 2 messages read; the read goes on") {
		t.Errorf("a page whose time is up: %v", err)
	}
	close(read)
	msgs, _, err := s.kept.get(context.Background(), wire.QueueDead, KeptQuery{Summaries: true})
	if err != nil || len(msgs) != 2 || f.readCount() != 1 {
		t.Errorf("the page again: %d messages, %v; %d reads, want the one", len(msgs), err, f.readCount())
	}
}

// timeUp is a context whose deadline passes when up is closed.
type timeUp struct {
	context.Context
	up chan struct{}
}

func (c timeUp) Done() <-chan struct{} { return c.up }
func (c timeUp) Err() error {
	select {
	case <-c.up:
		return context.DeadlineExceeded
	default:
		return nil
	}
}
