package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Controllers moat uses.
const (
	Memory = "memory"
	Pids   = "pids"
)

// LeafName is the child of a delegated cgroup v2 directory that its
// processes are moved to, so that the directory can enable controllers
// for its children.
const LeafName = "moat-leaf"

// Prefix starts the name of every cgroup moat makes.
const Prefix = "moat-"

// Removing a cgroup whose last task is still exiting is retried.
const (
	removeTries = 50
	removePause = 20 * time.Millisecond
)

// Place is where a controller's sandbox cgroup is made.
type Place struct {
	Ctrl   string
	V2     bool
	Parent string // the directory the child is made in
	Reason string // non-empty: the controller cannot be used, and why
}

// Locate decides where ctrl's cgroup goes on this host, or why it cannot
// be made.
func Locate(fsys FS, h *Host, ctrl string) Place {
	p := Place{Ctrl: ctrl}
	if i := slices.IndexFunc(h.Mounts, func(m Mount) bool {
		return m.FSType == "cgroup" && slices.Contains(strings.Split(m.Super, ","), ctrl)
	}); i >= 0 {
		m := h.Mounts[i]
		path, ok := h.Own[ctrl]
		if !ok {
			p.Reason = "/proc/self/cgroup has no " + ctrl + " line"
			return p
		}
		p.Parent = Dir(m, path)
		if h.Euid != 0 {
			p.Reason = fmt.Sprintf("%s is a cgroup v1 controller (%s), and moat makes cgroup v1 cgroups as root only (v1 has no safe delegation): run moat as root", ctrl, m.Point)
			return p
		}
		if _, err := fsys.Stat(p.Parent); err != nil {
			p.Reason = err.Error()
		}
		return p
	}
	m, ok := v2Mount(h)
	if !ok {
		p.Reason = fmt.Sprintf("no cgroup v1 hierarchy has the %s controller and no cgroup v2 file system is mounted", ctrl)
		return p
	}
	p.V2 = true
	if h.Euid == 0 {
		p.Parent = m.Point
	} else {
		path, ok := h.Own[""]
		if !ok {
			p.Reason = "/proc/self/cgroup has no cgroup v2 (0::) line"
			return p
		}
		p.Parent = Dir(m, path)
		if filepath.Base(p.Parent) == LeafName {
			p.Parent = filepath.Dir(p.Parent)
		}
		if why := delegated(fsys, p.Parent, h.Euid); why != "" {
			p.Reason = why + "; run moat in a cgroup delegated to you, e.g. systemd-run --user --scope -p Delegate=yes moat ..."
			return p
		}
	}
	b, err := fsys.ReadFile(filepath.Join(p.Parent, "cgroup.controllers"))
	if err != nil {
		p.Reason = err.Error()
		return p
	}
	if have := strings.Fields(string(b)); !slices.Contains(have, ctrl) {
		p.Reason = fmt.Sprintf("the %s controller is not available: no cgroup v1 hierarchy has it and %s/cgroup.controllers lists only %q", ctrl, p.Parent, strings.Join(have, " "))
	}
	return p
}

// Available reports whether the host has ctrl at all: a cgroup v1
// hierarchy binds it, or the cgroup v2 root lists it.
func Available(fsys FS, h *Host, ctrl string) bool {
	if slices.ContainsFunc(h.Mounts, func(m Mount) bool {
		return m.FSType == "cgroup" && slices.Contains(strings.Split(m.Super, ","), ctrl)
	}) {
		return true
	}
	m, ok := v2Mount(h)
	if !ok {
		return false
	}
	b, err := fsys.ReadFile(filepath.Join(m.Point, "cgroup.controllers"))
	return err == nil && slices.Contains(strings.Fields(string(b)), ctrl)
}

// v2Mount is the cgroup v2 mount: the one at DefaultRoot, else the first.
func v2Mount(h *Host) (Mount, bool) {
	var found Mount
	ok := false
	for _, m := range h.Mounts {
		if m.FSType != "cgroup2" {
			continue
		}
		if m.Point == DefaultRoot {
			return m, true
		}
		if !ok {
			found, ok = m, true
		}
	}
	return found, ok
}

// delegated says why dir is not delegated to uid ("" when it is): the
// directory, its cgroup.subtree_control and its cgroup.procs must be owned
// by uid and writable by their owner.
func delegated(fsys FS, dir string, uid int) string {
	for _, name := range []string{"", "cgroup.subtree_control", "cgroup.procs"} {
		p := filepath.Join(dir, name)
		st, err := fsys.Stat(p)
		if err != nil {
			return fmt.Sprintf("this process's cgroup v2 directory: %v", err)
		}
		if st.UID != uid {
			return fmt.Sprintf("%s is owned by uid %d, not by moat's uid %d: this process's cgroup is not delegated to it", p, st.UID, uid)
		}
		if st.Mode.Perm()&0o200 == 0 {
			return fmt.Sprintf("%s is not writable by its owner (mode %v): this process's cgroup is not delegated to it", p, st.Mode.Perm())
		}
	}
	return ""
}

// Limits are the values to write; 0 is none.
type Limits struct {
	Memory int64 // bytes
	Pids   int64
}

// Status says which limits hold, and why not where not.
type Status struct {
	Memory, Pids bool
	Detail       string
}

// Group is a sandbox's cgroups: one per v1 hierarchy used, one in v2.
type Group struct {
	fsys   FS
	dirs   []string // created, in order
	locks  map[string]*os.File
	memDir string
	memV2  bool
}

// Create makes the cgroup name (moat-<run>) for each limit set and writes
// the limits. own is called with each directory before it is made (so
// that a reaper owns it before it exists). A limit that is not applied is
// reported with its reason; nothing is pretended.
func Create(fsys FS, h *Host, name string, lim Limits, own func(dir string)) (*Group, Status) {
	vals := map[string]string{}
	if lim.Memory > 0 {
		vals[Memory] = strconv.FormatInt(lim.Memory, 10)
	}
	if lim.Pids > 0 {
		vals[Pids] = strconv.FormatInt(lim.Pids, 10)
	}
	g, ok, why := create(fsys, h, name, vals, own)
	st := Status{Memory: ok[Memory], Pids: ok[Pids]}
	if len(why) > 0 {
		st.Detail = "not enforced: " + strings.Join(why, "; ")
	}
	return g, st
}

// Probe tries what Create does for memory and pids (a child cgroup with
// both controllers whose limit files are writable; nothing is written)
// and removes what it made. It returns each controller's place and the
// reason it cannot be used ("" when it can).
func Probe(fsys FS, h *Host) (places map[string]Place, reasons map[string]string) {
	name := fmt.Sprintf("%sprobe-%d-%d", Prefix, os.Getpid(), time.Now().UnixNano())
	g, ok, why := create(fsys, h, name, map[string]string{Memory: "", Pids: ""}, nil)
	if g != nil {
		g.Remove(nil)
	}
	places, reasons = map[string]Place{}, map[string]string{}
	for _, c := range []string{Memory, Pids} {
		places[c] = Locate(fsys, h, c)
		if !ok[c] {
			reasons[c] = "unknown"
			for _, w := range why {
				if r, found := strings.CutPrefix(w, c+": "); found {
					reasons[c] = r
				}
			}
		}
	}
	return places, reasons
}

// create does Create's work; a value "" only checks that the limit file
// can be opened for writing.
func create(fsys FS, h *Host, name string, vals map[string]string, own func(string)) (*Group, map[string]bool, []string) {
	ok := map[string]bool{}
	var why []string
	if !validName(name) {
		return nil, ok, []string{fmt.Sprintf("bad cgroup name %q", name)}
	}
	g := &Group{fsys: fsys, locks: map[string]*os.File{}}
	fail := func(ctrl string, format string, args ...any) {
		why = append(why, ctrl+": "+fmt.Sprintf(format, args...))
	}
	var v2 []Place
	for _, ctrl := range []string{Memory, Pids} {
		if _, want := vals[ctrl]; !want {
			continue
		}
		p := Locate(fsys, h, ctrl)
		switch {
		case p.Reason != "":
			fail(ctrl, "%s", p.Reason)
		case p.V2:
			v2 = append(v2, p)
		default:
			dir := filepath.Join(p.Parent, name)
			if err := g.mkdir(dir, own); err != nil {
				fail(ctrl, "%v", err)
				continue
			}
			if err := writeLimit(fsys, dir, v1File(ctrl), vals[ctrl]); err != nil {
				fail(ctrl, "%v", err)
				continue
			}
			if ctrl == Memory {
				g.memDir = dir
			}
			ok[ctrl] = true
		}
	}
	if len(v2) > 0 {
		g.createV2(h, name, v2, vals, own, ok, fail)
	}
	if len(g.dirs) == 0 {
		return nil, ok, why
	}
	return g, ok, why
}

func (g *Group) createV2(h *Host, name string, places []Place, vals map[string]string, own func(string), ok map[string]bool, fail func(string, string, ...any)) {
	parent := places[0].Parent
	var enabled []string
	for _, p := range places {
		if err := g.enable(parent, p.Ctrl, h.Euid != 0); err != nil {
			fail(p.Ctrl, "enabling it in %s/cgroup.subtree_control: %v", parent, errText(err))
			continue
		}
		enabled = append(enabled, p.Ctrl)
	}
	if len(enabled) == 0 {
		return
	}
	dir := filepath.Join(parent, name)
	if err := g.mkdir(dir, own); err != nil {
		for _, c := range enabled {
			fail(c, "%v", err)
		}
		return
	}
	b, err := g.fsys.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	have := strings.Fields(string(b))
	for _, c := range enabled {
		if err != nil || !slices.Contains(have, c) {
			fail(c, "%s is not among %s/cgroup.controllers (%q, %v) after enabling it in its parent", c, dir, strings.Join(have, " "), err)
			continue
		}
		var werr error
		switch c {
		case Memory:
			werr = writeLimit(g.fsys, dir, "memory.max", vals[c])
			// With swap accounting, the limit is on memory and swap
			// together: no swap beyond it.
			if _, serr := g.fsys.Stat(filepath.Join(dir, "memory.swap.max")); werr == nil && serr == nil {
				werr = writeLimit(g.fsys, dir, "memory.swap.max", zeroOrProbe(vals[c]))
			}
			if werr == nil {
				g.memDir, g.memV2 = dir, true
			}
		case Pids:
			werr = writeLimit(g.fsys, dir, "pids.max", vals[c])
		}
		if werr != nil {
			fail(c, "%v", werr)
			continue
		}
		ok[c] = true
	}
}

func zeroOrProbe(v string) string {
	if v == "" {
		return ""
	}
	return "0"
}

// enable turns ctrl on in parent/cgroup.subtree_control. When the parent
// holds processes (EBUSY: a cgroup with processes cannot enable
// controllers for its children) and it is this process's delegated
// cgroup (rootless), its processes are moved to the leaf child first.
func (g *Group) enable(parent, ctrl string, delegatedOwn bool) error {
	sc := filepath.Join(parent, "cgroup.subtree_control")
	b, err := g.fsys.ReadFile(sc)
	if err != nil {
		return err
	}
	if slices.Contains(strings.Fields(string(b)), ctrl) {
		return nil
	}
	err = g.fsys.WriteFile(sc, []byte("+"+ctrl))
	if errors.Is(err, syscall.EBUSY) && delegatedOwn {
		if lerr := moveToLeaf(g.fsys, parent); lerr != nil {
			return fmt.Errorf("%w; moving its processes to %s: %v", err, LeafName, lerr)
		}
		err = g.fsys.WriteFile(sc, []byte("+"+ctrl))
	}
	return err
}

// moveToLeaf moves every process of dir into dir/moat-leaf.
func moveToLeaf(fsys FS, dir string) error {
	leaf := filepath.Join(dir, LeafName)
	if err := fsys.Mkdir(leaf); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	for range 5 {
		b, err := fsys.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			return err
		}
		pids := strings.Fields(string(b))
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			if err := fsys.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(pid)); err != nil && !errors.Is(err, syscall.ESRCH) {
				return err
			}
		}
	}
	return fmt.Errorf("%s/cgroup.procs still lists processes", dir)
}

func v1File(ctrl string) string {
	if ctrl == Memory {
		return "memory.limit_in_bytes"
	}
	return "pids.max"
}

func writeLimit(fsys FS, dir, file, val string) error {
	p := filepath.Join(dir, file)
	if val == "" { // probe: the file is there and writable
		if _, err := fsys.Stat(p); err != nil {
			return err
		}
		if f, err := os.OpenFile(p, os.O_WRONLY, 0); err != nil {
			return err
		} else {
			f.Close()
		}
		return nil
	}
	return fsys.WriteFile(p, []byte(val))
}

func (g *Group) mkdir(dir string, own func(string)) error {
	if slices.Contains(g.dirs, dir) {
		return nil
	}
	if own != nil {
		own(dir)
	}
	if err := g.fsys.Mkdir(dir); err != nil {
		return err
	}
	g.dirs = append(g.dirs, dir)
	// Held until the directory is removed: Sweep leaves it alone.
	if f, err := g.fsys.Lock(dir); err == nil {
		g.locks[dir] = f
	}
	return nil
}

func validName(name string) bool {
	rest, ok := strings.CutPrefix(name, Prefix)
	return ok && rest != "" && len(name) <= 200 && strings.Trim(rest, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == ""
}

// Dirs are the group's directories.
func (g *Group) Dirs() []string {
	if g == nil {
		return nil
	}
	return slices.Clone(g.dirs)
}

// Add moves pid into every cgroup of the group.
func (g *Group) Add(pid int) error {
	for _, d := range g.dirs {
		if err := g.fsys.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid))); err != nil {
			return fmt.Errorf("adding %d to %s: %w", pid, d, err)
		}
	}
	return nil
}

// Remove deletes the cgroups once their tasks are gone (retrying while
// the last ones exit), calling done with each one removed.
func (g *Group) Remove(done func(string)) error {
	if g == nil {
		return nil
	}
	var errs []error
	for i := len(g.dirs) - 1; i >= 0; i-- {
		d := g.dirs[i]
		var err error
		for range removeTries {
			if err = g.fsys.Rmdir(d); err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				break
			}
			time.Sleep(removePause)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if f := g.locks[d]; f != nil {
			f.Close()
			delete(g.locks, d)
		}
		if done != nil {
			done(d)
		}
	}
	g.dirs = nil
	return errors.Join(errs...)
}

// OOMKills reads the memory cgroup's count of OOM kills: "oom_kill N" in
// memory.events (v2) or memory.oom_control (v1).
func (g *Group) OOMKills() (uint64, bool) {
	if g == nil || g.memDir == "" {
		return 0, false
	}
	file := "memory.oom_control"
	if g.memV2 {
		file = "memory.events"
	}
	b, err := g.fsys.ReadFile(filepath.Join(g.memDir, file))
	if err != nil {
		return 0, false
	}
	return ParseOOMKill(string(b))
}

// ParseOOMKill finds "oom_kill N" in memory.events or memory.oom_control
// content.
func ParseOOMKill(s string) (uint64, bool) {
	for _, line := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
