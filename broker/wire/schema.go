package wire

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// This file holds the small schema language in which the per-API
// allowlists (anthropic.go, openaichat.go, openairesponses.go) are written.
// A schema is a tree of nodes; checking (raw.go) walks the canonical
// request and the schema side by side and stops at the first refusal,
// which names the JSON path of the offending value. Anything not described
// is refused.

type kind uint8

const (
	kInvalid kind = iota // zero value: refuses everything
	kString
	kNumber
	kInteger
	kBool
	kAny // any JSON value: free-form data such as JSON Schemas or tool inputs
	kArray
	kObject
	kTagged // an object whose tag field (e.g. "type") selects its schema
	kOneOf  // alternatives selected by the value's JSON kind
	kDeny   // present with a non-null value: refused
)

// denial is a refusal for a construct that moat recognizes and will not
// forward. msg says what to change.
type denial struct {
	code Reason
	msg  string
}

type node struct {
	kind     kind
	enum     []string          // kString: allowed values, if any
	denyVals map[string]denial // kString/kBool: values that are refused
	elem     *node             // kArray
	fields   map[string]*node  // kObject
	required []string          // kObject

	tagKey     string               // kTagged
	tagDefault string               // kTagged: tag assumed when the key is absent ("" = required)
	tags       map[string]*node     // kTagged: each a kObject
	tagDeny    func(string) *denial // kTagged: known-but-refused tags

	alts []*node // kOneOf
	deny denial  // kDeny

	check func(v []byte) *denial // extra check after the structural one, on the canonical bytes
}

type fields map[string]*node

func str() *node                         { return &node{kind: kString} }
func enum(vals ...string) *node          { return &node{kind: kString, enum: vals} }
func num() *node                         { return &node{kind: kNumber} }
func integer() *node                     { return &node{kind: kInteger} }
func boolean() *node                     { return &node{kind: kBool} }
func anyJSON() *node                     { return &node{kind: kAny} }
func arr(e *node) *node                  { return &node{kind: kArray, elem: e} }
func oneOf(alts ...*node) *node          { return &node{kind: kOneOf, alts: alts} }
func deny(code Reason, msg string) *node { return &node{kind: kDeny, deny: denial{code, msg}} }
func obj(f fields, required ...string) *node {
	return &node{kind: kObject, fields: f, required: required}
}

// tagged is an object discriminated by key. def is the tag assumed when
// the key is absent ("" makes the key required). refused maps tags that
// are recognized and refused to their denial; any other tag is refused as
// unknown_type.
func tagged(key, def string, tags map[string]*node, refused func(tag string) *denial) *node {
	return &node{kind: kTagged, tagKey: key, tagDefault: def, tags: tags, tagDeny: refused}
}

// denying refuses the listed values of a string or boolean node.
func (n *node) denying(vals map[string]denial) *node {
	c := *n
	c.denyVals = vals
	return &c
}

// with adds an extra check to a copy of n.
func (n *node) with(check func(v []byte) *denial) *node {
	c := *n
	c.check = check
	return &c
}

// Refusal builders. Every message says what to change; the prefix
// "moat: refused:" is added once, where the message leaves moat.

func refuse(code Reason, path, format string, args ...any) *Refusal {
	where := ""
	if path != "" {
		where = path + ": "
	}
	return &Refusal{Code: code, Message: where + fmt.Sprintf(format, args...)}
}

func (d denial) at(path string) *Refusal { return refuse(d.code, path, "%s", d.msg) }

// walker holds the JSON path of the value being validated, as a stack of
// segments reused for the whole request, and turns it into text only for a
// refusal: messages[0].content[1].source.
type walker struct {
	segs []seg
}

type seg struct {
	name  string // member name; unused for an array element
	bname []byte // member name, when name is "" (no copy is made while checking)
	index int    // array index, or -1 for a member
}

func (w *walker) push(s seg) { w.segs = append(w.segs, s) }

// pushName pushes member name, which must not change while it is pushed.
func (w *walker) pushName(name []byte) { w.segs = append(w.segs, seg{bname: name, index: -1}) }
func (w *walker) pop()                 { w.segs = w.segs[:len(w.segs)-1] }

// fieldString is the text of the path of member name of the current value.
func (w *walker) fieldString(name string) string {
	w.push(seg{name: name, index: -1})
	defer w.pop()
	return w.String()
}

func (w *walker) String() string {
	var b strings.Builder
	for _, s := range w.segs {
		if s.index < 0 && s.name == "" {
			s.name = string(s.bname)
		}
		switch {
		case s.index >= 0:
			b.WriteString("[" + strconv.Itoa(s.index) + "]")
		case len(s.name) > MaxQuotedBytes || !isIdent(s.name):
			b.WriteString("[" + Quote(s.name) + "]")
		default:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(s.name)
		}
	}
	return b.String()
}

// isIdent reports whether name can be shown as .name in a path; other
// names are shown quoted, as ["name"].
func isIdent(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' || c == '$' || i > 0 && ('0' <= c && c <= '9' || c == '-')) {
			return false
		}
	}
	return true
}

func (n *node) kindName() string {
	switch n.kind {
	case kString:
		return "a string"
	case kNumber:
		return "a number"
	case kInteger:
		return "an integer"
	case kBool:
		return "a boolean"
	case kArray:
		return "an array"
	case kObject, kTagged:
		return "an object"
	case kAny:
		return "any JSON value"
	case kOneOf:
		names := make([]string, len(n.alts))
		for i, a := range n.alts {
			names[i] = a.kindName()
		}
		return strings.Join(names, " or ")
	}
	return "nothing (BUG: invalid schema node)"
}

// accepts reports whether n is the alternative for JSON kind k in a oneOf.
func (n *node) accepts(k string) bool {
	switch n.kind {
	case kString:
		return k == "string"
	case kNumber, kInteger:
		return k == "number"
	case kBool:
		return k == "boolean"
	case kArray:
		return k == "array"
	case kObject, kTagged:
		return k == "object"
	case kAny:
		return true
	}
	return false
}

func (n *node) tagNames() []string {
	names := make([]string, 0, len(n.tags))
	for t := range n.tags {
		names = append(names, t)
	}
	slices.Sort(names)
	return names
}

// anyObject is any JSON object (free-form, e.g. a JSON Schema or a tool's
// input).
func anyObject() *node {
	return anyJSON().with(func(v []byte) *denial {
		if k := rawKind(v); k != "object" {
			return &denial{ReasonInvalidValue, "must be an object, got " + k}
		}
		return nil
	})
}
