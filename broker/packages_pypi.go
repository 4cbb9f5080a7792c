package broker

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"html"
	"net/url"
	"regexp"
	"strings"
	"sync"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/policy"
)

// PyPI (kind pypi): PIP_INDEX_URL=http://127.0.0.1:PORT/pkg/pypi/simple/.
//
//   - simple/<name>/ (PEP 503, HTML) is fetched from the upstream after a
//     durable package.requested and served rewritten: only the links
//     whose #sha256= is one the requirements files pin for that name,
//     each pointing at the broker's files/<sha256>/<filename>; a link to a
//     host other than upstream and files_upstream is dropped.
//   - files/<sha256>/<filename> is served only for a pinned sha256 whose
//     link the index gave: fetched from that link after a durable
//     package.requested, served only if the bytes' sha256 matches.
//
// Uploads (twine) and every other path or method are refused.
type pypiRegistry struct {
	*registry
	files  *url.URL // files_upstream, nil: upstream's host only
	byName map[string][]*PyPIPin
	byHash map[string]*PyPIPin
	mu     sync.Mutex
	links  map[string]string // sha256 -> the file's URL, learned from the index
}

func newPyPIRegistry(base *registry, pins []PyPIPin) (*pypiRegistry, error) {
	r := &pypiRegistry{registry: base, byName: map[string][]*PyPIPin{}, byHash: map[string]*PyPIPin{}, links: map[string]string{}}
	if f := base.grant.FilesUpstream; f != "" {
		u, err := url.Parse(f)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return nil, fmt.Errorf("moat: broker: packages: files_upstream %q must be https://host", f)
		}
		r.files = u
	}
	for i := range pins {
		p := &pins[i]
		r.byName[p.Name] = append(r.byName[p.Name], p)
		for _, h := range p.SHA256 {
			if prev, dup := r.byHash[h]; dup && (prev.Name != p.Name || prev.Version != p.Version) {
				return nil, fmt.Errorf("moat: broker: packages: sha256 %s is pinned for %s==%s and %s==%s", h, prev.Name, prev.Version, p.Name, p.Version)
			}
			r.byHash[h] = p
		}
	}
	return r, nil
}

// Compiled on first use, not in every moat process's start-up.
var pypiAnchor = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(?is)<a\s[^>]*?href\s*=\s*"([^"]*)"[^>]*>`)
})

func (b *Broker) servePyPI(x *exchange, req *request, r *pypiRegistry, rest string) bool {
	kind := policy.PackagePyPI
	if name, ok := strings.CutPrefix(rest, "simple/"); ok {
		name = strings.TrimSuffix(name, "/")
		if len(r.byName[name]) == 0 {
			msg := fmt.Sprintf("package %s is not in the requirements (%s); add it there with its --hash (pip-compile --generate-hashes) and start a new run", quote(name), r.lockfiles())
			if norm, bad := normalizePyPIName(name); bad != "" || norm != name {
				msg = fmt.Sprintf("%s is not a normalized package name the requirements (%s) pin", quote(name), r.lockfiles())
			}
			return b.refusePackage(x, kind, name, req.method, refuse(ReasonPackageNotPinned, 404, "%s", msg))
		}
		path := "/simple/" + name + "/"
		rec := audit.PackageRequested{RequestID: x.id, Kind: kind, Artifact: audit.PackageArtifactMetadata, Name: name, Path: path}
		status, data, ok := b.fetchPackage(x, req, r.registry, rec, path, "text/html")
		if !ok {
			return false
		}
		page, err := r.filterIndex(name, path, data)
		if err != nil {
			return b.packageFailure(x, status, ReasonPackageMetadata, 502, "", fmt.Sprintf("the upstream's index page for %s cannot be read: %v", name, err))
		}
		return b.completePackage(x, req, page, "text/html; charset=utf-8")
	}
	if f, ok := strings.CutPrefix(rest, "files/"); ok {
		sum, file, _ := strings.Cut(f, "/")
		pin := r.byHash[sum]
		r.mu.Lock()
		link := r.links[sum]
		r.mu.Unlock()
		if pin == nil || link == "" || strings.Contains(file, "/") {
			return b.refusePackage(x, kind, "", req.method, refuse(ReasonPackageNotPinned, 404,
				"file %s is not one the requirements (%s) pin, or its index page was not fetched first", quote(f), r.lockfiles()))
		}
		rec := audit.PackageRequested{RequestID: x.id, Kind: kind, Artifact: audit.PackageArtifactFile, Name: pin.Name, Version: pin.Version,
			Expected: "sha256:" + sum, Path: link, Lockfile: pin.Lockfile}
		status, data, ok := b.fetchPackage(x, req, r.registry, rec, link, "application/octet-stream")
		if !ok {
			return false
		}
		if got := sha256.Sum256(data); hex.EncodeToString(got[:]) != sum {
			return b.packageFailure(x, status, ReasonPackageDigest, 502, "sha256:"+hex.EncodeToString(got[:]),
				fmt.Sprintf("the file %s of %s==%s from the upstream does not match the requirements' hash (%s): nothing was served", file, pin.Name, pin.Version, pin.Lockfile))
		}
		return b.completePackage(x, req, data, "application/octet-stream")
	}
	return b.refusePackage(x, kind, "", req.method, refuse(ReasonPackageEndpoint, 404,
		"%s is not served: moat serves simple/<name>/ and the files the requirements (%s) pin (no uploads)", quote("/"+rest), r.lockfiles()))
}

// filterIndex keeps the links of a PEP 503 page whose sha256 is pinned
// for name and whose URL is on upstream or files_upstream, remembers
// each one's URL, and writes a page of links to the broker.
func (r *pypiRegistry) filterIndex(name, path string, data []byte) ([]byte, error) {
	base := *r.upstream
	base.Path = strings.TrimSuffix(base.Path, "/") + path
	var out strings.Builder
	out.WriteString("<!DOCTYPE html>\n<html><body>\n")
	seen := map[string]bool{}
	for _, m := range pypiAnchor().FindAllSubmatch(data, -1) {
		href := html.UnescapeString(string(m[1]))
		u, err := base.Parse(href)
		if err != nil {
			continue
		}
		sum, ok := strings.CutPrefix(u.Fragment, "sha256=")
		sum = strings.ToLower(sum)
		pin := r.byHash[sum]
		if !ok || pin == nil || pin.Name != name || seen[sum] || u.Scheme != "https" || u.User != nil ||
			!(u.Host == r.upstream.Host || r.files != nil && u.Host == r.files.Host) {
			continue
		}
		file := u.Path[strings.LastIndexByte(u.Path, '/')+1:]
		if file == "" || checkPath("/"+file) != nil {
			continue
		}
		u.Fragment, u.RawFragment = "", ""
		seen[sum] = true
		r.mu.Lock()
		r.links[sum] = u.String()
		r.mu.Unlock()
		fmt.Fprintf(&out, "<a href=\"/pkg/pypi/files/%s/%s#sha256=%s\">%s</a><br/>\n", sum, html.EscapeString(file), sum, html.EscapeString(file))
	}
	out.WriteString("</body></html>\n")
	return []byte(out.String()), nil
}
