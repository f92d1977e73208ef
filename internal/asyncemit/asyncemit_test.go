package asyncemit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
)

// TestWindow: every emit's outcome reaches its done once; at most Size run
// at once, and a caller beyond that waits, or gets its ctx's error; an
// emit under way is not cancelled with its caller's ctx, and keeps its
// values.
func TestWindow(t *testing.T) {
	w := New()
	release := make(chan struct{})
	started := make(chan struct{}, Size)
	var mu sync.Mutex
	outcomes := map[string]int{}
	var first sync.WaitGroup // the first Size dones
	first.Add(Size)
	type key struct{}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	for i := range Size {
		err := w.Go(ctx, func(ctx context.Context) (string, error) {
			started <- struct{}{}
			<-release
			if ctx.Err() != nil || ctx.Value(key{}) != "v" {
				return "", errors.New("the emit's context was cancelled or lost its values")
			}
			return fmt.Sprint("id", i), nil
		}, func(id string, err error) {
			defer first.Done()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Error(err)
			}
			outcomes[id]++
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for range Size {
		<-started
	}
	cancel() // the callers' ctx ends: the emits under way go on
	full, stop := context.WithCancel(context.Background())
	stop()
	if err := w.Go(full, func(context.Context) (string, error) { return "x", nil }, func(string, error) {}); !errors.Is(err, context.Canceled) {
		t.Errorf("a full window with an ended ctx: %v", err)
	}
	close(release)
	last := make(chan string)
	if err := w.Go(context.Background(), func(context.Context) (string, error) { return "last", nil }, func(id string, _ error) { last <- id }); err != nil {
		t.Fatal(err)
	}
	if id := <-last; id != "last" {
		t.Errorf("last: %q", id)
	}
	// A slot is free before its done runs: Size more fit once the first
	// emits returned.
	var wg sync.WaitGroup
	wg.Add(Size)
	for range Size {
		if err := w.Go(context.Background(), func(context.Context) (string, error) { return "", nil }, func(string, error) { wg.Done() }); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	first.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(outcomes) != Size {
		t.Errorf("%d distinct outcomes, want %d", len(outcomes), Size)
	}
	for id, n := range outcomes {
		if n != 1 {
			t.Errorf("%s reached done %d times", id, n)
		}
	}
}
