package runtime

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// answerCacheBytes bounds the answers one module's tools remember.
const answerCacheBytes = 16 << 20

// answerCache remembers, for the de-duplication window, the final answers
// a module's tools gave, by tool and request id. A call made inside a
// handler carries an id derived from the handled event, so a retried
// handler's repeated call is answered from here without running the tool
// again (SPEC §1, Delivery). Transient errors are not kept: a repeat of a
// call that failed transiently runs the tool again. The cache lives in
// memory: a node restart, or a repeat that another server of the tool
// receives, runs the tool again.
type answerCache struct {
	retention time.Duration
	maxBytes  int
	now       func() time.Time

	mu      sync.Mutex
	bytes   int
	entries map[string]*storedAnswer
	order   []string                 // keys, oldest first
	running map[string]chan struct{} // keys being answered now
}

type storedAnswer struct {
	body []byte
	te   *sdk.ToolError
	// digest is the request's (wire.Digest of the tool and the body): a
	// repeat of the id with another digest is a conflict, not a repeat.
	digest uint64
	at     time.Time
	size   int
}

func newAnswerCache(retention time.Duration, maxBytes int) *answerCache {
	return &answerCache{retention: retention, maxBytes: maxBytes, now: time.Now,
		entries: make(map[string]*storedAnswer), running: make(map[string]chan struct{})}
}

// claim returns the stored answer of key, or, when there is none, the
// right to answer it: the caller must then call done, with the answer to
// keep or nil. A repeat that arrives while key is being answered waits for
// that answer (or ctx).
func (c *answerCache) claim(ctx context.Context, key string) (stored *storedAnswer, done func(*storedAnswer), err error) {
	for {
		c.mu.Lock()
		c.expire()
		if a, ok := c.entries[key]; ok {
			c.mu.Unlock()
			return a, nil, nil
		}
		busy, ok := c.running[key]
		if !ok {
			mine := make(chan struct{})
			c.running[key] = mine
			c.mu.Unlock()
			return nil, func(a *storedAnswer) { c.finish(key, mine, a) }, nil
		}
		c.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

func (c *answerCache) finish(key string, mine chan struct{}, a *storedAnswer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.running, key)
	close(mine)
	if a == nil {
		return
	}
	a.at = c.now()
	a.size = len(key) + len(a.body) + 64
	if a.te != nil {
		a.size += len(a.te.Code) + len(a.te.Message)
	}
	if a.size > c.maxBytes {
		return
	}
	c.entries[key] = a
	c.order = append(c.order, key)
	c.bytes += a.size
	c.expire()
}

// expire forgets answers older than the retention and, oldest first, what
// is over the byte bound. c.mu is held.
func (c *answerCache) expire() {
	cutoff := c.now().Add(-c.retention)
	drop := 0
	for _, key := range c.order {
		a := c.entries[key]
		if a != nil && c.bytes <= c.maxBytes && a.at.After(cutoff) {
			break
		}
		if a != nil {
			c.bytes -= a.size
			delete(c.entries, key)
		}
		drop++
	}
	if drop > 0 {
		c.order = c.order[drop:]
		if cap(c.order) > 2*len(c.order)+64 {
			c.order = slices.Clone(c.order) // let go of the dropped keys
		}
	}
}

// conflict is the answer to a repeat of a request id whose request differs
// from the one the stored answer answered.
func conflict(id string, stored *storedAnswer, digest uint64) *sdk.ToolError {
	return &sdk.ToolError{Code: wire.CodeConflict, Permanent: true, Message: fmt.Sprintf(
		"request id %s was answered for a request of digest %s; this one's digest is %s: the same id with another request, not run",
		id, wire.FormatDigest(stored.digest), wire.FormatDigest(digest))}
}

// keepable says whether an answer is final: a response or a permanent
// error. A transient error is worth another try.
func keepable(te *sdk.ToolError) bool { return te == nil || te.Permanent }
