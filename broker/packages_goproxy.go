package broker

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/policy"
)

// The Go module proxy (kind goproxy): GOPROXY=http://127.0.0.1:PORT/pkg/goproxy.
// Of the proxy protocol moat serves, for the module versions the go.sum
// files pin:
//
//   - <module>/@v/list and <module>/@v/<version>.info, answered by moat
//     from go.sum (no fetch, nothing journaled): the list holds only the
//     pinned versions, so no resolver can pick another;
//   - <module>/@v/<version>.mod and .zip, fetched from the upstream
//     after a durable package.requested and served only if their h1 hash
//     (golang.org/x/mod/sumdb/dirhash's Hash1: of the go.mod, or of the
//     zip's files) equals go.sum's.
//
// <module>/@latest, the checksum database (sumdb/...) and anything else
// are refused; so are modules and versions go.sum does not pin.
type goRegistry struct {
	*registry
	pins     map[string]*GoPin // module@version
	versions map[string][]string
}

// maxGoZipContent caps the decoded contents of a module zip (the go
// command's own limit is 500 MB).
const maxGoZipContent = 512 << 20

func newGoRegistry(base *registry, pins []GoPin) (*goRegistry, error) {
	g := &goRegistry{registry: base, pins: map[string]*GoPin{}, versions: map[string][]string{}}
	for i := range pins {
		p := &pins[i]
		id := p.Module + "@" + p.Version
		prev, ok := g.pins[id]
		if !ok {
			cp := *p
			g.pins[id] = &cp
			g.versions[p.Module] = append(g.versions[p.Module], p.Version)
			continue
		}
		for _, h := range []struct{ have, add *string }{{&prev.ZipHash, &p.ZipHash}, {&prev.ModHash, &p.ModHash}} {
			switch {
			case *h.add == "":
			case *h.have == "":
				*h.have = *h.add
			case *h.have != *h.add:
				return nil, fmt.Errorf("moat: broker: packages: %s is pinned to two different hashes (%s and %s)", id, prev.Lockfile, p.Lockfile)
			}
		}
	}
	for m := range g.versions {
		slices.SortFunc(g.versions[m], func(a, b string) int { return compareSemver(a[1:], b[1:]) })
	}
	return g, nil
}

func (b *Broker) serveGoProxy(x *exchange, req *request, g *goRegistry, rest string) bool {
	kind := policy.PackageGoProxy
	escMod, file, ok := strings.Cut(rest, "/@v/")
	if !ok || strings.Contains(file, "/") {
		return b.refusePackage(x, kind, "", req.method, refuse(ReasonPackageEndpoint, 404,
			"%s is not served: moat serves <module>/@v/list, .info, .mod and .zip of the versions %s pins (no @latest, no checksum database)", quote("/"+rest), g.lockfiles()))
	}
	mod, ok := goUnescape(escMod)
	if !ok || checkGoModule(mod) != "" {
		return b.refusePackage(x, kind, "", req.method, refuse(ReasonPackageNotPinned, 404, "%s is not a module path go.sum pins (%s)", quote(escMod), g.lockfiles()))
	}
	if len(g.versions[mod]) == 0 {
		return b.refusePackage(x, kind, mod, req.method, refuse(ReasonPackageNotPinned, 404,
			"module %s is not in go.sum (%s); add it there (go get %s outside the sandbox, or with a grant that allows it) and start a new run", mod, g.lockfiles(), mod))
	}
	if file == "list" {
		return b.answerPackage(x, req, []byte(strings.Join(g.versions[mod], "\n")+"\n"), "text/plain; charset=utf-8")
	}
	var ext string
	for _, e := range []string{".info", ".mod", ".zip"} {
		if v, ok := strings.CutSuffix(file, e); ok {
			file, ext = v, e
			break
		}
	}
	ver, ok := goUnescape(file)
	if ext == "" || !ok || checkGoVersion(ver) != "" {
		return b.refusePackage(x, kind, mod, req.method, refuse(ReasonPackageEndpoint, 404, "%s is not served: want <version>.info, .mod or .zip", quote(file+ext)))
	}
	pin := g.pins[mod+"@"+ver]
	hash := ""
	if pin != nil {
		switch ext {
		case ".info":
			hash = "-"
		case ".mod":
			hash = pin.ModHash
		case ".zip":
			hash = pin.ZipHash
		}
	}
	if hash == "" {
		return b.refusePackage(x, kind, mod, req.method, refuse(ReasonPackageVersion, 404,
			"%s@%s%s is not pinned: go.sum (%s) pins %s at %s only; update go.sum to change versions", mod, ver, ext, g.lockfiles(), mod, strings.Join(g.versions[mod], ", ")))
	}
	if ext == ".info" {
		info, _ := json.Marshal(map[string]string{"Version": ver})
		return b.answerPackage(x, req, info, "application/json")
	}
	artifact := "go.mod"
	if ext == ".zip" {
		artifact = "zip"
	}
	path := "/" + goEscape(mod) + "/@v/" + goEscape(ver) + ext
	rec := audit.PackageRequested{RequestID: x.id, Kind: kind, Artifact: artifact, Name: mod, Version: ver, Expected: hash, Path: path, Lockfile: pin.Lockfile}
	status, data, ok := b.fetchPackage(x, req, g.registry, rec, path, "application/octet-stream")
	if !ok {
		return false
	}
	var got string
	if ext == ".mod" {
		got = goModHash(data)
	} else {
		var err error
		if got, err = goZipHash(data, maxGoZipContent); err != nil {
			return b.packageFailure(x, status, ReasonPackageDigest, 502, "", fmt.Sprintf("the zip of %s@%s from the upstream cannot be hashed (%v): nothing was served", mod, ver, err))
		}
	}
	if got != hash {
		return b.packageFailure(x, status, ReasonPackageDigest, 502, got,
			fmt.Sprintf("the %s of %s@%s from the upstream does not match go.sum's hash (%s): nothing was served", artifact, mod, ver, pin.Lockfile))
	}
	return b.completePackage(x, req, data, "application/octet-stream")
}

// answerPackage writes an answer moat made itself from the lockfiles
// (nothing fetched, nothing journaled).
func (b *Broker) answerPackage(x *exchange, req *request, data []byte, ctype string) bool {
	x.status = 200
	return writeFull(x.w.bw, 200, [][2]string{{"Moat-Request-Id", x.id}, {"Content-Type", ctype}}, data, req.close) == nil
}

// packageTarget is the front's hook for targets under PackagesPathPrefix.
// Besides npm's scoped names, two escapes are decoded, each to the path
// character it stands for: the go command sends the proxy protocol's '!'
// case escapes as "%21", and pip, which percent-quotes every link of an
// index page, sends the '+' of a local version (1.0+cpu) as "%2B" and an
// epoch's '!' (1!2.0) as "%21". Every other '%' is still refused by
// checkPath.
func packageTarget(target string) string {
	if !strings.Contains(target, "%") {
		return target
	}
	target = npmScopedTarget(target) // npm's "@scope%2fname" (packages_npmlock.go)
	return packageEscapes.Replace(target)
}

var packageEscapes = strings.NewReplacer("%21", "!", "%2B", "+", "%2b", "+")
