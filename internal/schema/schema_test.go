package schema

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const order = `{
  "type": "object",
  "required": ["id", "price", "status"],
  "additionalProperties": false,
  "properties": {
    "id": {"type": "string", "minLength": 3, "pattern": "^o-"},
    "price": {"type": "number", "minimum": 0},
    "status": {"enum": ["new", "paid"]},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2, "uniqueItems": true},
    "ship": {"$ref": "#/$defs/address"},
    "kind": {"const": "order"},
    "note": {"type": "string", "format": "email"},
    "alt": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    "qty": {"type": "integer", "multipleOf": 2}
  },
  "$defs": {"address": {"type": "object", "required": ["city"]}}
}`

// TestValidate: a conforming body passes, and a body that breaks each
// keyword family once is refused naming the pointer and the keyword.
func TestValidate(t *testing.T) {
	c, err := Compile("2", []byte(order))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate([]byte(`{"id":"o-1","price":2.5,"status":"new","tags":["a"],"ship":{"city":"Oslo"}}`)); err != nil {
		t.Fatalf("a conforming body refused: %v", err)
	}
	for _, tc := range []struct{ name, body, want string }{
		{"type", `{"id":"o-1","price":"2","status":"new"}`, "/price: type:"},
		{"minimum", `{"id":"o-1","price":-1,"status":"new"}`, "/price: minimum:"},
		{"required", `{"id":"o-1","status":"new"}`, "/: required:"},
		{"additionalProperties", `{"id":"o-1","price":1,"status":"new","x":1}`, "/: additionalProperties:"},
		{"enum", `{"id":"o-1","price":1,"status":"lost"}`, "/status: enum:"},
		{"const", `{"id":"o-1","price":1,"status":"new","kind":"x"}`, "/kind: const:"},
		{"minLength", `{"id":"o-","price":1,"status":"new"}`, "/id: minLength:"},
		{"pattern", `{"id":"x-12","price":1,"status":"new"}`, "/id: pattern:"},
		{"items", `{"id":"o-1","price":1,"status":"new","tags":[1]}`, "/tags/0: type:"},
		{"maxItems", `{"id":"o-1","price":1,"status":"new","tags":["a","b","c"]}`, "/tags: maxItems:"},
		{"uniqueItems", `{"id":"o-1","price":1,"status":"new","tags":["a","a"]}`, "/tags: uniqueItems:"},
		{"ref", `{"id":"o-1","price":1,"status":"new","ship":{}}`, "/ship: required:"},
		{"oneOf", `{"id":"o-1","price":1,"status":"new","alt":1.5}`, "/alt"},
		{"multipleOf", `{"id":"o-1","price":1,"status":"new","qty":3}`, "/qty: multipleOf:"},
		{"not JSON", `{"id":`, "not JSON"},
	} {
		err := c.Validate([]byte(tc.body))
		if !errors.Is(err, ErrBody) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), tc.name+": "+tc.name) {
			t.Errorf("%s: got %v, want ErrBody naming %q", tc.name, err, tc.want)
		}
	}
}

// TestCompileLoadsNothing: a module's schema cannot make the host read a
// file or a URL through $ref (an attacker's schema), and bad schemas are
// refused with ErrSchema.
func TestCompileLoadsNothing(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret.json")
	if err := os.WriteFile(secret, []byte(`{"type":"string"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, doc := range []string{
		`{"$ref": "file://` + secret + `"}`,
		`{"$ref": "` + secret + `"}`,
		`{"properties": {"a": {"$ref": "http://127.0.0.1:1/x.json"}}}`,
		`{"$schema": "file://` + secret + `"}`,
		`[1]`, `{`, `{"type": 3}`, `{"minimum": "x"}`, `{"pattern": "("}`,
	} {
		if _, err := Compile("1", []byte(doc)); !errors.Is(err, ErrSchema) {
			t.Errorf("%s: got %v, want ErrSchema", doc, err)
		}
	}
	for _, v := range []string{"", "a\nb", strings.Repeat("1", 129)} {
		if _, err := Compile(v, []byte(`true`)); !errors.Is(err, ErrSchema) {
			t.Errorf("version %q: got %v, want ErrSchema", v, err)
		}
	}
	if _, err := Compile("1", []byte(`{"description":"`+strings.Repeat("x", MaxSize)+`"}`)); !errors.Is(err, ErrSchema) {
		t.Errorf("an oversized schema: got %v", err)
	}
}

// TestDigest: layout does not change a digest; content does.
func TestDigest(t *testing.T) {
	if Digest([]byte(`{"a": 1}`)) != Digest([]byte("{\n  \"a\":1\n}")) {
		t.Error("layout changed the digest")
	}
	if Digest([]byte(`{"a":1}`)) == Digest([]byte(`{"a":2}`)) {
		t.Error("different schemas share a digest")
	}
}

// FuzzValidate: any schema and body either compile and validate or are
// refused with the package's sentinels; nothing panics.
func FuzzValidate(f *testing.F) {
	f.Add([]byte(order), []byte(`{"id":"o-1","price":1,"status":"new"}`))
	f.Add([]byte(`{"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/a"}}}`), []byte(`1`))
	f.Add([]byte(`true`), []byte(`null`))
	f.Fuzz(func(t *testing.T, doc, body []byte) {
		c, err := Compile("1", doc)
		if err != nil {
			if !errors.Is(err, ErrSchema) {
				t.Fatalf("compile: %v is not ErrSchema", err)
			}
			return
		}
		if err := c.Validate(body); err != nil && !errors.Is(err, ErrBody) {
			t.Fatalf("validate: %v is not ErrBody", err)
		}
	})
}
