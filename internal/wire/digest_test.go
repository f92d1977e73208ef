package wire

import (
	"testing"
	"time"
)

func digestMeta() Meta {
	return Meta{ID: "01J0000000000000000000000A", Source: "shop", Node: "n1", Time: time.Unix(1, 0),
		CausationID: "01J0000000000000000000000B", Schema: "2", Extra: map[string]string{"x-tenant": "acme"}}
}

// TestDigestStable pins the digest of one event: digests are kept in
// state files, so a change would turn every recorded id into a conflict.
func TestDigestStable(t *testing.T) {
	got := FormatDigest(Digest("module.shop.order.placed", digestMeta(), []byte(`{"amount":10}`)))
	if want := "413e7f15744b98d5"; got != want {
		t.Fatalf("Digest = %s, want %s: the digest changed, and with it every recorded one", got, want)
	}
}

// TestDigestMeaning: copies of one event that differ only in what a
// redelivery, a resend or the broker changes have one digest; a change to
// the type, body, source, schema, causation or a user's header gives
// another.
func TestDigestMeaning(t *testing.T) {
	const typ = "module.shop.order.placed"
	body := []byte(`{"amount":10}`)
	base := Digest(typ, digestMeta(), body)
	same := map[string]func(*Meta){
		"node":             func(m *Meta) { m.Node = "n2" },
		"time":             func(m *Meta) { m.Time = time.Unix(2, 0) },
		"attempt":          func(m *Meta) { m.Attempt = 3 },
		"x-delivery-count": func(m *Meta) { m.Extra["x-delivery-count"] = "2" },
		"x-death":          func(m *Meta) { m.Extra["x-death"] = "[...]" },
		"x-first-death":    func(m *Meta) { m.Extra["x-first-death-queue"] = "q" },
		"x-last-death":     func(m *Meta) { m.Extra["x-last-death-reason"] = "expired" },
		"x-due":            func(m *Meta) { m.Extra[HeaderDue] = "2026-01-01T00:00:00Z" },
		"x-replay-id":      func(m *Meta) { m.Extra[HeaderReplayID] = "r1" },
		"x-mesh-":          func(m *Meta) { m.Extra["x-mesh-anything"] = "1" },
	}
	for name, change := range same {
		m := digestMeta()
		change(&m)
		if d := Digest(typ, m, body); d != base {
			t.Errorf("%s changed the digest", name)
		}
	}
	other := map[string]func(*Meta, *string, *[]byte){
		"type":       func(_ *Meta, tp *string, _ *[]byte) { *tp = "module.shop.order.paid" },
		"body":       func(_ *Meta, _ *string, b *[]byte) { *b = []byte(`{"amount":99}`) },
		"source":     func(m *Meta, _ *string, _ *[]byte) { m.Source = "billing" },
		"schema":     func(m *Meta, _ *string, _ *[]byte) { m.Schema = "3" },
		"causation":  func(m *Meta, _ *string, _ *[]byte) { m.CausationID = "" },
		"user value": func(m *Meta, _ *string, _ *[]byte) { m.Extra["x-tenant"] = "other" },
		"user added": func(m *Meta, _ *string, _ *[]byte) { m.Extra["x-region"] = "eu" },
		"user gone":  func(m *Meta, _ *string, _ *[]byte) { delete(m.Extra, "x-tenant") },
		// Framing: a header's value cannot slide into its name.
		"split": func(m *Meta, _ *string, _ *[]byte) { delete(m.Extra, "x-tenant"); m.Extra["x-tenantac"] = "me" },
	}
	for name, change := range other {
		m, tp, b := digestMeta(), typ, append([]byte(nil), body...)
		change(&m, &tp, &b)
		if d := Digest(tp, m, b); d == base {
			t.Errorf("%s did not change the digest", name)
		}
	}
}

func FuzzDigest(f *testing.F) {
	f.Add("module.a.b", "a", "", "", "x-k", "v", []byte(`{}`))
	f.Fuzz(func(t *testing.T, typ, source, schema, causation, k, v string, body []byte) {
		m := Meta{Source: source, Schema: schema, CausationID: causation, Extra: map[string]string{k: v}}
		d := Digest(typ, m, body)
		if d == 0 {
			t.Fatal("digest 0")
		}
		if Digest(typ, m, body) != d {
			t.Fatal("not deterministic")
		}
	})
}

// BenchmarkDigest: what the digest of a small event costs each
// de-duplicated delivery.
func BenchmarkDigest(b *testing.B) {
	m, body := digestMeta(), []byte(`{"order":"A-1042","amount":10,"currency":"EUR"}`)
	b.ReportAllocs()
	for b.Loop() {
		Digest("module.shop.order.placed", m, body)
	}
}
