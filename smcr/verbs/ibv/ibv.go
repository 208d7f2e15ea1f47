//go:build ibv

// The libibverbs device, protection domain and memory regions (RFC 7609 §2.1,
// the RoCE adapter and the RMBs it registers).

package ibv

/*
#cgo LDFLAGS: -libverbs
#include <stdlib.h>
#include <errno.h>
#include <infiniband/verbs.h>

// ibv_query_port is a macro over ___ibv_query_port in current rdma-core.
static int smcr_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a) {
	return ibv_query_port(c, port, a);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// defaultSpin is Config.Spin when unset.
const defaultSpin = 20 * time.Microsecond

// Open opens one port of an RDMA device, chosen by name or by the network
// interface or address it serves (see Config and Resolve).
func Open(cfg Config) (verbs.Device, error) {
	d, err := open(cfg)
	if err != nil {
		return nil, err
	}
	return d, nil
}

type device struct {
	ctx  *C.struct_ibv_context
	name string
	port int
	// src is the source GID that Port reports and new queue pairs take. An
	// address of the interface that comes or goes changes the port's GID
	// table, and reselect then chooses anew by selector: the interface or
	// address the device was opened for, or the port's netdev; "" keeps the
	// index Config set.
	src      atomic.Pointer[source]
	selector string
	cfg      Config
	log      *slog.Logger
	events   *asyncEvents               // nil if they could not be watched
	changes  verbs.PortChanges          // closed on port events (PortChanged)
	gids     atomic.Pointer[[][16]byte] // the port's GIDs as last read (HasGID)
	fatal    atomic.Bool                // IBV_EVENT_DEVICE_FATAL came

	mu     sync.Mutex
	closed bool
	qps    map[uint32]*qp // by QPN, to route drain markers on Close
	// live counts the PDs and CQs not yet destroyed: the context closes with
	// the last of them when Close came first (an engine that gave up waiting
	// for a link to free), never under them.
	live int
}

// release ends one PD's or CQ's hold on d.
func (d *device) release() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.live--
	if d.closed && d.live == 0 {
		d.closeLocked()
	}
}

func (d *device) closeLocked() error {
	if d.events != nil {
		d.events.stop()
	}
	if rc := C.ibv_close_device(d.ctx); rc != 0 {
		d.log.Warn("ibv: close device", "device", d.name, "err", syscall.Errno(-rc))
		return fmt.Errorf("ibv: close %s: %w", d.name, syscall.Errno(-rc))
	}
	return nil
}

func open(cfg Config) (*device, error) {
	if cfg.Port == 0 {
		cfg.Port = 1
	}
	if cfg.Spin == 0 {
		cfg.Spin = defaultSpin
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Device == "" && cfg.Interface == "" {
		return nil, fmt.Errorf("ibv: open: %w: neither device nor interface configured", verbs.ErrInvalid)
	}

	var n C.int
	list := C.ibv_get_device_list(&n)
	if list == nil {
		return nil, fmt.Errorf("ibv: get device list: %w", verbs.ErrUnsupported)
	}
	defer C.ibv_free_device_list(list)
	// Open the named device, or every device to find the interface's. The GID
	// table comes from one ibv_query_gid_table call: reading sysfs entry by
	// entry is slow with the 1024-entry tables of rxe.
	var (
		ctxs   = map[string]*C.struct_ibv_context{}
		ports  []PortInfo
		failed []string // devices passed over while looking for the interface's
	)
	defer func() {
		for _, c := range ctxs {
			C.ibv_close_device(c)
		}
	}()
	for _, dev := range unsafe.Slice(list, int(n)) {
		name := C.GoString(C.ibv_get_device_name(dev))
		if cfg.Device != "" && name != cfg.Device {
			continue
		}
		pi, err := openAndQuery(dev, name, ctxs)
		if err != nil {
			if cfg.Device != "" {
				return nil, err
			}
			// Another device's trouble (one being removed, a driver in a
			// bad state) must not keep this interface's from opening.
			log.Warn("ibv: device passed over", "device", name, "err", err)
			failed = append(failed, err.Error())
			continue
		}
		ports = append(ports, pi...)
	}
	selector := ""
	if cfg.Device == "" {
		selector = cfg.Interface
		t, err := resolveIn(ports, cfg.Interface)
		if err != nil {
			if len(failed) > 0 {
				err = fmt.Errorf("%w (passed over: %s)", err, strings.Join(failed, "; "))
			}
			return nil, err
		}
		cfg.Device, cfg.Port, cfg.GIDIndex = t.Device, t.Port, t.GIDIndex
	}
	info := portOf(ports, cfg.Device, cfg.Port)
	if info == nil {
		return nil, fmt.Errorf("%w: %s port %d", ErrNoDevice, cfg.Device, cfg.Port)
	}
	if cfg.GIDIndex < 0 {
		selector = info.Netdev
		t, err := resolveIn([]PortInfo{*info}, info.Netdev)
		if err != nil {
			return nil, err
		}
		cfg.GIDIndex = t.GIDIndex
	}
	ctx := ctxs[cfg.Device]
	delete(ctxs, cfg.Device)
	d := &device{ctx: ctx, name: cfg.Device, port: cfg.Port, selector: selector, cfg: cfg, log: log,
		qps: make(map[uint32]*qp)}
	src, err := d.sourceAt(info, cfg.GIDIndex)
	if err != nil {
		C.ibv_close_device(ctx)
		return nil, err
	}
	d.src.Store(src)
	d.keepGIDs(info)
	if err := d.watchEvents(); err != nil {
		log.Warn("ibv: port events unwatched; port changes are seen by polling only", "device", d.name, "err", err)
	}
	log.Debug("ibv: opened", "device", d.name, "port", d.port, "gid_index", src.index,
		"gid", net.IP(src.attr.GID[:]).String(), "netdev", src.attr.Netdev, "mtu", src.attr.MTU.Bytes())
	return d, nil
}

// openAndQuery opens dev into ctxs[name] and describes its ports.
func openAndQuery(dev *C.struct_ibv_device, name string, ctxs map[string]*C.struct_ibv_context) ([]PortInfo, error) {
	ctx, err := C.ibv_open_device(dev)
	if ctx == nil {
		return nil, fmt.Errorf("ibv: open %s: %w", name, errnoOr(err))
	}
	ctxs[name] = ctx
	return queryPorts(ctx, name)
}

// queryPorts describes every port of an opened device from libibverbs.
func queryPorts(ctx *C.struct_ibv_context, name string) ([]PortInfo, error) {
	var da C.struct_ibv_device_attr
	if rc := C.ibv_query_device(ctx, &da); rc != 0 {
		return nil, fmt.Errorf("ibv: query %s: %w", name, syscall.Errno(rc))
	}
	var out []PortInfo
	total := 0
	for p := 1; p <= int(da.phys_port_cnt); p++ {
		var pa C.struct_ibv_port_attr
		if rc := C.smcr_query_port(ctx, C.uint8_t(p), &pa); rc != 0 {
			return nil, fmt.Errorf("ibv: query port %s/%d: %w", name, p, syscall.Errno(rc))
		}
		pi := PortInfo{Device: name, Port: p, State: portStates[pa.state], MTU: verbs.MTU(pa.active_mtu),
			LinkLayer: "InfiniBand"}
		if pa.link_layer == C.IBV_LINK_LAYER_ETHERNET {
			pi.LinkLayer = "Ethernet"
		}
		out = append(out, pi)
		total += int(pa.gid_tbl_len)
	}
	if total == 0 {
		return out, nil
	}
	entries := make([]C.struct_ibv_gid_entry, total)
	got := C._ibv_query_gid_table(ctx, &entries[0], C.size_t(total), 0, C.size_t(unsafe.Sizeof(entries[0])))
	if got < 0 {
		return nil, fmt.Errorf("ibv: query gid table of %s: %w", name, syscall.Errno(-got))
	}
	for _, e := range entries[:got] {
		g := GIDEntry{Index: int(e.gid_index)}
		copy(g.GID[:], C.GoBytes(unsafe.Pointer(&e.gid), 16))
		switch e.gid_type {
		case C.IBV_GID_TYPE_ROCE_V2:
			g.Type = GIDTypeRoCEv2
		case C.IBV_GID_TYPE_ROCE_V1:
			g.Type = GIDTypeRoCEv1
		default:
			g.Type = "IB"
		}
		if e.ndev_ifindex != 0 {
			if ifi, err := net.InterfaceByIndex(int(e.ndev_ifindex)); err == nil {
				g.Netdev = ifi.Name
			}
		}
		pi := &out[int(e.port_num)-1]
		pi.GIDs = append(pi.GIDs, g)
		if pi.Netdev == "" {
			pi.Netdev = g.Netdev
		}
	}
	return out, nil
}

var portStates = map[C.enum_ibv_port_state]string{
	C.IBV_PORT_NOP: "NOP", C.IBV_PORT_DOWN: "DOWN", C.IBV_PORT_INIT: "INIT",
	C.IBV_PORT_ARMED: "ARMED", C.IBV_PORT_ACTIVE: "ACTIVE", C.IBV_PORT_ACTIVE_DEFER: "ACTIVE_DEFER",
}

// source is a GID entry of the port with the port's attributes that go with it.
type source struct {
	index int
	attr  verbs.PortAttr
}

// sourceAt describes the port with GID entry index as its source.
func (d *device) sourceAt(info *PortInfo, index int) (*source, error) {
	var pa C.struct_ibv_port_attr
	if rc := C.smcr_query_port(d.ctx, C.uint8_t(d.port), &pa); rc != 0 {
		return nil, fmt.Errorf("ibv: query port %s/%d: %w", d.name, d.port, syscall.Errno(rc))
	}
	var gid C.union_ibv_gid
	if rc := C.ibv_query_gid(d.ctx, C.uint8_t(d.port), C.int(index), &gid); rc != 0 {
		return nil, fmt.Errorf("ibv: query gid %s/%d/%d: %w", d.name, d.port, index, syscall.Errno(-rc))
	}
	a := verbs.PortAttr{
		Num:    d.port,
		MTU:    verbs.MTU(pa.active_mtu),
		LinkUp: pa.state == C.IBV_PORT_ACTIVE,
	}
	copy(a.GID[:], C.GoBytes(unsafe.Pointer(&gid), 16))
	if a.GID == ([16]byte{}) {
		return nil, fmt.Errorf("%w: %s/%d gid index %d is empty", ErrNoDevice, d.name, d.port, index)
	}
	g := gidAt(info, index)
	a.GIDType, a.Netdev = g.Type, g.Netdev
	if a.GIDType == "" && pa.link_layer == C.IBV_LINK_LAYER_INFINIBAND {
		a.GIDType = "IB"
	}
	if a.Netdev != "" {
		if ifi, err := net.InterfaceByName(a.Netdev); err == nil && len(ifi.HardwareAddr) == 6 {
			copy(a.MAC[:], ifi.HardwareAddr)
		}
	}
	return &source{index: index, attr: a}, nil
}

// reselect chooses the source GID anew after the port's GID table changed (an
// address of the interface came or went), as Open would choose now: peers reach
// a new link by the GID its Proposal and queue pair name, and an address that
// went takes its GID along. The source stays while it is among the best, so a
// second address does not move it; queue pairs made before keep theirs (a
// link whose GID went is failed by the engine, which moves its connections:
// PortChanged tells it, HasGID says which).
func (d *device) reselect() {
	old := d.src.Load()
	ports, err := queryPorts(d.ctx, d.name)
	if err != nil {
		d.log.Warn("ibv: gid table changed and cannot be read; the source GID stays", "device", d.name, "err", err)
		return
	}
	info := portOf(ports, d.name, d.port)
	if info == nil {
		return
	}
	d.keepGIDs(info)
	index := old.index
	if d.selector != "" {
		t, err := resolveIn([]PortInfo{*info}, d.selector)
		if err != nil {
			d.log.Warn("ibv: no GID serves the device's interface any more; new links keep the old one",
				"device", d.name, "port", d.port, "for", d.selector, "gid", net.IP(old.attr.GID[:]).String())
			return
		}
		index = t.GIDIndex
		if g := gidAt(info, old.index); g.GID == old.attr.GID && gidScore(*info, g, d.selector) >= gidScore(*info, gidAt(info, index), d.selector) {
			index = old.index // still as good as any
		}
	}
	nw, err := d.sourceAt(info, index)
	if err != nil {
		d.log.Warn("ibv: the source GID is gone; new links keep it until the table has one again",
			"device", d.name, "port", d.port, "gid_index", index, "err", err)
		return
	}
	if nw.index == old.index && nw.attr.GID == old.attr.GID {
		d.log.Debug("ibv: gid table changed; the source GID stays", "device", d.name, "port", d.port)
		return
	}
	d.src.Store(nw)
	d.log.Info("ibv: source GID changed; new links use it", "device", d.name, "port", d.port,
		"gid_index", nw.index, "gid", net.IP(nw.attr.GID[:]).String(),
		"was_index", old.index, "was", net.IP(old.attr.GID[:]).String())
}

// keepGIDs remembers the port's GIDs, for HasGID.
func (d *device) keepGIDs(info *PortInfo) {
	gids := make([][16]byte, len(info.GIDs))
	for i, g := range info.GIDs {
		gids[i] = g.GID
	}
	d.gids.Store(&gids)
}

// HasGID reports whether gid was among the port's GIDs when the table was last
// read: at Open and at each IBV_EVENT_GID_CHANGE (verbs.GIDHolder).
func (d *device) HasGID(gid [16]byte) bool {
	gids := d.gids.Load()
	return gids == nil || slices.Contains(*gids, gid)
}

var _ verbs.GIDHolder = (*device)(nil)

// portOf returns the port of ports that is port number port of device dev, nil
// if none is.
func portOf(ports []PortInfo, dev string, port int) *PortInfo {
	for i := range ports {
		if ports[i].Device == dev && ports[i].Port == port {
			return &ports[i]
		}
	}
	return nil
}

// gidAt returns the entry numbered index of the port (zero if it has none).
func gidAt(info *PortInfo, index int) GIDEntry {
	for _, g := range info.GIDs {
		if g.Index == index {
			return g
		}
	}
	return GIDEntry{}
}

func (d *device) Kind() verbs.Kind     { return verbs.KindRDMA }
func (d *device) Name() string         { return d.name }
func (d *device) Port() verbs.PortAttr { return d.src.Load().attr }

// PortUp queries the port's state now (verbs.PortStater).
func (d *device) PortUp() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || d.fatal.Load() {
		return false
	}
	var pa C.struct_ibv_port_attr
	return C.smcr_query_port(d.ctx, C.uint8_t(d.port), &pa) == 0 && pa.state == C.IBV_PORT_ACTIVE
}
func (d *device) Endpoint() []byte                     { return nil }
func (d *device) CreateCQ(depth int) (verbs.CQ, error) { return d.createCQ(depth) }

func (d *device) AllocPD() (verbs.PD, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, verbs.ErrClosed
	}
	p, err := C.ibv_alloc_pd(d.ctx)
	if p == nil {
		return nil, fmt.Errorf("ibv: alloc pd: %w", errnoOr(err))
	}
	d.live++
	return &pd{dev: d, pd: p}, nil
}

// Close closes the device, at once or, while its PDs or CQs live, with the last
// of them: closing the context under them would free what they still use.
func (d *device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	if d.live > 0 {
		d.log.Debug("ibv: device closes with its last object", "device", d.name, "objects", d.live)
		return nil
	}
	return d.closeLocked()
}

type pd struct {
	dev *device
	pd  *C.struct_ibv_pd

	mu     sync.Mutex
	closed bool
	live   int // MRs and QPs not yet destroyed: the PD is deallocated with the last
}

// release ends one MR's or QP's hold on p.
func (p *pd) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.live--
	if p.closed && p.live == 0 {
		p.deallocLocked()
	}
}

func (p *pd) deallocLocked() error {
	if rc := C.ibv_dealloc_pd(p.pd); rc != 0 {
		p.dev.log.Warn("ibv: dealloc pd", "device", p.dev.name, "err", syscall.Errno(rc))
		return fmt.Errorf("ibv: dealloc pd: %w", syscall.Errno(rc))
	}
	p.dev.release()
	return nil
}

func (p *pd) AllocMR(size int, access verbs.Access) (verbs.MR, error) {
	if size <= 0 {
		return nil, fmt.Errorf("ibv: alloc mr: %w: size %d", verbs.ErrInvalid, size)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, verbs.ErrClosed
	}
	// Anonymous mmap: page aligned, never moved by the Go runtime, returned to
	// the kernel on Close.
	pageSize := unix.Getpagesize()
	mapped, err := unix.Mmap(-1, 0, (size+pageSize-1)/pageSize*pageSize,
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("ibv: mmap %d bytes: %w", size, err)
	}
	refs := new(atomic.Int32)
	refs.Store(1)
	m, err := p.regMR(mapped, size, refs, access)
	if err != nil {
		_ = unix.Munmap(mapped)
		return nil, err
	}
	return m, nil
}

// RegisterMR registers the mapping of another ibv device's MR with this PD's
// device (verbs.Registrar): ibv_reg_mr on the same pages, new lkey and rkey. The
// pages are unmapped when the last registration closes.
func (p *pd) RegisterMR(other verbs.MR, access verbs.Access) (verbs.MR, error) {
	o, ok := other.(*mr)
	if !ok {
		return nil, fmt.Errorf("ibv: register mr: %w: region of another provider", verbs.ErrInvalid)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, verbs.ErrClosed
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, verbs.ErrClosed
	}
	o.refs.Add(1)
	m, err := p.regMR(o.mapped, len(o.buf), o.refs, access)
	if err != nil {
		o.refs.Add(-1)
		return nil, err
	}
	return m, nil
}

// regMR registers mapped (shared by refs registrations, this one counted) with p.
// The caller holds p.mu.
func (p *pd) regMR(mapped []byte, size int, refs *atomic.Int32, access verbs.Access) (*mr, error) {
	var flags C.int
	if access&verbs.AccessLocalWrite != 0 {
		flags |= C.IBV_ACCESS_LOCAL_WRITE
	}
	if access&verbs.AccessRemoteWrite != 0 {
		// verbs requires local write with remote write.
		flags |= C.IBV_ACCESS_REMOTE_WRITE | C.IBV_ACCESS_LOCAL_WRITE
	}
	if access&verbs.AccessRemoteRead != 0 {
		flags |= C.IBV_ACCESS_REMOTE_READ
	}
	// The region is size bytes, not the page-rounded mapping: a peer's WRITE
	// past the buffer fails rather than landing in the slack.
	m, err := C.ibv_reg_mr(p.pd, unsafe.Pointer(&mapped[0]), C.size_t(size), flags)
	if m == nil {
		return nil, fmt.Errorf("ibv: register %d bytes: %w", size, errnoOr(err))
	}
	p.live++
	return &mr{pd: p, mr: m, mapped: mapped, refs: refs, buf: mapped[:size:size], access: access,
		addr: uint64(uintptr(unsafe.Pointer(&mapped[0]))), lkey: uint32(m.lkey), rkey: uint32(m.rkey)}, nil
}

func (p *pd) CreateQP(cfg verbs.QPConfig) (verbs.QP, error) { return p.createQP(cfg) }

func (p *pd) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.live > 0 {
		return nil // deallocated with its last MR or QP
	}
	return p.deallocLocked()
}

type mr struct {
	pd     *pd
	mr     *C.struct_ibv_mr
	mapped []byte
	refs   *atomic.Int32 // registrations of mapped (RegisterMR): the last Close unmaps
	buf    []byte
	access verbs.Access
	addr   uint64
	// The keys, kept in Go: ibv_dereg_mr frees the C struct they come from.
	lkey, rkey uint32
	gone       atomic.Bool // Close began: posts refuse the region

	mu     sync.Mutex
	closed bool
}

func (m *mr) Bytes() []byte        { return m.buf }
func (m *mr) LKey() uint32         { return m.lkey }
func (m *mr) RKey() uint32         { return m.rkey }
func (m *mr) Addr() uint64         { return m.addr }
func (m *mr) Access() verbs.Access { return m.access }

func (m *mr) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	m.gone.Store(true)
	if rc := C.ibv_dereg_mr(m.mr); rc != 0 {
		// Still registered: unmapping would let the device write into
		// whatever reuses the pages.
		return fmt.Errorf("ibv: deregister mr: %w", syscall.Errno(rc))
	}
	m.pd.release()
	if m.refs.Add(-1) > 0 {
		return nil
	}
	if err := unix.Munmap(m.mapped); err != nil {
		return fmt.Errorf("ibv: unmap mr: %w", err)
	}
	return nil
}

// errnoOr returns the errno a failed C call left, or a generic error when it
// left none.
func errnoOr(err error) error {
	var e syscall.Errno
	if errors.As(err, &e) && e != 0 {
		return e
	}
	return errors.New("unknown error")
}
