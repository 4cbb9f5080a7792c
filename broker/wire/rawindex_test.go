package wire

import (
	"testing"

	"github.com/moat-sandbox/moat/internal/strictjson"
)

// TestContainerIndex: the index gives, for every object and array of a
// canonical body, the end valueEnd finds by reading, and rawWalker's
// valueEnd answers from it for slices of the body that start anywhere
// before the container; for bytes that are not a slice of the indexed
// body it reads them itself.
func TestContainerIndex(t *testing.T) {
	var docs [][]byte
	for _, api := range []string{APIAnthropicMessages, APIOpenAIChat, APIOpenAIResponses} {
		for _, ex := range loadExamples(t, api) {
			if c, err := strictjson.Canonicalize(ex.body); err == nil {
				docs = append(docs, c)
			}
		}
		docs = append(docs, benchBody(t, api))
	}
	docs = append(docs, []byte(`[[],{},[{"a\"[":["]}\\"]}],"{"]`))
	w := getWalker()
	defer putWalker(w)
	for _, doc := range docs {
		w.indexContainers(doc)
		containers := 0
		inString := false
		for j := 0; j < len(doc); j++ {
			switch c := doc[j]; {
			case inString && c == '\\':
				j++
				continue
			case c == '"':
				inString = !inString
				continue
			case inString || c != '{' && c != '[':
				continue
			}
			want, err := valueEnd(doc, j)
			if err != nil {
				t.Fatalf("valueEnd(doc, %d): %v", j, err)
			}
			containers++
			if j%7 != 0 {
				continue // slices from a few starts only: quadratic otherwise
			}
			for _, a := range []int{0, j / 2, j} {
				got, err := w.valueEnd(doc[a:], j-a)
				if err != nil || got != want-a {
					t.Fatalf("valueEnd(doc[%d:], %d) = %d, %v; want %d", a, j-a, got, err, want-a)
				}
			}
		}
		if len(w.starts) != containers {
			t.Fatalf("indexed %d containers, want %d (%s)", len(w.starts), containers, doc)
		}
		for k, at := range w.starts {
			if want, _ := valueEnd(doc, int(at)); int(w.ends[k]) != want {
				t.Fatalf("container at %d: indexed end %d, want %d", at, w.ends[k], want)
			}
		}
		// The index is what answers: a changed entry changes the answer.
		if len(w.starts) > 0 {
			at, end := int(w.starts[0]), int(w.ends[0])
			w.ends[0]--
			if got, _ := w.valueEnd(doc, at); got != end-1 {
				t.Fatalf("valueEnd with the index changed = %d, want %d: the index is not used", got, end-1)
			}
			w.ends[0]++
		}
		// A copy is not the indexed body: read, not looked up.
		cp := append([]byte(nil), doc...)
		if got, want := mustEnd(t, w, cp), mustEnd(t, &rawWalker{}, cp); got != want {
			t.Fatalf("copy: valueEnd = %d, want %d", got, want)
		}
	}
	// Bytes that are not canonical (unbalanced) leave containers out of
	// the index, and their ends are read.
	bad := []byte(`{"a":[1,{"b":2}]`)
	w.indexContainers(bad)
	if got, err := w.valueEnd(bad, 0); err == nil {
		t.Fatalf("unbalanced object: end %d, want errNotCanonical", got)
	}
	if got, err := w.valueEnd(bad, 5); err != nil || got != len(bad) {
		t.Fatalf("inner array: end %d, %v; want %d", got, err, len(bad))
	}
}

func mustEnd(t *testing.T, w *rawWalker, v []byte) int {
	t.Helper()
	e, err := w.valueEnd(v, 0)
	if err != nil {
		t.Fatal(err)
	}
	return e
}
