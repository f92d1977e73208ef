package causation

import (
	"context"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
)

// TestDerive: ids derived in one handling are valid ULIDs with the handled
// event's time; the same handling repeated derives the same ids in the
// same order; a different body, type, module, kind or handled id derives
// another; identical emits within one handling differ by occurrence.
func TestDerive(t *testing.T) {
	at := time.Date(2026, 5, 4, 3, 2, 1, 0, time.UTC)
	derive := func(ctx context.Context, module, kind, key, body string) string {
		id, ok := Derive(ctx, module, kind, key, []byte(body))
		if !ok {
			t.Fatal("no handling in ctx")
		}
		u, err := ulid.ParseStrict(id)
		if err != nil {
			t.Fatalf("derived id %q: %v", id, err)
		}
		if !ulid.Time(u.Time()).Equal(at) {
			t.Errorf("derived id time %v, want %v", ulid.Time(u.Time()), at)
		}
		return id
	}
	run := func() []string {
		ctx := Handling(context.Background(), "01J0000000000000000000000A", at)
		return []string{
			derive(ctx, "m", KindEmit, "module.m.x", `{"a":1}`),
			derive(ctx, "m", KindEmit, "module.m.x", `{"a":1}`), // the second identical emit
			derive(ctx, "m", KindEmit, "module.m.x", `{"a":2}`),
			derive(ctx, "m", KindEmit, "module.m.y", `{"a":1}`),
			derive(ctx, "n", KindEmit, "module.m.x", `{"a":1}`),
			derive(ctx, "m", KindCall, "module.m.x", `{"a":1}`),
		}
	}
	first, retry := run(), run()
	seen := map[string]bool{}
	for i := range first {
		if first[i] != retry[i] {
			t.Errorf("derivation %d: %s on the first attempt, %s on the retry", i, first[i], retry[i])
		}
		if seen[first[i]] {
			t.Errorf("derivation %d repeats an id: %s", i, first[i])
		}
		seen[first[i]] = true
	}
	other := Handling(context.Background(), "01J0000000000000000000000B", at)
	if derive(other, "m", KindEmit, "module.m.x", `{"a":1}`) == first[0] {
		t.Error("another handled event derives the same id")
	}
	if _, ok := Derive(context.Background(), "m", KindEmit, "module.m.x", nil); ok {
		t.Error("derived an id outside a handling")
	}
	if _, ok := Derive(With(context.Background(), "x"), "m", KindEmit, "module.m.x", nil); ok {
		t.Error("derived an id from an explicit cause")
	}
	if From(other) != "01J0000000000000000000000B" || From(With(context.Background(), "x")) != "x" || From(context.Background()) != "" {
		t.Error("From does not give back the cause")
	}
}

// BenchmarkDerive is what an emit inside a handler pays for its derived
// id (a 256-byte body).
func BenchmarkDerive(b *testing.B) {
	ctx := Handling(context.Background(), "01J0000000000000000000000A", time.Now())
	body := make([]byte, 256)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		body[0] = byte(i)
		if _, ok := Derive(ctx, "module", KindEmit, "module.module.thing.happened", body); !ok {
			b.Fatal("no handling")
		}
	}
}

// TestOutboxID: an outbox row's id is a ULID with the ref's time; the
// same module and ref give the same id (a resend after a crash), and
// another module, scope or number another; a handling's refs count its
// rows, and a handling run again counts them the same.
func TestOutboxID(t *testing.T) {
	at := time.Date(2026, 5, 4, 3, 2, 1, 0, time.UTC)
	ref := OutboxRef{Scope: "epoch-1", N: 7, Time: at}
	id := OutboxID("ledger", ref)
	u, err := ulid.ParseStrict(id)
	if err != nil {
		t.Fatalf("outbox id %q: %v", id, err)
	}
	if !ulid.Time(u.Time()).Equal(at) {
		t.Errorf("outbox id time %v, want %v", ulid.Time(u.Time()), at)
	}
	if again := OutboxID("ledger", ref); again != id {
		t.Errorf("the same ref gave %s, then %s", id, again)
	}
	for name, other := range map[string]string{
		"another module": OutboxID("billing", ref),
		"another scope":  OutboxID("ledger", OutboxRef{Scope: "epoch-2", N: 7, Time: at}),
		"another number": OutboxID("ledger", OutboxRef{Scope: "epoch-1", N: 8, Time: at}),
		"a plain emit":   mustDerive(t, Handling(context.Background(), "epoch-1", at), "ledger"),
	} {
		if other == id {
			t.Errorf("%s gives the same id %s", name, id)
		}
	}
	if _, err := ulid.ParseStrict(OutboxID("ledger", OutboxRef{Time: time.Unix(-5, 0)})); err != nil {
		t.Errorf("a time before 1970 makes no ULID: %v", err)
	}

	if _, ok := NextOutbox(context.Background()); ok {
		t.Error("a ref outside a handling")
	}
	if _, ok := NextOutbox(With(context.Background(), "x")); ok {
		t.Error("a ref under a cause that is not a handling")
	}
	refs := func() []OutboxRef {
		ctx := Handling(context.Background(), "01J0000000000000000000000A", at)
		var out []OutboxRef
		for range 3 {
			r, ok := NextOutbox(ctx)
			if !ok {
				t.Fatal("no ref in a handling")
			}
			out = append(out, r)
		}
		return out
	}
	first, again := refs(), refs()
	for i := range first {
		if first[i] != again[i] || first[i].N != uint64(i) || first[i].Scope != "01J0000000000000000000000A" || !first[i].Time.Equal(at) {
			t.Errorf("ref %d: %+v, then %+v", i, first[i], again[i])
		}
	}
}

func mustDerive(t *testing.T, ctx context.Context, module string) string {
	t.Helper()
	id, ok := Derive(ctx, module, KindEmit, "module.ledger.x", nil)
	if !ok {
		t.Fatal("no handling")
	}
	return id
}
