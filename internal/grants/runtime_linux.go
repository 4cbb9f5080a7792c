package grants

import (
	"bufio"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
)

// A moat built with cgo (the default of a plain `go build`) is linked
// dynamically: its own re-executions inside the sandbox (the stage, the
// measurement) need the ELF interpreter and the shared libraries it was
// started with, at the same paths, whatever the policy grants. Runtime
// lists them; the backends mount them read-only and give them Landlock
// rules only for moat's own helpers, never for the workload (which sees
// the files in the mount table but cannot open them unless the policy
// grants them anyway). A static moat needs none.

// maxMapsBytes bounds what is read of /proc/self/maps.
const maxMapsBytes = 1 << 20

var runtimeOnce struct {
	sync.Once
	specs []Spec
	err   error
}

// Runtime returns the files moat's own binary needs to start: its ELF
// interpreter as the binary names it, and every shared object mapped in
// this process. None for a static binary.
func Runtime() ([]Spec, error) {
	runtimeOnce.Do(func() { runtimeOnce.specs, runtimeOnce.err = runtimeFiles() })
	return runtimeOnce.specs, runtimeOnce.err
}

func runtimeFiles() ([]Spec, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	f, err := elf.Open(exe)
	if err != nil {
		return nil, fmt.Errorf("reading moat's own binary: %w", err)
	}
	var interp string
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(io.LimitReader(p.Open(), 4096))
			if err != nil {
				f.Close()
				return nil, err
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	f.Close()
	if interp == "" {
		return nil, nil // static
	}
	paths := []string{interp}
	m, err := os.Open("/proc/self/maps")
	if err != nil {
		return nil, err
	}
	defer m.Close()
	sc := bufio.NewScanner(io.LimitReader(m, maxMapsBytes))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 {
			continue
		}
		p := fields[5]
		base := p[strings.LastIndexByte(p, '/')+1:]
		if strings.HasPrefix(p, "/") && (strings.HasSuffix(base, ".so") || strings.Contains(base, ".so.")) && !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	specs := make([]Spec, len(paths))
	for i, p := range paths {
		specs[i] = Spec{Key: fmt.Sprintf("moat runtime file %s", p), Path: p}
	}
	return specs, nil
}

// AddRuntime adds the files of Runtime that no mount of the plan covers
// as runtime mounts, keeping the plan's order (parents first).
func (pl *Plan) AddRuntime() error {
	rt, err := Runtime()
	if err != nil {
		return fmt.Errorf("moat's own runtime files: %w", err)
	}
	return pl.addRuntime(rt)
}

func (pl *Plan) addRuntime(specs []Spec) error {
	if len(specs) == 0 {
		return nil
	}
	rt, err := Resolve(specs, "")
	if err != nil {
		return fmt.Errorf("moat's own runtime files (a dynamically linked moat): %w", err)
	}
	for _, m := range rt.Mounts {
		if pl.Covered(m.Real) {
			continue
		}
		m.Runtime = true
		pl.Mounts = append(pl.Mounts, m)
	}
	for _, l := range rt.Links {
		if !pl.Covered(l.Path) && !slices.Contains(pl.Links, l) {
			pl.Links = append(pl.Links, l)
		}
	}
	slices.SortStableFunc(pl.Mounts, func(a, b Mount) int { return strings.Compare(a.Real, b.Real) })
	pl.Links = slices.DeleteFunc(pl.Links, func(l Link) bool { return pl.Covered(l.Path) })
	return nil
}
