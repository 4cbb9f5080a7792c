package broker

import "encoding/json"

// npmManifestKeys are the fields of a packument's version object that
// moat passes to the workload's npm: what the resolver needs to build the
// tree (dependencies and platform constraints). Every other field is
// dropped, above all "scripts": npm runs the install
// scripts of a version's manifest as the packument gives them, without
// reading the package.json inside the tarball ("manifest confusion"), so
// an upstream that kept the pinned tarball intact could still run code
// through the metadata. The tarball's own scripts are still run:
// hasInstallScript is the lockfile's, and when it is set npm reads them
// from the package.json of the verified tarball once it is extracted.
// "bin" (the commands npm links into node_modules/.bin, ahead of PATH in
// npm scripts) is the lockfile's too: an upstream could otherwise name a
// command after a common one ("node", "git").
var npmManifestKeys = []string{
	"name", "version", "dependencies", "optionalDependencies", "peerDependencies", "peerDependenciesMeta",
	"bundleDependencies", "bundledDependencies", "engines", "os", "cpu", "libc",
}

// npmManifest is the version object served for a pinned version: the
// upstream's npmManifestKeys, moat's dist, and the lockfile's
// hasInstallScript and bin.
func npmManifest(v map[string]json.RawMessage, dist json.RawMessage, pin *NPMPin) map[string]json.RawMessage {
	out := make(map[string]json.RawMessage, len(npmManifestKeys)+2)
	for _, k := range npmManifestKeys {
		if raw, ok := v[k]; ok {
			out[k] = raw
		}
	}
	out["dist"] = dist
	if pin.HasInstallScript {
		out["hasInstallScript"] = json.RawMessage("true")
	}
	if len(pin.Bin) > 0 {
		out["bin"], _ = json.Marshal(pin.Bin)
	}
	return out
}

// npmPackumentAccept asks for the abbreviated packument npm itself
// installs from (no scripts, readmes or maintainers; a fraction of the
// full document's size, which for popular packages nears the broker's
// response cap), and for the full document from a registry without it.
const npmPackumentAccept = "application/vnd.npm.install-v1+json; q=1.0, application/json; q=0.8"
