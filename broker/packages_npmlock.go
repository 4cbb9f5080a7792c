package broker

import (
	"bytes"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// An NPMPin is one artifact a package-lock.json pins: the registry
// tarball of Name at Version, found at Resolved, whose bytes must have
// the SHA-512 digest Integrity.
type NPMPin struct {
	Name     string
	Version  string
	Resolved string // the lockfile's resolved URL (http or https)
	// TarballPath is Resolved's path ("/name/-/name-1.0.0.tgz"): the
	// broker fetches it from the grant's upstream, whatever host the
	// lockfile or a packument names.
	TarballPath string
	Integrity   [sha512.Size]byte
	Lockfile    string // the lockfile that pins it
	// HasInstallScript is the lockfile's hasInstallScript: the packument
	// moat serves says so, and npm then runs the install scripts of the
	// verified tarball's package.json (never the upstream metadata's).
	HasInstallScript bool
	// Bin is the lockfile's bin (command name -> file in the package):
	// the served packument's, never the upstream metadata's.
	Bin map[string]string
}

// IntegrityString is the pin in npm's SRI form ("sha512-<base64>").
func (p *NPMPin) IntegrityString() string {
	return "sha512-" + base64.StdEncoding.EncodeToString(p.Integrity[:])
}

// Limits of a package-lock.json.
const (
	MaxLockfileBytes   = 64 << 20
	maxNPMNameLen      = 214
	maxNPMVersionLen   = 256
	maxNPMLockEntries  = 1 << 17
	npmLockfileAdvice  = "regenerate it with npm 7 or later (npm install --lockfile-version 3)"
	npmTarballSep      = "/-/"
	maxNPMResolvedLen  = 2048
	maxNPMIntegrityLen = 4096
)

// npmLockfile is the part of package-lock.json v2/v3 moat reads.
type npmLockfile struct {
	LockfileVersion int                        `json:"lockfileVersion"`
	Packages        map[string]json.RawMessage `json:"packages"`
}

type npmLockEntry struct {
	Name      string `json:"name"`
	Version   string `json:"version"`
	Resolved  string `json:"resolved"`
	Integrity string `json:"integrity"`
	Link      bool   `json:"link"`
	InBundle  bool   `json:"inBundle"`

	HasInstallScript bool            `json:"hasInstallScript"`
	Bin              json.RawMessage `json:"bin"`
}

// ParseNPMLockfile reads the pins of a package-lock.json (lockfileVersion
// 2 or 3, its "packages" map). Entries that the registry does not serve
// are skipped: the root (""), workspace links, bundled dependencies (they
// come inside their parent's tarball) and entries resolved to a git
// repository or a local file. Every registry entry must carry a sha512
// integrity; one that does not, or whose name, version or resolved URL
// is malformed, refuses the whole lockfile, as do two entries pinning
// one name and version to different digests. name is used in messages.
func ParseNPMLockfile(name string, data []byte) ([]NPMPin, error) {
	if len(data) > MaxLockfileBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", name, MaxLockfileBytes)
	}
	var lf npmLockfile
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&lf); err != nil {
		return nil, fmt.Errorf("%s: not a package-lock.json: %v", name, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: not a package-lock.json: data after the JSON object", name)
	}
	if lf.LockfileVersion != 2 && lf.LockfileVersion != 3 {
		return nil, fmt.Errorf("%s: lockfileVersion %d: moat reads versions 2 and 3; %s", name, lf.LockfileVersion, npmLockfileAdvice)
	}
	if lf.Packages == nil {
		return nil, fmt.Errorf("%s: no \"packages\" section; %s", name, npmLockfileAdvice)
	}
	if len(lf.Packages) > maxNPMLockEntries {
		return nil, fmt.Errorf("%s: more than %d entries", name, maxNPMLockEntries)
	}
	keys := make([]string, 0, len(lf.Packages))
	for k := range lf.Packages {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	seen := map[string]int{} // name@version -> index in out
	var out []NPMPin
	for _, key := range keys {
		if key == "" {
			continue
		}
		var e npmLockEntry
		if err := json.Unmarshal(lf.Packages[key], &e); err != nil {
			return nil, fmt.Errorf("%s: packages[%q]: %v", name, key, err)
		}
		if e.Link || e.InBundle {
			continue
		}
		i := strings.LastIndex(key, "node_modules/")
		if i < 0 {
			continue // a workspace member's own directory, not a registry artifact
		}
		pkg := key[i+len("node_modules/"):]
		if e.Name != "" {
			pkg = e.Name // an alias ("x": "npm:real@1") installs real under x
		}
		if e.Resolved == "" {
			if e.Version != "" && e.Integrity == "" {
				continue // bundled or otherwise not fetched from a registry
			}
			return nil, fmt.Errorf("%s: packages[%q] has no resolved URL; %s", name, key, npmLockfileAdvice)
		}
		u, err := url.Parse(e.Resolved)
		if err != nil || len(e.Resolved) > maxNPMResolvedLen {
			return nil, fmt.Errorf("%s: packages[%q]: resolved %q is not a URL", name, key, e.Resolved)
		}
		if u.Scheme != "https" && u.Scheme != "http" {
			continue // git+ssh:, file:, ...: not served by a registry grant
		}
		if msg := checkNPMName(pkg); msg != "" {
			return nil, fmt.Errorf("%s: packages[%q]: %s", name, key, msg)
		}
		if msg := checkNPMVersion(e.Version); msg != "" {
			return nil, fmt.Errorf("%s: packages[%q]: %s", name, key, msg)
		}
		p := NPMPin{Name: pkg, Version: e.Version, Resolved: e.Resolved, TarballPath: u.EscapedPath(), Lockfile: name, HasInstallScript: e.HasInstallScript}
		if len(e.Bin) > 0 && json.Unmarshal(e.Bin, &p.Bin) != nil {
			p.Bin = nil // not npm's {name: path}: no bins served (npm ci reads its own lockfile)
		}
		if u.User != nil || u.RawQuery != "" || u.Fragment != "" || !strings.HasSuffix(p.TarballPath, ".tgz") ||
			!strings.Contains(p.TarballPath, "/"+pkg+npmTarballSep) || checkPath(p.TarballPath) != nil {
			return nil, fmt.Errorf("%s: packages[%q]: resolved %q is not a registry tarball URL of %s (…/%s/-/….tgz)", name, key, e.Resolved, pkg, pkg)
		}
		sum, err := parseSHA512Integrity(e.Integrity)
		if err != nil {
			return nil, fmt.Errorf("%s: packages[%q] (%s@%s): %v", name, key, pkg, e.Version, err)
		}
		p.Integrity = sum
		id := pkg + "@" + e.Version
		if j, dup := seen[id]; dup {
			if out[j].Integrity != sum {
				return nil, fmt.Errorf("%s: %s is pinned twice with different integrity", name, id)
			}
			out[j].HasInstallScript = out[j].HasInstallScript || e.HasInstallScript
			continue
		}
		seen[id] = len(out)
		out = append(out, p)
	}
	return out, nil
}

// parseSHA512Integrity picks the sha512 of an SRI string ("sha512-<b64>
// sha1-<b64>" ...); there must be exactly one distinct sha512.
func parseSHA512Integrity(s string) ([sha512.Size]byte, error) {
	var sum [sha512.Size]byte
	if len(s) > maxNPMIntegrityLen {
		return sum, fmt.Errorf("integrity is longer than %d bytes", maxNPMIntegrityLen)
	}
	found := false
	for _, f := range strings.Fields(s) {
		b64, ok := strings.CutPrefix(f, "sha512-")
		if !ok {
			continue
		}
		b64, _, _ = strings.Cut(b64, "?") // SRI options
		raw, err := base64.StdEncoding.DecodeString(b64)
		if err != nil || len(raw) != sha512.Size {
			return sum, fmt.Errorf("integrity %q: not a sha512 digest in base64", f)
		}
		if found && [sha512.Size]byte(raw) != sum {
			return sum, fmt.Errorf("integrity %q holds two different sha512 digests", s)
		}
		sum, found = [sha512.Size]byte(raw), true
	}
	if !found {
		return sum, fmt.Errorf("integrity %q has no sha512 digest: moat cannot check the tarball; %s", s, npmLockfileAdvice)
	}
	return sum, nil
}

// checkNPMName: an npm package name, "name" or "@scope/name", each part
// of [A-Za-z0-9._~-] not starting with '.' or '_' ("" when good).
func checkNPMName(n string) string {
	if n == "" || len(n) > maxNPMNameLen {
		return fmt.Sprintf("package name %q is empty or longer than %d bytes", n, maxNPMNameLen)
	}
	parts := []string{n}
	if rest, ok := strings.CutPrefix(n, "@"); ok {
		scope, pkg, ok := strings.Cut(rest, "/")
		if !ok {
			return fmt.Sprintf("package name %q: a scope needs @scope/name", n)
		}
		parts = []string{scope, pkg}
	}
	for _, p := range parts {
		if p == "" || p[0] == '.' || p[0] == '_' {
			return fmt.Sprintf("package name %q is not a registry name", n)
		}
		for i := 0; i < len(p); i++ {
			c := p[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~') {
				return fmt.Sprintf("package name %q holds byte 0x%02x", n, c)
			}
		}
	}
	return ""
}

// checkNPMVersion: a semver-shaped version of [0-9A-Za-z.+-].
func checkNPMVersion(v string) string {
	if v == "" || len(v) > maxNPMVersionLen || v[0] < '0' || v[0] > '9' {
		return fmt.Sprintf("version %q is not a registry version", v)
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '+') {
			return fmt.Sprintf("version %q holds byte 0x%02x", v, c)
		}
	}
	return ""
}

// newNPMRegistry indexes the npm pins by tarball path and by name; two
// pins of one tarball path with different digests refuse the set.
func newNPMRegistry(base *registry, self string, pins []NPMPin) (*npmRegistry, error) {
	r := &npmRegistry{registry: base, self: self, byTarball: map[string]*NPMPin{}, byName: map[string][]*NPMPin{}}
	for j := range pins {
		pin := &pins[j]
		if prev, dup := r.byTarball[pin.TarballPath]; dup && prev.Integrity != pin.Integrity {
			return nil, fmt.Errorf("moat: broker: packages: %s is pinned to two digests (%s and %s)", pin.TarballPath, prev.Lockfile, pin.Lockfile)
		}
		r.byTarball[pin.TarballPath] = pin
		if !slices.ContainsFunc(r.byName[pin.Name], func(q *NPMPin) bool { return q.Version == pin.Version }) {
			r.byName[pin.Name] = append(r.byName[pin.Name], pin)
		}
	}
	return r, nil
}

// npmScopedTarget decodes the one escape npm puts in a scoped package's
// packument path: "/pkg/npm/@scope%2fname" (npm's escapedName; "%2F"
// too) becomes "/pkg/npm/@scope/name", the same packument. Only the
// escape right after a well-formed scope is decoded; every other '%'
// is left for checkPath to refuse.
func npmScopedTarget(target string) string {
	const prefix = PackagesPathPrefix + "npm/@"
	rest, ok := strings.CutPrefix(target, prefix)
	if !ok {
		return target
	}
	i := strings.IndexByte(rest, '%')
	if i <= 0 || len(rest) < i+3 || !strings.EqualFold(rest[i:i+3], "%2f") {
		return target
	}
	for j := 0; j < i; j++ {
		c := rest[j]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~') {
			return target
		}
	}
	return prefix + rest[:i] + "/" + rest[i+3:]
}
