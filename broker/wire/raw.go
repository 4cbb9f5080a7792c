package wire

import (
	"bytes"
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
)

// Checking without a decoded tree.
//
// Admit checks the canonical bytes themselves: strictjson has already
// refused everything that is not strict JSON and written the body in its
// RFC 8785 form, so the schema walks those bytes, value by value, and
// decodes only the strings it must compare (tags, enums, refused values,
// member names, through a reused buffer). Nothing is built per member or
// element, where a decoded tree cost an allocation for every string,
// number, object and array of the body (about 2,000 for 8 KiB). What is
// checked is still byte for byte what is hashed, signed and forwarded.
//
// The walk relies on the canonical form: no whitespace, member names
// sorted and unique, strings with only the escapes RFC 8785 writes. Bytes
// that break it are moat's bug (errNotCanonical, refused as
// internal_error), never the client's.

// errNotCanonical: the bytes given to the walk are not strictjson's output.
var errNotCanonical = errors.New("BUG: the checked body is not in canonical form")

// valueEnd returns the end of the JSON value that starts at b[i].
func valueEnd(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, errNotCanonical
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			if !structural[b[j]] {
				continue
			}
			switch b[j] {
			case '"':
				e, err := stringEnd(b, j)
				if err != nil {
					return 0, err
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, errNotCanonical
	case 't', 'n':
		if i+4 > len(b) {
			return 0, errNotCanonical
		}
		return i + 4, nil
	case 'f':
		if i+5 > len(b) {
			return 0, errNotCanonical
		}
		return i + 5, nil
	}
	j := i
	for j < len(b) && strings.IndexByte("0123456789+-.eE", b[j]) >= 0 {
		j++
	}
	if j == i {
		return 0, errNotCanonical
	}
	return j, nil
}

// rawKind names the JSON kind of the value v (canonical bytes), as
// jsonKind names a decoded one.
func rawKind(v []byte) string {
	if len(v) == 0 {
		return "nothing (BUG: empty value)"
	}
	switch v[0] {
	case 'n':
		return "null"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case '[':
		return "array"
	case '{':
		return "object"
	}
	return "number"
}

// member is one member of an object being checked: its name, decoded,
// and its value's bytes.
type member struct {
	name  []byte
	value []byte
	raw   []byte // `"name":value`, as in the canonical bytes
	off   int    // where raw starts in the object's bytes
}

func isNull(v []byte) bool { return len(v) == 4 && string(v) == "null" }

// rawWalker is walker plus the reused buffers of the walk.
type rawWalker struct {
	walker
	mem []member // members of the objects being checked, innermost last
	buf []byte   // scratch for decoded strings

	// The containers of doc (the canonical body), by where they start:
	// starts is sorted, and doc[starts[k]:ends[k]] is an object or an
	// array (indexContainers). Without it, a container's end would be
	// found by reading it to its end once for each container around it.
	doc          []byte
	starts, ends []int32
	open         []int32 // indexContainers' stack
}

// members appends the members of object v to w.mem, in the order of
// their decoded names (the order in which the tree walk met them), and
// returns the index of the first.
func (w *rawWalker) members(v []byte) (int, error) {
	base := len(w.mem)
	if len(v) < 2 || v[0] != '{' {
		return base, errNotCanonical
	}
	i := 1
	for i < len(v)-1 {
		if v[i] == ',' {
			i++
		}
		start := i
		ne, err := valueEnd(v, i)
		if err != nil || v[i] != '"' || ne >= len(v) || v[ne] != ':' {
			return base, errNotCanonical
		}
		name := v[i+1 : ne-1]
		if bytes.IndexByte(name, '\\') >= 0 {
			if name, err = jsontext.AppendUnquote(nil, v[i:ne]); err != nil {
				return base, errNotCanonical
			}
		}
		ve, err := w.valueEnd(v, ne+1)
		if err != nil {
			return base, err
		}
		w.mem = append(w.mem, member{name: name, value: v[ne+1 : ve], raw: v[start:ve], off: start})
		i = ve
	}
	if i != len(v)-1 {
		return base, errNotCanonical
	}
	// Canonical order is by UTF-16 code units; the decoded names sort by
	// bytes. They differ only around supplementary characters, so the run
	// is almost always sorted already. It is still sorted in O(n log n):
	// names over U+E000 and U+10000 alone reverse the order completely,
	// and an insertion sort of such an object (a top-level one is sorted
	// before any name is checked) took seconds per MiB of body.
	ms := w.mem[base:]
	byName := func(a, b member) int { return bytes.Compare(a.name, b.name) }
	if !slices.IsSortedFunc(ms, byName) {
		slices.SortFunc(ms, byName)
	}
	return base, nil
}

// find returns the member named name among w.mem[base:], or nil.
func (w *rawWalker) find(base int, name string) *member {
	for i := base; i < len(w.mem); i++ {
		if string(w.mem[i].name) == name {
			return &w.mem[i]
		}
	}
	return nil
}

// text decodes the string value v into w.buf and returns it; the bytes
// are valid until the next call.
func (w *rawWalker) text(v []byte) ([]byte, error) {
	if bytes.IndexByte(v, '\\') < 0 {
		return v[1 : len(v)-1], nil
	}
	var err error
	w.buf, err = jsontext.AppendUnquote(w.buf[:0], v)
	if err != nil {
		return nil, errNotCanonical
	}
	return w.buf, nil
}

func internal(p *walker, err error) *Refusal {
	return refuse(ReasonInternal, p.String(), "%v", err)
}

// validateRaw checks the value v (canonical bytes) against n at path p.
func (n *node) validateRaw(p *rawWalker, v []byte) *Refusal {
	if r := n.validateKindRaw(p, v); r != nil {
		return r
	}
	if n.check != nil {
		if d := n.check(v); d != nil {
			return d.at(p.String())
		}
	}
	return nil
}

func wrongKindRaw(n *node, p *walker, v []byte) *Refusal {
	return refuse(ReasonInvalidValue, p.String(), "must be %s, got %s", n.kindName(), rawKind(v))
}

func (n *node) validateKindRaw(p *rawWalker, v []byte) *Refusal {
	k := rawKind(v)
	switch n.kind {
	case kAny:
		return nil
	case kDeny:
		return n.deny.at(p.String())
	case kString:
		if k != "string" {
			return wrongKindRaw(n, &p.walker, v)
		}
		if n.denyVals == nil && n.enum == nil {
			return nil
		}
		s, err := p.text(v)
		if err != nil {
			return internal(&p.walker, err)
		}
		if d, ok := n.denyVals[string(s)]; ok {
			return d.at(p.String())
		}
		if n.enum != nil && !slices.ContainsFunc(n.enum, func(e string) bool { return e == string(s) }) {
			return refuse(ReasonInvalidValue, p.String(), "%s is not allowed (allowed: %s)", Quote(string(s)), strings.Join(n.enum, ", "))
		}
		return nil
	case kNumber, kInteger:
		if k != "number" {
			return wrongKindRaw(n, &p.walker, v)
		}
		if n.kind == kInteger && !isInt64(v) {
			return refuse(ReasonInvalidValue, p.String(), "must be an integer, got %s", v)
		}
		return nil
	case kBool:
		if k != "boolean" {
			return wrongKindRaw(n, &p.walker, v)
		}
		if d, ok := n.denyVals[string(v)]; ok {
			return d.at(p.String())
		}
		return nil
	case kArray:
		if k != "array" {
			return wrongKindRaw(n, &p.walker, v)
		}
		for i, idx := 1, 0; i < len(v)-1; idx++ {
			if v[i] == ',' {
				i++
			}
			e, err := p.valueEnd(v, i)
			if err != nil {
				return internal(&p.walker, err)
			}
			p.push(seg{index: idx})
			r := n.elem.validateRaw(p, v[i:e])
			p.pop()
			if r != nil {
				return r
			}
			i = e
		}
		return nil
	case kObject:
		if k != "object" {
			return wrongKindRaw(n, &p.walker, v)
		}
		base, err := p.members(v)
		var r *Refusal
		if err != nil {
			r = internal(&p.walker, err)
		} else {
			r = n.validateMembers(p, base, "")
		}
		p.mem = p.mem[:base]
		return r
	case kTagged:
		if k != "object" {
			return wrongKindRaw(n, &p.walker, v)
		}
		base, err := p.members(v)
		var r *Refusal
		if err != nil {
			r = internal(&p.walker, err)
		} else {
			r = n.validateTaggedRaw(p, v, base)
		}
		p.mem = p.mem[:base]
		return r
	case kOneOf:
		for _, a := range n.alts {
			if a.accepts(k) {
				return a.validateRaw(p, v)
			}
		}
		return wrongKindRaw(n, &p.walker, v)
	}
	return refuse(ReasonInternal, p.String(), "BUG: invalid schema node")
}

// validateTaggedRaw checks the object v, whose members are p.mem[base:],
// against the tagged node n: the tag picks the node its members are
// checked against.
func (n *node) validateTaggedRaw(p *rawWalker, v []byte, base int) *Refusal {
	var sub *node
	tag := n.tagDefault
	if m := p.find(base, n.tagKey); m != nil {
		if rawKind(m.value) != "string" {
			return refuse(ReasonInvalidValue, p.fieldString(n.tagKey), "must be a string, got %s", rawKind(m.value))
		}
		s, err := p.text(m.value)
		if err != nil {
			return internal(&p.walker, err)
		}
		var ok bool
		if sub, ok = n.tags[string(s)]; !ok {
			tag = string(s)
		}
	} else if tag == "" {
		return refuse(ReasonMissingField, p.fieldString(n.tagKey), "required field is missing (allowed: %s)", strings.Join(n.tagNames(), ", "))
	} else {
		sub = n.tags[tag]
	}
	if sub == nil {
		if n.tagDeny != nil {
			if d := n.tagDeny(tag); d != nil {
				return d.at(p.fieldString(n.tagKey))
			}
		}
		return refuse(ReasonUnknownType, p.fieldString(n.tagKey), "%s is not a %s moat forwards (allowed: %s); use one of those", Quote(tag), n.tagKey, strings.Join(n.tagNames(), ", "))
	}
	if r := sub.validateMembers(p, base, n.tagKey); r != nil {
		return r
	}
	if sub.check != nil {
		if d := sub.check(v); d != nil {
			return d.at(p.String())
		}
	}
	return nil
}

// isInt64 reports whether the number v is an integer written without
// fraction or exponent and in the int64 range (strictjson.Number.Int64).
func isInt64(v []byte) bool {
	_, err := strconv.ParseInt(string(v), 10, 64)
	return err == nil
}

// validateMembers checks the members w.mem[base:] of an object against
// n.fields, as validateFields checks a decoded object: required fields
// first, then each member in name order; skip names a member already
// checked by the caller (a tag). A null member counts as absent, except
// for a field refused by name (kDeny).
func (n *node) validateMembers(p *rawWalker, base int, skip string) *Refusal {
	for _, name := range n.required {
		if m := p.find(base, name); m == nil || isNull(m.value) {
			return refuse(ReasonMissingField, p.fieldString(name), "required field is missing")
		}
	}
	end := len(p.mem)
	for i := base; i < end; i++ {
		m := p.mem[i]
		if string(m.name) == skip {
			continue
		}
		f, ok := n.fields[string(m.name)]
		if !ok {
			return refuse(ReasonUnknownField, p.fieldString(string(m.name)), "field is not allowed (moat forwards only fields it knows how to check); remove it")
		}
		if isNull(m.value) {
			if f.kind == kDeny {
				return refuse(f.deny.code, p.fieldString(string(m.name)), "%s (an explicit null is refused too: remove the field)", f.deny.msg)
			}
			continue
		}
		p.pushName(m.name)
		r := f.validateRaw(p, m.value)
		p.pop()
		if r != nil {
			return r
		}
	}
	return nil
}

// admitCanonical is Admit after strictjson: it checks the canonical bytes
// canon against ep and lim and applies the broker's decisions (reserved
// tokens, stream, forced false) to the top-level members.
func admitCanonical(ep *endpoint, canon []byte, lim Limits) (*Request, *Refusal) {
	if k := rawKind(canon); k != "object" {
		return nil, refuse(ReasonInvalidJSON, "", "the request body must be a JSON object, got %s", k)
	}
	w := getWalker()
	defer putWalker(w)
	w.indexContainers(canon)
	if r := ep.schema.validateRaw(w, canon); r != nil {
		return nil, r
	}
	base, err := w.members(canon)
	if err != nil {
		return nil, internal(&w.walker, err)
	}
	top := w.mem[base:]
	var model string
	if m := w.find(base, "model"); m != nil && rawKind(m.value) == "string" { // required string: the schema checked it
		s, err := w.text(m.value)
		if err != nil {
			return nil, internal(&w.walker, err)
		}
		model = string(s)
	}
	if !slices.Contains(lim.Models, model) {
		allowed := "none"
		if len(lim.Models) > 0 {
			allowed = strings.Join(lim.Models, ", ")
		}
		return nil, refuse(ReasonModelNotAllowed, "model", "model %s is not allowed by policy (allowed: %s)", Quote(model), allowed)
	}
	// The decisions: members to drop (nulls the broker reads as absent)
	// and members to add (name → canonical value).
	var drop []string
	var add [][2]string
	maxTokens := 0
	if len(ep.tokenFields) > 0 {
		var r *Refusal
		if maxTokens, drop, add, r = reserveTokensRaw(w, base, ep.tokenFields, lim.MaxOutputTokens); r != nil {
			return nil, r
		}
	}
	stream := false
	if m := w.find(base, "stream"); m != nil {
		// The broker reads an absent or null stream as false and answers
		// accordingly; the provider gets what the broker assumed.
		if isNull(m.value) {
			drop = append(drop, "stream")
		}
		stream = string(m.value) == "true"
	}
	for _, f := range ep.forceFalse {
		switch m := w.find(base, f); {
		case m == nil:
			add = append(add, [2]string{f, "false"})
		case isNull(m.value):
			drop = append(drop, f)
			add = append(add, [2]string{f, "false"})
		}
	}
	if len(drop) > 0 || len(add) > 0 {
		canon = rebuild(canon, top, drop, add)
	}
	return &Request{Canonical: canon, Model: model, MaxTokens: maxTokens, Stream: stream}, nil
}

// reserveTokensRaw is reserveTokens on the top-level members: it finds
// the output limit among fields (at most one may be set), checks it
// against max and, when none is set, adds max as the first field.
func reserveTokensRaw(w *rawWalker, base int, fields []string, max int) (int, []string, [][2]string, *Refusal) {
	if max <= 0 {
		return 0, nil, nil, refuse(ReasonMaxTokensExceeded, "", "policy allows no output tokens (inference.max_output_tokens is 0); ask the operator to raise it")
	}
	var set, drop []string
	var val []byte
	for _, f := range fields {
		m := w.find(base, f)
		if m == nil {
			continue
		}
		if isNull(m.value) {
			drop = append(drop, f) // null means absent; the default is added below
			continue
		}
		set, val = append(set, f), m.value
	}
	switch len(set) {
	case 0:
		return max, drop, [][2]string{{fields[0], strconv.Itoa(max)}}, nil
	case 1:
	default:
		return 0, nil, nil, refuse(ReasonInvalidValue, "", "%s are both set, which is ambiguous; set only %s (at most %d)", strings.Join(set, " and "), fields[0], max)
	}
	f := set[0]
	n, err := strconv.ParseInt(string(val), 10, 64) // the schema checked it is an integer
	if err != nil || n < 1 {
		return 0, nil, nil, refuse(ReasonInvalidValue, f, "must be a positive integer (at most %d), got %s", max, val)
	}
	if n > int64(max) {
		return 0, nil, nil, refuse(ReasonMaxTokensExceeded, f, "%d is above the policy limit of %d output tokens; set %s to at most %d", n, max, f, max)
	}
	return int(n), drop, nil, nil
}

// rebuild writes the canonical object of the members top (in canonical
// order, as in canon) without those named in drop and with add, each
// placed where RFC 8785 orders it. The added names are ASCII, and an
// ASCII name compares with any other name in the same way by UTF-16 code
// units as by UTF-8 bytes, so byte comparison places it.
func rebuild(canon []byte, top []member, drop []string, add [][2]string) []byte {
	// top was sorted by decoded name; the output follows canon's order.
	ms := slices.Clone(top)
	slices.SortFunc(ms, func(a, b member) int { return a.off - b.off })
	slices.SortFunc(add, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	out := make([]byte, 0, len(canon)+64)
	out = append(out, '{')
	first := true
	sep := func() {
		if !first {
			out = append(out, ',')
		}
		first = false
	}
	writeAdd := func(a [2]string) {
		sep()
		out = strconv.AppendQuote(out, a[0])
		out = append(out, ':')
		out = append(out, a[1]...)
	}
	for _, m := range ms {
		for len(add) > 0 && bytes.Compare([]byte(add[0][0]), m.name) < 0 {
			writeAdd(add[0])
			add = add[1:]
		}
		if slices.Contains(drop, string(m.name)) {
			continue
		}
		sep()
		out = append(out, m.raw...)
	}
	for _, a := range add {
		writeAdd(a)
	}
	return append(out, '}')
}
