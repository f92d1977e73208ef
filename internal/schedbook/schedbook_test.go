package schedbook

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestBook: entries are written, listed soonest due first and filtered by
// type pattern and source, cancelled, crossed out; a retry and a delayed
// event of one id are two entries; concurrent Puts all land; a file that
// is no book is moved aside and a new book made.
func TestBook(t *testing.T) {
	path := filepath.Join(t.TempDir(), "delays.db")
	b, remade, err := Open(path)
	if err != nil || remade {
		t.Fatalf("open: %v, remade %v", err, remade)
	}
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var wg sync.WaitGroup
	for i, e := range []Entry{
		{ID: "a", Type: "module.shop.reminder", Source: "shop", Due: now.Add(time.Hour)},
		{ID: "b", Type: "module.shop.reminder", Source: "shop", Due: now.Add(time.Minute)},
		{ID: "c", Type: "mesh.ops.deploy", Source: "meshctl", Due: now.Add(time.Second)},
		{ID: "a", Type: "module.shop.reminder", Queue: "n1.mail.events", Attempts: 2, Due: now.Add(time.Second)},
	} {
		wg.Go(func() {
			if err := b.Put(e); err != nil {
				t.Errorf("put %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	all, total, err := b.List(Filter{}, 10)
	if err != nil || total != 4 || len(all) != 4 || all[len(all)-1].ID != "a" || all[len(all)-1].Queue != "" {
		t.Fatalf("list: %+v, %d, %v", all, total, err)
	}
	shop, total, _ := b.List(Filter{Type: "module.shop.#", Source: "shop"}, 1)
	if total != 2 || len(shop) != 1 || shop[0].ID != "b" {
		t.Errorf("shop's, limit 1: %+v of %d", shop, total)
	}
	if e, err := b.Cancel("b"); err != nil || !e.Cancelled {
		t.Errorf("cancel b: %+v, %v", e, err)
	}
	if e, err := b.Get("b"); err != nil || !e.Cancelled {
		t.Errorf("b after cancel: %+v, %v", e, err)
	}
	if _, err := b.Cancel("zz"); !errors.Is(err, ErrNotFound) {
		t.Errorf("cancel of an unknown id: %v", err)
	}
	if err := b.Delete(Key("a", "n1.mail.events")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get("a"); err != nil {
		t.Errorf("the delayed a went with its retry: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b, _, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, total, _ := b.List(Filter{}, 0); total != 3 || b.Len() != 3 {
		t.Errorf("after reopening: %d entries (Len %d), want 3", total, b.Len())
	}
	b.Close()

	broken := filepath.Join(t.TempDir(), "delays.db")
	if err := os.WriteFile(broken, []byte("not a bbolt file, not at all, longer than a page header"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, remade, err = Open(broken)
	if err != nil || !remade {
		t.Fatalf("open of a broken book: %v, remade %v", err, remade)
	}
	defer b.Close()
	if _, err := os.Stat(broken + ".broken"); err != nil {
		t.Errorf("the broken file was not kept aside: %v", err)
	}
}
