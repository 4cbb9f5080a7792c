package broker

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// uv.lock as a lockfile of a pypi grant (issue 19). uv writes its lock in
// TOML; moat reads it with the small parser below rather than a TOML
// library: the lock uses a narrow, machine-written subset (tables,
// arrays of tables, basic and literal strings, integers, booleans,
// arrays and one-line inline tables), a parser of that subset is a few
// hundred lines that fail closed on anything else, and moat keeps its
// dependencies few. Multi-line strings, floats, dates and dotted keys,
// which uv does not write in a lock, are refused with a message that
// says so.
//
// What it pins: every [[package]] whose source is a registry, by
// normalized name and version, with the sha256 of each of its files
// (sdist and wheels, "hash = \"sha256:<hex>\""); a registry file
// without a sha256 refuses the whole lock. Packages from elsewhere (the
// project itself: editable, virtual, directory, path; git; a direct url)
// are not served by a registry grant and are skipped, as pip would
// fetch them without the index.

// Limits of a uv.lock.
const (
	maxUVPackages   = 1 << 16
	maxUVFiles      = 4096 // files (sdist and wheels) of one package
	maxTOMLDepth    = 16
	uvLockAdvice    = "regenerate it with uv lock"
	uvLockVersion   = 1
	tomlNotInUVLock = "which uv does not write in a uv.lock; " + uvLockAdvice
)

// ParseUVLock reads the registry pins of a uv.lock (version 1); name is
// used in messages.
func ParseUVLock(name string, data []byte) ([]PyPIPin, error) {
	if len(data) > MaxLockfileBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", name, MaxLockfileBytes)
	}
	doc, err := parseTOML(data)
	if err != nil {
		return nil, fmt.Errorf("%s: not a uv.lock: %v", name, err)
	}
	v, ok := doc["version"].(int64)
	if !ok {
		return nil, fmt.Errorf("%s: no integer \"version\" at the top: not a uv.lock; %s", name, uvLockAdvice)
	}
	if v != uvLockVersion {
		return nil, fmt.Errorf("%s: version %d: moat reads uv.lock version %d; %s", name, v, uvLockVersion, uvLockAdvice)
	}
	raw, present := doc["package"]
	pkgs, ok := raw.(*tomlTables)
	if present && !ok {
		return nil, fmt.Errorf("%s: \"package\" is not an array of tables ([[package]])", name)
	}
	if pkgs == nil {
		pkgs = &tomlTables{}
	}
	idx := map[string]int{} // name==version -> index in out
	var out []PyPIPin
	for i, p := range pkgs.t {
		pn, _ := p["name"].(string)
		where := fmt.Sprintf("%s: package[%d] (%s)", name, i, pn)
		norm, bad := normalizePyPIName(pn)
		if bad != "" {
			return nil, fmt.Errorf("%s: %s", where, bad)
		}
		src, ok := asTable(p["source"])
		if !ok {
			return nil, fmt.Errorf("%s: no source table (source = { registry = \"...\" }); %s", where, uvLockAdvice)
		}
		if _, ok := src["registry"]; !ok {
			continue // the project, a git, path or url source: not fetched from an index
		}
		if reg, ok := src["registry"].(string); !ok || reg == "" {
			return nil, fmt.Errorf("%s: source.registry is not a URL", where)
		}
		ver, _ := p["version"].(string)
		if msg := checkPyPIVersion(ver); msg != "" {
			return nil, fmt.Errorf("%s: %s", where, msg)
		}
		var files []any
		if sd, ok := p["sdist"]; ok {
			files = append(files, sd)
		}
		if wh, ok := p["wheels"]; ok {
			ws, ok := wh.([]any)
			if !ok {
				return nil, fmt.Errorf("%s: wheels is not an array", where)
			}
			files = append(files, ws...)
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("%s: a registry package without sdist or wheels: nothing to pin; %s", where, uvLockAdvice)
		}
		if len(files) > maxUVFiles {
			return nil, fmt.Errorf("%s: more than %d files", where, maxUVFiles)
		}
		var hashes []string
		for j, f := range files {
			ft, ok := asTable(f)
			if !ok {
				return nil, fmt.Errorf("%s: file %d is not a table", where, j)
			}
			h, ok := ft["hash"].(string)
			if !ok {
				u, _ := ft["url"].(string)
				return nil, fmt.Errorf("%s: file %s has no hash: moat admits only files whose sha256 the lock pins; %s", where, strconv.Quote(u), uvLockAdvice)
			}
			hx, ok := strings.CutPrefix(h, "sha256:")
			if !ok || len(hx) != 64 || !isLowerHex(hx) {
				return nil, fmt.Errorf("%s: hash %s is not sha256:<64 lower-case hex digits>", where, strconv.Quote(h))
			}
			if !slices.Contains(hashes, hx) {
				hashes = append(hashes, hx)
			}
		}
		id := norm + "==" + ver
		if k, dup := idx[id]; dup {
			for _, h := range hashes {
				if !slices.Contains(out[k].SHA256, h) {
					out[k].SHA256 = append(out[k].SHA256, h)
				}
			}
			continue
		}
		idx[id] = len(out)
		out = append(out, PyPIPin{Name: norm, Version: ver, SHA256: hashes, Lockfile: name})
	}
	return out, nil
}

// tomlParser parses the TOML subset described above into map[string]any
// (tables), []any (arrays, and arrays of tables as []any of tables),
// string, int64 and bool.
type tomlParser struct {
	s    string
	pos  int
	line int
}

func (p *tomlParser) errf(format string, a ...any) error {
	return fmt.Errorf("line %d: %s", p.line, fmt.Sprintf(format, a...))
}

func parseTOML(data []byte) (map[string]any, error) {
	if !utf8.Valid(data) {
		return nil, fmt.Errorf("not UTF-8")
	}
	p := &tomlParser{s: string(data), line: 1}
	root := map[string]any{}
	cur := root
	defined := map[string]bool{} // [table] headers seen, by their path
	for {
		p.skipSpaceCommentsNewlines()
		if p.pos >= len(p.s) {
			return root, nil
		}
		if p.s[p.pos] == '[' {
			array := strings.HasPrefix(p.s[p.pos:], "[[")
			if array {
				p.pos += 2
			} else {
				p.pos++
			}
			keys, err := p.keyPath()
			if err != nil {
				return nil, err
			}
			p.skipSpace()
			closing := "]"
			if array {
				closing = "]]"
			}
			if !strings.HasPrefix(p.s[p.pos:], closing) {
				return nil, p.errf("table header not closed by %s", closing)
			}
			p.pos += len(closing)
			if cur, err = p.header(root, keys, array, defined); err != nil {
				return nil, err
			}
			if err := p.endOfLine(); err != nil {
				return nil, err
			}
			continue
		}
		if err := p.keyValue(cur); err != nil {
			return nil, err
		}
		if err := p.endOfLine(); err != nil {
			return nil, err
		}
	}
}

// tomlTables is an array of tables made by [[...]] headers (a later
// [a.b] header goes into its last table); inline arrays are []any and
// inline tables tomlInline, which no header may extend.
type tomlTables struct{ t []map[string]any }

type tomlInline map[string]any

// asTable is a table, made by a header or inline.
func asTable(v any) (map[string]any, bool) {
	switch x := v.(type) {
	case map[string]any:
		return x, true
	case tomlInline:
		return x, true
	}
	return nil, false
}

// header finds or makes the table a [a.b] or [[a.b]] header names; a
// path through an array of tables goes into its last table.
func (p *tomlParser) header(root map[string]any, keys []string, array bool, defined map[string]bool) (map[string]any, error) {
	t := root
	name := strings.Join(keys, ".")
	var id strings.Builder // the table's identity: its path, each array's current length
	for i, k := range keys {
		last := i == len(keys)-1
		v, ok := t[k]
		id.WriteString(strconv.Quote(k) + ".")
		switch x := v.(type) {
		case nil:
			if ok {
				return nil, p.errf("BUG: nil value at %s", name)
			}
			nt := map[string]any{}
			if last && array {
				t[k] = &tomlTables{t: []map[string]any{nt}}
				return nt, nil
			}
			t[k] = nt
			t = nt
		case *tomlTables:
			if last && array {
				if len(x.t) >= maxUVPackages {
					return nil, p.errf("more than %d [[%s]] tables", maxUVPackages, name)
				}
				nt := map[string]any{}
				x.t = append(x.t, nt)
				return nt, nil
			}
			fmt.Fprintf(&id, "#%d.", len(x.t))
			t = x.t[len(x.t)-1]
		case map[string]any:
			if last && array {
				return nil, p.errf("[[%s]]: %s is already a table", name, k)
			}
			t = x
		case tomlInline:
			return nil, p.errf("[%s]: %s was defined inline ({...}) and cannot be extended", name, k)
		default:
			return nil, p.errf("[%s]: %s is a value, not a table", name, k)
		}
	}
	// A [table] is defined once.
	if defined[id.String()] {
		return nil, p.errf("table [%s] is defined twice", name)
	}
	defined[id.String()] = true
	return t, nil
}

func (p *tomlParser) keyValue(t map[string]any) error {
	keys, err := p.keyPath()
	if err != nil {
		return err
	}
	if len(keys) != 1 {
		return p.errf("dotted key %s, %s", strings.Join(keys, "."), tomlNotInUVLock)
	}
	p.skipSpace()
	if p.pos >= len(p.s) || p.s[p.pos] != '=' {
		return p.errf("expected = after key %s", strconv.Quote(keys[0]))
	}
	p.pos++
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return err
	}
	if _, dup := t[keys[0]]; dup {
		return p.errf("key %s is defined twice", strconv.Quote(keys[0]))
	}
	t[keys[0]] = v
	return nil
}

// keyPath reads a key: bare or quoted parts joined by dots.
func (p *tomlParser) keyPath() ([]string, error) {
	var keys []string
	for {
		p.skipSpace()
		if p.pos >= len(p.s) {
			return nil, p.errf("expected a key, found the end")
		}
		var k string
		switch c := p.s[p.pos]; {
		case c == '"':
			s, err := p.basicString()
			if err != nil {
				return nil, err
			}
			k = s
		case c == '\'':
			s, err := p.literalString()
			if err != nil {
				return nil, err
			}
			k = s
		default:
			start := p.pos
			for p.pos < len(p.s) && isBareKeyChar(p.s[p.pos]) {
				p.pos++
			}
			if p.pos == start {
				return nil, p.errf("expected a key, found %s", strconv.QuoteRune(rune(c)))
			}
			k = p.s[start:p.pos]
		}
		keys = append(keys, k)
		p.skipSpace()
		if p.pos < len(p.s) && p.s[p.pos] == '.' {
			p.pos++
			continue
		}
		if len(keys) > maxTOMLDepth {
			return nil, p.errf("key nested deeper than %d", maxTOMLDepth)
		}
		return keys, nil
	}
}

func isBareKeyChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_'
}

func (p *tomlParser) value(depth int) (any, error) {
	if depth > maxTOMLDepth {
		return nil, p.errf("values nested deeper than %d", maxTOMLDepth)
	}
	if p.pos >= len(p.s) {
		return nil, p.errf("expected a value, found the end")
	}
	switch c := p.s[p.pos]; {
	case strings.HasPrefix(p.s[p.pos:], `"""`) || strings.HasPrefix(p.s[p.pos:], `'''`):
		return nil, p.errf("a multi-line string, %s", tomlNotInUVLock)
	case c == '"':
		return p.basicString()
	case c == '\'':
		return p.literalString()
	case c == '[':
		return p.array(depth)
	case c == '{':
		return p.inlineTable(depth)
	case strings.HasPrefix(p.s[p.pos:], "true") && !p.bareAt(p.pos+4):
		p.pos += 4
		return true, nil
	case strings.HasPrefix(p.s[p.pos:], "false") && !p.bareAt(p.pos+5):
		p.pos += 5
		return false, nil
	case c == '+' || c == '-' || '0' <= c && c <= '9':
		start := p.pos
		for p.pos < len(p.s) && (isBareKeyChar(p.s[p.pos]) || strings.IndexByte("+.:", p.s[p.pos]) >= 0) {
			p.pos++
		}
		tok := p.s[start:p.pos]
		digits := strings.TrimLeft(tok, "+-")
		if strings.HasPrefix(digits, "_") || strings.HasSuffix(digits, "_") || strings.Contains(digits, "__") ||
			len(digits) > 1 && digits[0] == '0' {
			return nil, p.errf("%s is not a decimal integer", strconv.Quote(tok))
		}
		n, err := strconv.ParseInt(strings.ReplaceAll(tok, "_", ""), 10, 64)
		if err != nil {
			return nil, p.errf("%s is not a decimal integer (floats, dates and times are values %s)", strconv.Quote(tok), tomlNotInUVLock)
		}
		return n, nil
	default:
		return nil, p.errf("unexpected %s where a value belongs", strconv.QuoteRune(rune(c)))
	}
}

func (p *tomlParser) bareAt(i int) bool { return i < len(p.s) && isBareKeyChar(p.s[i]) }

func (p *tomlParser) array(depth int) (any, error) {
	p.pos++ // [
	out := []any{}
	for {
		p.skipSpaceCommentsNewlines()
		if p.pos >= len(p.s) {
			return nil, p.errf("array not closed by ]")
		}
		if p.s[p.pos] == ']' {
			p.pos++
			return out, nil
		}
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
		p.skipSpaceCommentsNewlines()
		if p.pos >= len(p.s) {
			return nil, p.errf("array not closed by ]")
		}
		if p.s[p.pos] == ',' {
			p.pos++
			continue
		}
		if p.s[p.pos] == ']' {
			p.pos++
			return out, nil
		}
		return nil, p.errf("expected , or ] in an array")
	}
}

// inlineTable reads { k = v, ... } on one line (TOML allows no newline
// and no trailing comma in it).
func (p *tomlParser) inlineTable(depth int) (any, error) {
	p.pos++ // {
	t := tomlInline{}
	p.skipSpace()
	if p.pos < len(p.s) && p.s[p.pos] == '}' {
		p.pos++
		return t, nil
	}
	for {
		keys, err := p.keyPath()
		if err != nil {
			return nil, err
		}
		if len(keys) != 1 {
			return nil, p.errf("dotted key %s, %s", strings.Join(keys, "."), tomlNotInUVLock)
		}
		p.skipSpace()
		if p.pos >= len(p.s) || p.s[p.pos] != '=' {
			return nil, p.errf("expected = after key %s in an inline table", strconv.Quote(keys[0]))
		}
		p.pos++
		p.skipSpace()
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		if _, dup := t[keys[0]]; dup {
			return nil, p.errf("key %s is defined twice in an inline table", strconv.Quote(keys[0]))
		}
		t[keys[0]] = v
		p.skipSpace()
		if p.pos >= len(p.s) {
			return nil, p.errf("inline table not closed by }")
		}
		switch p.s[p.pos] {
		case ',':
			p.pos++
			continue
		case '}':
			p.pos++
			return t, nil
		}
		return nil, p.errf("expected , or } in an inline table (which must fit on one line)")
	}
}

func (p *tomlParser) basicString() (string, error) {
	p.pos++ // "
	var b strings.Builder
	for p.pos < len(p.s) {
		c := p.s[p.pos]
		switch {
		case c == '"':
			p.pos++
			return b.String(), nil
		case c == '\n' || c == '\r':
			return "", p.errf("string not closed on its line")
		case c == '\\':
			if p.pos+1 >= len(p.s) {
				return "", p.errf("string not closed")
			}
			e := p.s[p.pos+1]
			p.pos += 2
			switch e {
			case '"', '\\':
				b.WriteByte(e)
			case 'b':
				b.WriteByte('\b')
			case 't':
				b.WriteByte('\t')
			case 'n':
				b.WriteByte('\n')
			case 'f':
				b.WriteByte('\f')
			case 'r':
				b.WriteByte('\r')
			case 'u', 'U':
				n := 4
				if e == 'U' {
					n = 8
				}
				if p.pos+n > len(p.s) {
					return "", p.errf("short \\%c escape", e)
				}
				r, err := strconv.ParseUint(p.s[p.pos:p.pos+n], 16, 32)
				if err != nil || !utf8.ValidRune(rune(r)) {
					return "", p.errf("bad \\%c escape %s", e, strconv.Quote(p.s[p.pos:p.pos+n]))
				}
				b.WriteRune(rune(r))
				p.pos += n
			default:
				return "", p.errf("unknown escape \\%c", e)
			}
		case c < 0x20 && c != '\t' || c == 0x7f:
			return "", p.errf("control character 0x%02x in a string", c)
		default:
			b.WriteByte(c)
			p.pos++
		}
	}
	return "", p.errf("string not closed")
}

func (p *tomlParser) literalString() (string, error) {
	p.pos++ // '
	start := p.pos
	for p.pos < len(p.s) {
		c := p.s[p.pos]
		switch {
		case c == '\'':
			p.pos++
			return p.s[start : p.pos-1], nil
		case c == '\n' || c == '\r':
			return "", p.errf("string not closed on its line")
		case c < 0x20 && c != '\t' || c == 0x7f:
			return "", p.errf("control character 0x%02x in a string", c)
		}
		p.pos++
	}
	return "", p.errf("string not closed")
}

func (p *tomlParser) skipSpace() {
	for p.pos < len(p.s) && (p.s[p.pos] == ' ' || p.s[p.pos] == '\t') {
		p.pos++
	}
}

// skipSpaceCommentsNewlines skips whitespace, comments and line ends.
func (p *tomlParser) skipSpaceCommentsNewlines() {
	for p.pos < len(p.s) {
		switch p.s[p.pos] {
		case ' ', '\t', '\r':
			p.pos++
		case '\n':
			p.pos++
			p.line++
		case '#':
			for p.pos < len(p.s) && p.s[p.pos] != '\n' {
				p.pos++
			}
		default:
			return
		}
	}
}

// endOfLine accepts spaces and a comment, then a line end or the end.
func (p *tomlParser) endOfLine() error {
	p.skipSpace()
	if p.pos < len(p.s) && p.s[p.pos] == '#' {
		for p.pos < len(p.s) && p.s[p.pos] != '\n' {
			p.pos++
		}
	}
	if p.pos < len(p.s) && p.s[p.pos] == '\r' {
		p.pos++
	}
	if p.pos >= len(p.s) {
		return nil
	}
	if p.s[p.pos] != '\n' {
		return p.errf("unexpected %s after a value (one key = value per line)", strconv.QuoteRune(rune(p.s[p.pos])))
	}
	return nil
}
