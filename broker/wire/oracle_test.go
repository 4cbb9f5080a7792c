package wire

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/moat-sandbox/moat/internal/strictjson"
)

// The oracle: admission on a decoded tree, as Admit worked before it
// checked the canonical bytes themselves (raw.go). FuzzAdmitOracle holds
// the two to the same answer: the same canonical bytes, model, reserved
// tokens and stream, or the same refusal, code and message.

func admitTree(api, endpointPath string, body []byte, lim Limits) (*Request, *Refusal) {
	spec, ok := apis()[api]
	if !ok {
		return nil, refuse(ReasonWrongEndpoint, "", "API %q is not supported (supported: %s, %s, %s)", api, APIAnthropicMessages, APIOpenAIChat, APIOpenAIResponses)
	}
	ep, ok := spec.endpoints[endpointPath]
	if !ok {
		return nil, refuse(ReasonWrongEndpoint, "", "POST %s is not an endpoint moat forwards for %s (allowed: %s)", quotePath(endpointPath), api, strings.Join(Endpoints(api), ", "))
	}
	canon, err := strictjson.Canonicalize(body)
	if err != nil {
		return nil, invalidJSON(err)
	}
	tree, err := strictjson.Decode(canon)
	if err != nil {
		return nil, invalidJSON(err)
	}
	top, ok := tree.(map[string]any)
	if !ok {
		return nil, refuse(ReasonInvalidJSON, "", "the request body must be a JSON object, got %s", jsonKind(tree))
	}
	if r := ep.schema.validate(&walker{segs: make([]seg, 0, 16)}, top); r != nil {
		return nil, r
	}
	model, _ := top["model"].(string)
	if !slices.Contains(lim.Models, model) {
		allowed := "none"
		if len(lim.Models) > 0 {
			allowed = strings.Join(lim.Models, ", ")
		}
		return nil, refuse(ReasonModelNotAllowed, "model", "model %s is not allowed by policy (allowed: %s)", Quote(model), allowed)
	}
	changed := false
	maxTokens := 0
	if len(ep.tokenFields) > 0 {
		var r *Refusal
		maxTokens, changed, r = reserveTokens(top, ep.tokenFields, lim.MaxOutputTokens)
		if r != nil {
			return nil, r
		}
	}
	if v, present := top["stream"]; present && v == nil {
		delete(top, "stream")
		changed = true
	}
	for _, f := range ep.forceFalse {
		if top[f] == nil {
			top[f] = false
			changed = true
		}
	}
	if changed {
		if canon, err = strictjson.Encode(top); err != nil {
			return nil, refuse(ReasonInternal, "", "BUG: re-encoding an admitted request: %v", err)
		}
	}
	stream, _ := top["stream"].(bool)
	return &Request{Canonical: canon, Model: model, MaxTokens: maxTokens, Stream: stream}, nil
}

// encodeForCheck gives a check the canonical bytes of a decoded value.
func encodeForCheck(v any) []byte {
	b, err := strictjson.Encode(v)
	if err != nil {
		panic("BUG: oracle: " + err.Error())
	}
	return b
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "string"
	case strictjson.Number:
		return "number"
	case bool:
		return "boolean"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("BUG: %T", v)
}

func wrongKind(n *node, p *walker, v any) *Refusal {
	return refuse(ReasonInvalidValue, p.String(), "must be %s, got %s", n.kindName(), jsonKind(v))
}

// validate checks v against n at path p.
func (n *node) validate(p *walker, v any) *Refusal {
	if r := n.validateKind(p, v); r != nil {
		return r
	}
	if n.check != nil {
		if d := n.check(encodeForCheck(v)); d != nil {
			return d.at(p.String())
		}
	}
	return nil
}

func (n *node) validateKind(p *walker, v any) *Refusal {
	switch n.kind {
	case kAny:
		return nil
	case kDeny:
		return n.deny.at(p.String())
	case kString:
		s, ok := v.(string)
		if !ok {
			return wrongKind(n, p, v)
		}
		if d, ok := n.denyVals[s]; ok {
			return d.at(p.String())
		}
		if n.enum != nil && !slices.Contains(n.enum, s) {
			return refuse(ReasonInvalidValue, p.String(), "%s is not allowed (allowed: %s)", Quote(s), strings.Join(n.enum, ", "))
		}
		return nil
	case kNumber, kInteger:
		num, ok := v.(strictjson.Number)
		if !ok {
			return wrongKind(n, p, v)
		}
		if n.kind == kInteger {
			if _, err := num.Int64(); err != nil {
				return refuse(ReasonInvalidValue, p.String(), "must be an integer, got %s", num)
			}
		}
		return nil
	case kBool:
		b, ok := v.(bool)
		if !ok {
			return wrongKind(n, p, v)
		}
		if d, ok := n.denyVals[strconv.FormatBool(b)]; ok {
			return d.at(p.String())
		}
		return nil
	case kArray:
		a, ok := v.([]any)
		if !ok {
			return wrongKind(n, p, v)
		}
		for i, e := range a {
			p.push(seg{index: i})
			r := n.elem.validate(p, e)
			p.pop()
			if r != nil {
				return r
			}
		}
		return nil
	case kObject:
		m, ok := v.(map[string]any)
		if !ok {
			return wrongKind(n, p, v)
		}
		return n.validateFields(p, m, "")
	case kTagged:
		m, ok := v.(map[string]any)
		if !ok {
			return wrongKind(n, p, v)
		}
		tag := n.tagDefault
		if tv, present := m[n.tagKey]; present {
			s, ok := tv.(string)
			if !ok {
				return refuse(ReasonInvalidValue, p.fieldString(n.tagKey), "must be a string, got %s", jsonKind(tv))
			}
			tag = s
		} else if tag == "" {
			return refuse(ReasonMissingField, p.fieldString(n.tagKey), "required field is missing (allowed: %s)", strings.Join(n.tagNames(), ", "))
		}
		sub, ok := n.tags[tag]
		if !ok {
			if n.tagDeny != nil {
				if d := n.tagDeny(tag); d != nil {
					return d.at(p.fieldString(n.tagKey))
				}
			}
			return refuse(ReasonUnknownType, p.fieldString(n.tagKey), "%s is not a %s moat forwards (allowed: %s); use one of those", Quote(tag), n.tagKey, strings.Join(n.tagNames(), ", "))
		}
		if r := sub.validateFields(p, m, n.tagKey); r != nil {
			return r
		}
		if sub.check != nil {
			if d := sub.check(encodeForCheck(v)); d != nil {
				return d.at(p.String())
			}
		}
		return nil
	case kOneOf:
		k := jsonKind(v)
		for _, a := range n.alts {
			if a.accepts(k) {
				return a.validate(p, v)
			}
		}
		return wrongKind(n, p, v)
	}
	return refuse(ReasonInternal, p.String(), "BUG: invalid schema node")
}

// validateFields checks every member of m against n.fields; skip names a
// member already checked by the caller (a tag). A null member counts as
// absent, as the provider APIs treat it, except for a field refused by name
// (kDeny), which is refused even as null.
func (n *node) validateFields(p *walker, m map[string]any, skip string) *Refusal {
	for _, name := range n.required {
		if v, ok := m[name]; !ok || v == nil {
			return refuse(ReasonMissingField, p.fieldString(name), "required field is missing")
		}
	}
	// Sorted for a deterministic first refusal.
	var buf [32]string
	names := buf[:0]
	for name := range m {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if name == skip {
			continue
		}
		f, ok := n.fields[name]
		if !ok {
			return refuse(ReasonUnknownField, p.fieldString(name), "field is not allowed (moat forwards only fields it knows how to check); remove it")
		}
		v := m[name]
		if v == nil {
			if f.kind == kDeny {
				// A refused field is refused by name: its presence alone
				// reaches the provider, and a provider may read null as
				// "use the default" of a feature moat refuses.
				return refuse(f.deny.code, p.fieldString(name), "%s (an explicit null is refused too: remove the field)", f.deny.msg)
			}
			continue
		}
		p.push(seg{name: name, index: -1})
		r := f.validate(p, v)
		p.pop()
		if r != nil {
			return r
		}
	}
	return nil
}

// reserveTokens finds the output limit among fields (at most one may be
// set), checks it against max and, when none is set, writes max into the
// first field. It reports whether top changed.
func reserveTokens(top map[string]any, fields []string, max int) (int, bool, *Refusal) {
	if max <= 0 {
		return 0, false, refuse(ReasonMaxTokensExceeded, "", "policy allows no output tokens (inference.max_output_tokens is 0); ask the operator to raise it")
	}
	var set []string
	changed := false
	for _, f := range fields {
		v, present := top[f]
		if !present {
			continue
		}
		if v == nil {
			delete(top, f) // null means absent; the default is written below
			changed = true
			continue
		}
		set = append(set, f)
	}
	switch len(set) {
	case 0:
		top[fields[0]] = strictjson.Number(strconv.Itoa(max))
		return max, true, nil
	case 1:
	default:
		return 0, false, refuse(ReasonInvalidValue, "", "%s are both set, which is ambiguous; set only %s (at most %d)", strings.Join(set, " and "), fields[0], max)
	}
	f := set[0]
	n, err := top[f].(strictjson.Number).Int64() // the schema checked it is an integer
	if err != nil || n < 1 {
		return 0, false, refuse(ReasonInvalidValue, f, "must be a positive integer (at most %d), got %s", max, top[f])
	}
	if n > int64(max) {
		return 0, false, refuse(ReasonMaxTokensExceeded, f, "%d is above the policy limit of %d output tokens; set %s to at most %d", n, max, f, max)
	}
	return int(n), changed, nil
}
