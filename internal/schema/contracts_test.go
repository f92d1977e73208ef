package schema

import (
	"errors"
	"strings"
	"testing"

	"github.com/meshkit/mesh/internal/wire"
)

const (
	quoteRequestV1  = `{"type": "object", "required": ["sku"], "properties": {"sku": {"type": "string"}}}`
	quoteRequestV2  = `{"type": "object", "required": ["sku", "qty"], "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}}}`
	quoteResponseV2 = `{"type": "object", "required": ["price"], "properties": {"price": {"type": "number", "minimum": 0}}}`
)

// TestContractsRefuseToolSchemas: New refuses a schema that names both
// an event and a tool or neither, a Response on an event's schema, a bad
// tool key, a version declared twice for a tool, a tool version that
// declares no schema, and bad documents, naming which; CheckTools
// refuses a schema for a tool the module does not serve.
func TestContractsRefuseToolSchemas(t *testing.T) {
	good := Decl{Tool: "shop.quote", Version: "1", JSON: []byte(quoteRequestV1)}
	for _, tc := range []struct {
		name  string
		decls []Decl
		says  string
	}{
		{"event and tool", []Decl{{Event: "order.placed", Tool: "shop.quote", Version: "1", JSON: []byte(`true`)}}, `names the event "order.placed" and the tool "shop.quote"`},
		{"neither", []Decl{{Version: "1", JSON: []byte(`true`)}}, "names neither an event nor a tool"},
		{"response on an event", []Decl{{Event: "order.placed", Version: "1", JSON: []byte(`true`), Response: []byte(`true`)}}, "has a Response schema, which only a tool's schema has"},
		{"bad tool key", []Decl{{Tool: "shop..quote", Version: "1", JSON: []byte(`true`)}}, "tool key"},
		{"wildcard tool key", []Decl{{Tool: "shop.*", Version: "1", JSON: []byte(`true`)}}, "tool key"},
		{"empty version", []Decl{{Tool: "shop.quote", JSON: []byte(`true`)}}, "schema version is empty"},
		{"twice", []Decl{good, good}, "tool shop.quote version 1 is declared twice"},
		{"no schema", []Decl{{Tool: "shop.quote", Version: "1"}}, "declares neither a request schema (JSON) nor a response schema (Response)"},
		{"bad request", []Decl{{Tool: "shop.quote", Version: "1", JSON: []byte(`{"type": 3}`)}}, "tool shop.quote version 1, its request: invalid schema"},
		{"bad response", []Decl{{Tool: "shop.quote", Version: "1", Response: []byte(`{`)}}, "tool shop.quote version 1, its response: invalid schema"},
		{"response loads a file", []Decl{{Tool: "shop.quote", Version: "1", Response: []byte(`{"$ref": "file:///etc/passwd"}`)}}, "its response: invalid schema"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New("shop", []string{"order.placed"}, tc.decls, nil, true)
			if !errors.Is(err, wire.ErrInvalid) || !strings.Contains(err.Error(), tc.says) || c != nil {
				t.Errorf("got %v, want ErrInvalid saying %q", err, tc.says)
			}
		})
	}

	// The same version of an event and of a tool is no conflict, nor the
	// same version of two tools.
	c, err := New("shop", []string{"order.placed"}, []Decl{
		{Event: "order.placed", Version: "1", JSON: []byte(`true`)}, good,
		{Tool: "shop.price", Version: "1", Response: []byte(`true`)},
	}, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		served []string
		says   string
	}{
		{nil, `does not serve the tool "shop.price"`},
		{[]string{"shop.price"}, `does not serve the tool "shop.quote"`},
		{[]string{"shop.quote", "shop.quotes"}, `does not serve the tool "shop.price"`},
		{[]string{"shop.price", "shop.quote"}, ""},
		{[]string{"shop.other", "shop.price", "shop.quote"}, ""},
	} {
		err := c.CheckTools(tc.served)
		if tc.says == "" && err != nil || tc.says != "" && (!errors.Is(err, wire.ErrInvalid) || !strings.Contains(err.Error(), tc.says)) {
			t.Errorf("CheckTools(%q): %v, want %q", tc.served, err, tc.says)
		}
	}
	var none *Contracts
	if err := none.CheckTools(nil); err != nil {
		t.Errorf("nil contracts: %v", err)
	}
	events, err := New("shop", []string{"order.placed"}, []Decl{{Event: "order.placed", Version: "1", JSON: []byte(`true`)}}, nil, true)
	if err != nil || events.CheckTools(nil) != nil {
		t.Errorf("a module that declares no tool schema: %v / %v", err, events.CheckTools(nil))
	}
}

// TestContractsRequestAndResponse: a request and a response are checked
// against the current version of the tool's schemas, naming the pointer
// and the keyword; a tool without a request or response schema, a tool
// without schemas, nil contracts and validation off take anything; the
// declarations and the documents of every version are kept, by digest.
func TestContractsRequestAndResponse(t *testing.T) {
	decls := []Decl{
		{Tool: "shop.quote", Version: "1", JSON: []byte(quoteRequestV1)},
		{Tool: "shop.quote", Version: "2", JSON: []byte(quoteRequestV2), Response: []byte(quoteResponseV2)},
		{Tool: "shop.ping", Version: "1", Response: []byte(`{"const": "pong"}`)},
	}
	c, err := New("shop", nil, decls, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	off, err := New("shop", nil, decls, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	var none *Contracts
	for _, tc := range []struct {
		name     string
		response bool
		tool     string
		body     string
		says     string // "": conforms
	}{
		{"conforming request", false, "shop.quote", `{"sku": "a", "qty": 2}`, ""},
		{"version 1's request is not version 2's", false, "shop.quote", `{"sku": "a"}`, "request to shop.quote: body does not conform to its schema (version 2): /: required: missing property 'qty'"},
		{"request minimum", false, "shop.quote", `{"sku": "a", "qty": 0}`, "(version 2): /qty: minimum:"},
		{"request type", false, "shop.quote", `{"sku": 1, "qty": 1}`, "/sku: type:"},
		{"request not JSON", false, "shop.quote", `{"sku"`, "not JSON"},
		{"conforming response", true, "shop.quote", `{"price": 1.5}`, ""},
		{"response minimum", true, "shop.quote", `{"price": -1}`, "response of shop.quote: body does not conform to its schema (version 2): /price: minimum:"},
		{"response of null", true, "shop.quote", `null`, "/: type:"},
		{"response const", true, "shop.ping", `"ping"`, "/: const:"},
		{"no request schema", false, "shop.ping", `"anything"`, ""},
		{"a tool without schemas", false, "shop.other", `{`, ""},
		{"a tool without schemas' response", true, "shop.other", `{`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check := func(c *Contracts) error {
				if tc.response {
					return c.Response(tc.tool, []byte(tc.body))
				}
				return c.Request(tc.tool, []byte(tc.body))
			}
			err := check(c)
			if tc.says == "" && err != nil || tc.says != "" && (!errors.Is(err, ErrBody) || !strings.Contains(err.Error(), tc.says)) {
				t.Errorf("got %v, want %q", err, tc.says)
			}
			if err := check(off); err != nil {
				t.Errorf("validation off: %v", err)
			}
			if err := check(none); err != nil {
				t.Errorf("nil contracts: %v", err)
			}
		})
	}

	got := c.Declared()
	want := []Declared{
		{Tool: "shop.quote", Version: "1", Digest: Digest([]byte(quoteRequestV1))},
		{Tool: "shop.quote", Version: "2", Digest: Digest([]byte(quoteRequestV2)), ResponseDigest: Digest([]byte(quoteResponseV2)), Current: true},
		{Tool: "shop.ping", Version: "1", ResponseDigest: Digest([]byte(`{"const": "pong"}`)), Current: true},
	}
	if len(got) != len(want) {
		t.Fatalf("declared %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("declared[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	for _, doc := range []string{quoteRequestV1, quoteRequestV2, quoteResponseV2} {
		if d, ok := c.Doc(Digest([]byte(doc))); !ok || string(d) != doc {
			t.Errorf("Doc of %s: %s %v", doc, d, ok)
		}
	}
	if _, ok := c.Doc(""); ok {
		t.Error(`Doc("") found a document`)
	}
}
