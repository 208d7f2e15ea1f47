// Loader: loads smcr's eBPF programs, attaches them to a cgroup v2, the network
// namespace (sk_lookup) and the listed interfaces (tc ingress), and pins everything
// so a restarted smcrd takes the programs and maps over (the transparent path that
// carries RFC 7609 connections for unmodified applications).

package bpf

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/smcr-io/smcr/internal/cgroupfs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DefaultPinDir is where smcrd pins its programs, links and maps.
const DefaultPinDir = "/sys/fs/bpf/smcr"

// Options configure Load.
type Options struct {
	// CgroupPath is the cgroup v2 directory the socket programs attach to; empty
	// means the root of the cgroup2 mount found in /proc/mounts.
	CgroupPath string
	// Interfaces get the tc ingress program; their routes decide which
	// destinations connect4/6 redirect (see InterfacePrefixes). Empty: no tc
	// program and no destination restriction.
	Interfaces []string
	// PinDir is a directory on a bpf filesystem (default DefaultPinDir). One per
	// smcrd, so one per network namespace.
	PinDir string
	// NetNS is the network namespace file for sk_lookup (default: the calling
	// thread's). Load also takes the namespace's cookie from the calling thread.
	NetNS string
	// ClsBPF attaches tc ingress as a cls_bpf filter on the clsact qdisc even
	// where the kernel has tcx (Linux 6.6+); older kernels always get that.
	ClsBPF bool
	// Logger receives attach and takeover events (default: discard).
	Logger *slog.Logger
}

// Loader holds the loaded programs, their maps and their links. Its methods are
// safe for concurrent use.
type Loader struct {
	log    *slog.Logger
	opts   Options
	objs   smcrObjects
	cgroup string

	mu     sync.Mutex
	links  map[string]link.Link // by pin name
	closed bool
	// inUse is held for reading by every method that works on the maps
	// outside mu (hold), for writing by Close: a map closed under a lookup
	// is a closed, perhaps already reused, descriptor. The control server
	// asks for counters and peers while smcrd shuts down.
	inUse    sync.RWMutex
	cfgMu    sync.Mutex      // updateConfig's read, change and write of smcr_config
	directMu sync.Mutex      // AddDirectPort and RemoveDirectPort's read and write of a count
	mapsGone bool            // under inUse
	netns    *os.File        // the namespace the programs serve
	nl       *netlink.Handle // in netns, for the cls_bpf filters (tc.go)
	// cls: tc ingress is a cls_bpf filter, the kernel having no tcx or
	// Options.ClsBPF asking for it.
	cls bool
	// notEther: interfaces warned about as without Ethernet headers, with
	// their link type, so that SetInterfaces, run again as the host's
	// interfaces and routes change, warns once.
	notEther map[string]string
}

// cgroupProgs: the programs attached to the cgroup, with their hooks.
func (l *Loader) cgroupProgs() []struct {
	name string
	prog *ebpf.Program
	at   ebpf.AttachType
} {
	o := &l.objs
	return []struct {
		name string
		prog *ebpf.Program
		at   ebpf.AttachType
	}{
		{"sockops", o.SmcrSockops, ebpf.AttachCGroupSockOps},
		{"connect4", o.SmcrConnect4, ebpf.AttachCGroupInet4Connect},
		{"connect6", o.SmcrConnect6, ebpf.AttachCGroupInet6Connect},
		{"getpeername4", o.SmcrGetpeername4, ebpf.AttachCgroupInet4GetPeername},
		{"getpeername6", o.SmcrGetpeername6, ebpf.AttachCgroupInet6GetPeername},
		{"getsockname4", o.SmcrGetsockname4, ebpf.AttachCgroupInet4GetSockname},
		{"getsockname6", o.SmcrGetsockname6, ebpf.AttachCgroupInet6GetSockname},
		{"getsockopt", o.SmcrGetsockopt, ebpf.AttachCGroupGetsockopt},
		{"setsockopt", o.SmcrSetsockopt, ebpf.AttachCGroupSetsockopt},
	}
}

// Load loads the programs (re-opening maps already pinned in opts.PinDir), attaches
// them, or takes over the links a previous smcrd pinned, and records the calling
// thread's network namespace as the one the programs serve. Call it from a thread in
// that namespace. Nothing is redirected or steered until SetAlive.
func Load(opts Options) (*Loader, error) {
	if opts.PinDir == "" {
		opts.PinDir = DefaultPinDir
	}
	if opts.NetNS == "" {
		opts.NetNS = "/proc/thread-self/ns/net"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	l := &Loader{log: opts.Logger, opts: opts, links: map[string]link.Link{}, notEther: map[string]string{}}
	l.cgroup = opts.CgroupPath
	if l.cgroup == "" {
		mnt, err := cgroupfs.Mount()
		if err != nil {
			return nil, fmt.Errorf("bpf: %w", err)
		}
		l.cgroup = mnt
	}
	if err := ensurePinDir(opts.PinDir); err != nil {
		return nil, err
	}
	if err := l.loadObjects(); err != nil {
		return nil, err
	}
	if err := l.setup(); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

func (l *Loader) loadObjects() error {
	spec, err := loadSmcr()
	if err != nil {
		return fmt.Errorf("bpf: load: %w", err)
	}
	if err := l.replaceIncompatible(spec); err != nil {
		return err
	}
	err = spec.LoadAndAssign(&l.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: l.opts.PinDir}})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return fmt.Errorf("bpf: load: %+v", ve)
		}
		return fmt.Errorf("bpf: load: %w", err)
	}
	return nil
}

// replaceIncompatible removes the pinned maps whose layout differs from this
// build's (an older smcrd's, say, with other max_entries), which loading would
// refuse (ebpf.ErrMapIncompatible), so that they are created afresh. The others,
// with their state, are taken over.
func (l *Loader) replaceIncompatible(spec *ebpf.CollectionSpec) error {
	for name, ms := range spec.Maps {
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		path := filepath.Join(l.opts.PinDir, name)
		m, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("bpf: pinned map %s: %w", name, err)
		}
		err = ms.Compatible(m)
		m.Close()
		if !errors.Is(err, ebpf.ErrMapIncompatible) {
			if err != nil {
				return fmt.Errorf("bpf: pinned map %s: %w", name, err)
			}
			continue
		}
		l.log.Warn("bpf: pinned map of another layout, replacing it", "map", name, "err", err)
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("bpf: replace pinned map %s: %w", name, err)
		}
	}
	return nil
}

func (l *Loader) setup() error {
	cookie, err := netnsCookie()
	if err != nil {
		return err
	}
	if err := l.updateConfig(func(c *smcrConfig) { c.NetnsCookie = cookie }); err != nil {
		return err
	}
	cgid, err := inode(l.cgroup)
	if err != nil {
		return fmt.Errorf("bpf: cgroup %s: %w", l.cgroup, err)
	}
	for _, p := range l.cgroupProgs() {
		err := l.attach("cg_"+p.name, p.prog, func(i link.Info) bool {
			c := i.Cgroup()
			return c != nil && c.CgroupId == cgid
		}, func() (link.Link, error) {
			return link.AttachCgroup(link.CgroupOptions{Path: l.cgroup, Attach: p.at, Program: p.prog})
		})
		if err != nil {
			return fmt.Errorf("bpf: attach %s to %s: %w", p.name, l.cgroup, err)
		}
	}
	ns, err := os.Open(l.opts.NetNS)
	if err != nil {
		return fmt.Errorf("bpf: open netns: %w", err)
	}
	l.netns = ns
	nsino, err := inode(l.opts.NetNS)
	if err != nil {
		return fmt.Errorf("bpf: netns: %w", err)
	}
	err = l.attach("sk_lookup", l.objs.SmcrSkLookup, func(i link.Info) bool {
		n := i.NetNs()
		return n != nil && uint64(n.NetnsInode) == nsino
	}, func() (link.Link, error) {
		return link.AttachNetNs(int(ns.Fd()), l.objs.SmcrSkLookup)
	})
	if err != nil {
		return fmt.Errorf("bpf: attach sk_lookup: %w", err)
	}
	return l.SetInterfaces(l.opts.Interfaces)
}

// attach takes over the link pinned under name when it still points where it
// should (same cgroup, namespace or interface), swapping in prog atomically, and
// otherwise attaches afresh and pins the new link.
func (l *Loader) attach(name string, prog *ebpf.Program, same func(link.Info) bool, attach func() (link.Link, error)) error {
	path := filepath.Join(l.opts.PinDir, "link_"+name)
	// Asked again (SetInterfaces follows the host's interfaces): a link
	// still in place is kept; one whose interface went away is let go.
	if cur, ok := l.links[name]; ok {
		if info, err := cur.Info(); err == nil && same(*info) {
			return nil
		}
		delete(l.links, name)
		cur.Close()
	}
	if old, err := link.LoadPinnedLink(path, nil); err == nil {
		info, ierr := old.Info()
		if ierr == nil && same(*info) {
			if err := old.Update(prog); err == nil {
				l.log.Info("bpf: took over pinned link", "link", name)
				l.links[name] = old
				return nil
			}
		}
		l.log.Info("bpf: replacing stale pinned link", "link", name)
		old.Unpin()
		old.Close()
	} else if !errors.Is(err, fs.ErrNotExist) {
		os.Remove(path) // not a link we can use
	}
	lk, err := attach()
	if err != nil {
		return err
	}
	if err := lk.Pin(path); err != nil {
		lk.Close()
		return fmt.Errorf("pin: %w", err)
	}
	l.links[name] = lk
	return nil
}

// SetInterfaces attaches tc ingress to exactly these interfaces (detaching it from
// others) and restricts redirects to destinations routed through them
// (InterfacePrefixes; none listed: no restriction). Call it from a thread in the
// loader's network namespace.
func (l *Loader) SetInterfaces(names []string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("bpf: loader closed: %w", net.ErrClosed)
	}
	if err := l.openNetlink(); err != nil {
		return fmt.Errorf("bpf: %w", err)
	}
	want := map[string]bool{}
	wantIdx := map[int]bool{}
	for _, n := range names {
		iface, err := net.InterfaceByName(n)
		if err != nil {
			return fmt.Errorf("bpf: interface %s: %w", n, err)
		}
		// tc ingress reads an Ethernet header: on a tun or WireGuard device it
		// would silently see no SYN at all.
		if lk, err := l.nl.LinkByIndex(iface.Index); err == nil && lk.Attrs().EncapType != "ether" && lk.Attrs().EncapType != "loopback" &&
			l.notEther[n] != lk.Attrs().EncapType {
			l.log.Warn("bpf: interface without Ethernet headers: tc ingress cannot read its SYNs, so no connection arriving on it is steered to smcrd",
				"interface", n, "link_type", lk.Attrs().EncapType)
			l.notEther[n] = lk.Attrs().EncapType
		}
		name := "tc_" + n
		want[name] = true
		wantIdx[iface.Index] = true
		if err := l.attachTC(name, iface.Index); err != nil {
			return fmt.Errorf("bpf: attach tc ingress to %s: %w", n, err)
		}
	}
	// cls_bpf filters no longer wanted, this run's or an earlier smcrd's (an
	// older kernel, or ClsBPF): looked for whether tcx is in use or not.
	if !l.cls {
		wantIdx = nil
	}
	removed, err := detachClsBPF(l.nl, wantIdx)
	for _, n := range removed {
		l.log.Info("bpf: detached tc ingress filter", "interface", n)
	}
	if err != nil {
		return fmt.Errorf("bpf: %w", err)
	}
	// Interfaces no longer listed, in this run or a previous smcrd's.
	entries, _ := os.ReadDir(l.opts.PinDir)
	for _, e := range entries {
		name, ok := strings.CutPrefix(e.Name(), "link_")
		if !ok || !strings.HasPrefix(name, "tc_") || want[name] {
			continue
		}
		if lk, ok := l.links[name]; ok {
			lk.Unpin()
			lk.Close()
			delete(l.links, name)
		} else {
			os.Remove(filepath.Join(l.opts.PinDir, e.Name())) // detaches it
		}
		l.log.Info("bpf: detached tc ingress", "link", name)
	}
	var rules []PrefixRule
	if len(names) > 0 {
		if rules, err = InterfacePrefixes(names); err != nil {
			return err
		}
	}
	return l.setPrefixes(rules, len(names) > 0)
}

// attachTC attaches tc ingress to an interface: a pinned tcx link, or where the
// kernel has no tcx (Linux before 6.6) smcr's cls_bpf filter.
func (l *Loader) attachTC(name string, ifindex int) error {
	if !l.cls && !l.opts.ClsBPF {
		err := l.attach(name, l.objs.SmcrTcIngress, func(i link.Info) bool {
			t := i.TCX()
			return t != nil && int(t.Ifindex) == ifindex
		}, func() (link.Link, error) {
			return link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: l.objs.SmcrTcIngress, Attach: ebpf.AttachTCXIngress})
		})
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return err
		}
		l.log.Info("bpf: kernel has no tcx, tc ingress goes in as a cls_bpf filter", "err", err)
	}
	l.cls = true
	if err := l.openNetlink(); err != nil {
		return err
	}
	return attachClsBPF(l.nl, ifindex, l.objs.SmcrTcIngress)
}

// hold keeps Close from closing the maps until l.inUse.RUnlock, and fails
// once Close began. Methods that hold mu check closed instead.
func (l *Loader) hold() error {
	l.inUse.RLock()
	if l.mapsGone {
		l.inUse.RUnlock()
		return fmt.Errorf("bpf: loader closed: %w", net.ErrClosed)
	}
	return nil
}

func (l *Loader) openNetlink() error {
	if l.nl != nil {
		return nil
	}
	var err error
	l.nl, err = openNetlink(l.netns)
	return err
}

// Close releases the loader's handles. The programs stay attached and the maps
// pinned, so the next smcrd takes them over; they redirect and steer nothing once
// the liveness set by SetAlive lapses.
func (l *Loader) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	l.inUse.Lock()
	l.mapsGone = true
	l.inUse.Unlock()
	var errs []error
	for _, lk := range l.links {
		errs = append(errs, lk.Close())
	}
	errs = append(errs, l.objs.Close())
	if l.nl != nil {
		l.nl.Close()
	}
	if l.netns != nil {
		errs = append(errs, l.netns.Close())
	}
	return errors.Join(errs...)
}

// Remove detaches every program, removes the pins and the pin directory, and
// closes the loader: what `smcrd --uninstall` or a test's cleanup wants.
func (l *Loader) Remove() error {
	l.mu.Lock()
	var errs []error
	if !l.closed {
		for _, lk := range l.links {
			errs = append(errs, lk.Unpin())
		}
	}
	if !l.closed && l.openNetlink() == nil {
		_, err := detachClsBPF(l.nl, nil)
		errs = append(errs, err)
	}
	l.mu.Unlock()
	errs = append(errs, l.Close())
	// Links pinned by an earlier smcrd and not taken over, and every map.
	entries, _ := os.ReadDir(l.opts.PinDir)
	for _, e := range entries {
		errs = append(errs, os.Remove(filepath.Join(l.opts.PinDir, e.Name())))
	}
	if err := os.Remove(l.opts.PinDir); !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// MapIDs returns the kernel IDs of the loader's maps by name; a loader that took
// over pinned maps reports the same IDs as the one that created them.
func (l *Loader) MapIDs() (map[string]ebpf.MapID, error) {
	if err := l.hold(); err != nil {
		return nil, err
	}
	defer l.inUse.RUnlock()
	ids := map[string]ebpf.MapID{}
	for name, m := range l.maps() {
		info, err := m.Info()
		if err != nil {
			return nil, err
		}
		id, _ := info.ID()
		ids[name] = id
	}
	return ids, nil
}

func (l *Loader) maps() map[string]*ebpf.Map {
	o := &l.objs.smcrMaps
	return map[string]*ebpf.Map{
		"smcr_alive": o.SmcrAlive, "smcr_config": o.SmcrConfig, "smcr_negative": o.SmcrNegative,
		"smcr_origdst": o.SmcrOrigdst, "smcr_peers": o.SmcrPeers, "smcr_ports": o.SmcrPorts,
		"smcr_prefix4": o.SmcrPrefix4, "smcr_prefix6": o.SmcrPrefix6, "smcr_seen": o.SmcrSeen,
		"smcr_sk": o.SmcrSk, "smcr_stats": o.SmcrStats, "smcr_steer": o.SmcrSteer,
		"smcr_synmark": o.SmcrSynmark,
	}
}

// ensurePinDir creates dir on a bpf filesystem, mounting one on /sys/fs/bpf when
// nothing is mounted there yet (as systemd would at boot).
func ensurePinDir(dir string) error {
	parent := filepath.Dir(dir)
	var st unix.Statfs_t
	if err := unix.Statfs(parent, &st); err != nil {
		return fmt.Errorf("bpf: pin dir %s: %w", dir, err)
	}
	if st.Type != unix.BPF_FS_MAGIC {
		if parent != "/sys/fs/bpf" {
			return fmt.Errorf("bpf: pin dir %s: %s is not a bpf filesystem", dir, parent)
		}
		if err := unix.Mount("bpf", parent, "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("bpf: mount bpffs on %s: %w", parent, err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("bpf: pin dir: %w", err)
	}
	return nil
}

func netnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	}
	if err != nil {
		return 0, fmt.Errorf("bpf: netns cookie: %w", err)
	}
	defer unix.Close(fd)
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("bpf: netns cookie: %w", err)
	}
	return c, nil
}

func inode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}
