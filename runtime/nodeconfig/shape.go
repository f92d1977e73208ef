package nodeconfig

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// The shape check reads mesh.yaml as a tree before it is decoded, and
// names what does not fit in the file's own terms: the key and its place
// (`modules[2] (ledger).concurency`), the line, the nearest key for a
// typo ("did you mean concurrency?") and the kind of value wanted with an
// example ("calls: wants a list, e.g. [\"tax.*\"]"), where the decoder
// would say `field concurency not found in type nodeconfig.Module`.

var durationType = reflect.TypeFor[time.Duration]()

// checkShape returns an error for each key or value of doc that does not
// fit t (File), nil if all do.
func checkShape(doc *yaml.Node) error {
	if doc.Kind == 0 {
		return nil // an empty file: Load says so
	}
	if doc.Kind == yaml.DocumentNode {
		if len(doc.Content) == 0 {
			return nil
		}
		doc = doc.Content[0]
	}
	var errs []error
	shapeOf(doc, reflect.TypeFor[File](), "", "", &errs)
	return errors.Join(errs...)
}

// shapeOf checks n against t at path (the key written in mesh.yaml's
// terms) whose last key is key.
func shapeOf(n *yaml.Node, t reflect.Type, path, key string, errs *[]error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Tag == "!!null" {
		return // left out: the default
	}
	fail := func(format string, args ...any) {
		at := path
		if at == "" {
			at = "the file"
		}
		*errs = append(*errs, fmt.Errorf("line %d: %s: %s", n.Line, at, fmt.Sprintf(format, args...)))
	}
	switch {
	case t.Kind() == reflect.Interface:
		return // a module's own config: its module reads it
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			fail("wants keys and values (%s), not %s", keysOf(t, 4), what(n))
			return
		}
		fields := fieldsOf(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			sub := join(path, k.Value)
			f, ok := fields[k.Value]
			if !ok {
				msg := fmt.Sprintf("line %d: %s: no such key", k.Line, sub)
				if near := nearest(k.Value, fields); near != "" {
					msg += "; did you mean " + near + "?"
				} else {
					msg += " (the keys here: " + keysOf(t, 0) + ")"
				}
				*errs = append(*errs, errors.New(msg))
				continue
			}
			shapeOf(v, f, sub, k.Value, errs)
		}
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			fail("wants a list, e.g. %s, not %s", example(key, t), what(n))
			return
		}
		for i, e := range n.Content {
			shapeOf(e, t.Elem(), path+fmt.Sprintf("[%d]", i)+entryName(e), key, errs)
		}
	case t.Kind() == reflect.Map:
		if n.Kind != yaml.MappingNode {
			fail("wants keys and values, e.g. %s, not %s", example(key, t), what(n))
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			shapeOf(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value), key, errs)
		}
	default: // a single value
		if n.Kind != yaml.ScalarNode {
			fail("wants %s, e.g. %s, not %s", valueWords(t), example(key, t), what(n))
			return
		}
		v := reflect.New(t)
		if err := n.Decode(v.Interface()); err != nil {
			fail("wants %s, e.g. %s, not %q", valueWords(t), example(key, t), n.Value)
		}
	}
}

// join is the path of key under path.
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// entryName is " (NAME)" for a list entry with a name: key (a module).
func entryName(n *yaml.Node) string {
	if n.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "name" && n.Content[i+1].Kind == yaml.ScalarNode && n.Content[i+1].Value != "" {
			return " (" + cut(n.Content[i+1].Value, 40) + ")"
		}
	}
	return ""
}

// fieldsOf maps the yaml keys of struct t to their types.
func fieldsOf(t reflect.Type) map[string]reflect.Type {
	out := make(map[string]reflect.Type, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			out[name] = f.Type
		}
	}
	return out
}

// keysOf lists the keys of struct t, at most max of them (0: all).
func keysOf(t reflect.Type, max int) string {
	keys := make([]string, 0, t.NumField())
	for k := range fieldsOf(t) {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if max > 0 && len(keys) > max {
		return strings.Join(keys[:max], ", ") + ", ..."
	}
	return strings.Join(keys, ", ")
}

// what says what kind of value n is.
func what(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "keys and values"
	}
	return fmt.Sprintf("%q", cut(n.Value, 60))
}

// valueWords says what kind of single value t wants.
func valueWords(t reflect.Type) string {
	switch {
	case t == durationType:
		return "a duration"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "a whole number"
	}
	return "a single value"
}

// example is a value of the setting key as mesh.yaml would hold it: the
// reference's first valid value, or one made for t.
func example(key string, t reflect.Type) string {
	for _, s := range Settings() {
		if k := s.Key[strings.LastIndex(s.Key, ".")+1:]; k == key && len(s.Valid) > 0 {
			return s.Valid[0]
		}
	}
	switch {
	case t == durationType:
		return "30s"
	case t.Kind() == reflect.Bool:
		return "true"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "10"
	case t.Kind() == reflect.Slice:
		return "[" + example("", t.Elem()) + "]"
	case t.Kind() == reflect.Map:
		return "{key: " + example("", t.Elem()) + "}"
	}
	return `"text"`
}

// nearest is the key of fields closest to k, if one is close enough to be
// a typo of it.
func nearest(k string, fields map[string]reflect.Type) string {
	best, bestD := "", len(k)/3+2
	for f := range fields {
		if d := editDistance(strings.ToLower(k), f); d < bestD || d == bestD && f < best && best != "" {
			best, bestD = f, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// cut shortens s to n bytes at most.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
