package wire

import (
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
)

func BenchmarkValidateEventType(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if err := ValidateEventType("module.umami.site.created"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeMeta(b *testing.B) {
	headers := map[string]any{
		HeaderEventID: ulid.Make().String(), HeaderSource: "umami", HeaderNode: "anchor",
		HeaderTime: time.Now().UTC().Format(time.RFC3339Nano),
	}
	body := []byte(`{"sent_ns":1764505200000000000,"seq":12345,"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeMeta(headers, ContentTypeJSON, body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMatchPattern(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if !MatchPattern("module.umami.#", "module.umami.site.created") {
			b.Fatal("no match")
		}
	}
}
