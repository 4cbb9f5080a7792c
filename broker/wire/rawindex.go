package wire

import (
	"bytes"
	"math"
	"slices"
	"sync"
)

// The walk's index of containers, and its pool of walkers.
//
// The schema walk (raw.go) checks an object's members, then each
// member's value, so that a value nested in d containers is skipped over
// d times before it is checked itself. Strings are skipped quickly
// (stringEnd); containers' ends are found once, for the whole body, by
// indexContainers.

// indexContainers records where every object and array of doc ends, in
// one pass. Bytes that are not canonical leave the index without those
// containers (ends of 0), and the walk reads them itself (valueEnd).
func (w *rawWalker) indexContainers(doc []byte) {
	w.doc, w.starts, w.ends = doc, w.starts[:0], w.ends[:0]
	if len(doc) > math.MaxInt32 {
		return
	}
	open := w.open[:0]
	for j := 0; j < len(doc); j++ {
		switch doc[j] {
		case '"':
			e, err := stringEnd(doc, j)
			if err != nil {
				w.open = open
				return
			}
			j = e - 1
		case '{', '[':
			open = append(open, int32(len(w.starts)))
			w.starts, w.ends = append(w.starts, int32(j)), append(w.ends, 0)
		case '}', ']':
			if len(open) == 0 {
				w.open = open
				return
			}
			w.ends[open[len(open)-1]] = int32(j + 1)
			open = open[:len(open)-1]
		}
	}
	w.open = open
}

// valueEnd is valueEnd(v, i) for v, a slice of w.doc: the end of a
// container is read from the index.
func (w *rawWalker) valueEnd(v []byte, i int) (int, error) {
	if i < len(v) && (v[i] == '{' || v[i] == '[') {
		// v is w.doc[off:] cut short, so cap(w.doc)-cap(v) is off; the
		// addresses are compared to make sure.
		if at := i + cap(w.doc) - cap(v); at >= 0 && at < len(w.doc) && &w.doc[at] == &v[i] {
			if k, ok := slices.BinarySearch(w.starts, int32(at)); ok && w.ends[k] > 0 {
				if e := int(w.ends[k]) - at + i; e <= len(v) {
					return e, nil
				}
			}
		}
	}
	return valueEnd(v, i)
}

// walkers keeps the buffers of finished walks. A walk's buffers hold
// slices of the body it checked; putWalker clears them.
var walkers = sync.Pool{New: func() any {
	return &rawWalker{walker: walker{segs: make([]seg, 0, 16)}, mem: make([]member, 0, 64)}
}}

func getWalker() *rawWalker { return walkers.Get().(*rawWalker) }

// maxPooledMembers: a walker whose member buffer grew beyond this (a
// body with very many members) is not kept.
const maxPooledMembers = 4096

func putWalker(w *rawWalker) {
	clear(w.segs[:cap(w.segs)])
	clear(w.mem[:cap(w.mem)])
	clear(w.buf[:cap(w.buf)]) // no byte of this body stays in the pool
	w.segs, w.mem, w.buf, w.doc = w.segs[:0], w.mem[:0], w.buf[:0], nil
	if cap(w.mem) <= maxPooledMembers && cap(w.buf) <= 1<<20 && cap(w.starts) <= 1<<20 {
		walkers.Put(w)
	}
}

// structural marks the bytes valueEnd stops at inside a container.
var structural = [256]bool{'"': true, '{': true, '[': true, '}': true, ']': true}

// stringEnd returns the end of the string that starts at b[i] (a quote):
// after the first quote not escaped, that is, not preceded by an odd
// number of backslashes. The search for quotes is bytes.IndexByte's,
// which is what makes the walk's repeated skips over long texts cheap.
func stringEnd(b []byte, i int) (int, error) {
	j := i + 1
	for {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return 0, errNotCanonical
		}
		j += k
		n := 0
		for p := j - 1; p > i && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return j + 1, nil
		}
		j++
	}
}
