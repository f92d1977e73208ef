package runtime

import (
	"context"
	"testing"
	"time"

	"github.com/meshkit/mesh/sdk"
)

// TestAnswerCache: a final answer is given back for its key; a transient
// error is not kept (done with nil); answers past the retention or over
// the byte bound are forgotten, oldest first; a repeat that arrives while
// its key is being answered waits for that answer.
func TestAnswerCache(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := newAnswerCache(time.Hour, 1000)
	c.now = func() time.Time { return now }
	ctx := context.Background()

	stored, done, err := c.claim(ctx, "a")
	if stored != nil || done == nil || err != nil {
		t.Fatalf("first claim: %v %v", stored, err)
	}
	repeat := make(chan *storedAnswer)
	go func() {
		s, _, _ := c.claim(ctx, "a") // waits for the first
		repeat <- s
	}()
	done(&storedAnswer{body: []byte(`1`)})
	if s := <-repeat; s == nil || string(s.body) != "1" {
		t.Errorf("the repeat got %v, want the stored answer", s)
	}

	_, done, _ = c.claim(ctx, "transient")
	done(nil)
	if s, done, _ := c.claim(ctx, "transient"); s != nil || done == nil {
		t.Error("a transient error was kept")
	} else {
		done(nil)
	}

	_, done, _ = c.claim(ctx, "b")
	done(&storedAnswer{te: &sdk.ToolError{Code: "no", Permanent: true}})
	now = now.Add(2 * time.Hour)
	if s, done, _ := c.claim(ctx, "b"); s != nil {
		t.Error("an answer past the retention was kept")
	} else {
		done(nil)
	}

	for _, k := range []string{"c", "d", "e"} {
		_, done, _ = c.claim(ctx, k)
		done(&storedAnswer{body: make([]byte, 400)})
	}
	if s, done, _ := c.claim(ctx, "c"); s != nil {
		t.Error("the oldest answer over the byte bound was kept")
	} else {
		done(nil)
	}
	if s, _, _ := c.claim(ctx, "e"); s == nil {
		t.Error("the newest answer was forgotten")
	}
}
