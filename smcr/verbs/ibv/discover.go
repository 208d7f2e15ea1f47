// Device discovery and the PNET mapping (netdev → RDMA device, port and GID index)
// from sysfs; pure Go, so it works without the ibv build tag. RFC 7609 §3.2.1 needs
// the GID an SMC-R peer reaches us on; smc-tools calls this table the PNET table.

package ibv

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// sysfs is the root of a sysfs tree: "/sys" for Devices and Resolve, a fake
// tree in tests.
type sysfs string

// ErrNoDevice is returned when no RDMA device, port or GID matches a request.
var ErrNoDevice = errors.New("ibv: no matching rdma device")

// GID types as the kernel names them in gid_attrs/types.
const (
	GIDTypeRoCEv2 = "RoCE v2"
	GIDTypeRoCEv1 = "IB/RoCE v1"
)

// GIDEntry is one populated entry of a port's GID table.
type GIDEntry struct {
	Index  int
	GID    [16]byte
	Type   string // "RoCE v2", "IB/RoCE v1"
	Netdev string // the network interface the GID belongs to (RoCE only)
}

// Addr returns the GID as an IP address (RoCE GIDs are IPv6 or IPv4-mapped).
func (g GIDEntry) Addr() netip.Addr { return netip.AddrFrom16(g.GID).Unmap() }

// PortInfo describes one port of an RDMA device.
type PortInfo struct {
	Device    string
	Port      int
	State     string // "ACTIVE", "DOWN", ...
	LinkLayer string // "Ethernet", "InfiniBand"
	Netdev    string // the first netdev any GID maps to
	MTU       verbs.MTU
	GIDs      []GIDEntry
}

// Active reports whether the port can carry traffic.
func (p PortInfo) Active() bool { return p.State == "ACTIVE" }

// Devices lists every RDMA device port with its populated GIDs, sorted by device
// name and port.
func Devices() ([]PortInfo, error) { return sysfs("/sys").devices() }

func (fs sysfs) devices() ([]PortInfo, error) {
	base := filepath.Join(string(fs), "class", "infiniband")
	devs, err := os.ReadDir(base)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ibv: list devices: %w", err)
	}
	var out []PortInfo
	for _, d := range devs {
		ports, err := os.ReadDir(filepath.Join(base, d.Name(), "ports"))
		if errors.Is(err, os.ErrNotExist) {
			continue // removed since the listing ("rdma link delete", a hot unplug)
		}
		if err != nil {
			return nil, fmt.Errorf("ibv: list ports of %s: %w", d.Name(), err)
		}
		for _, p := range ports {
			n, err := strconv.Atoi(p.Name())
			if err != nil {
				continue
			}
			pi, err := fs.readPort(filepath.Join(base, d.Name(), "ports", p.Name()), d.Name(), n)
			if errors.Is(err, os.ErrNotExist) {
				continue // the device went while it was read
			}
			if err != nil {
				return nil, err
			}
			out = append(out, pi)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Device != out[j].Device {
			return out[i].Device < out[j].Device
		}
		return out[i].Port < out[j].Port
	})
	return out, nil
}

func (fs sysfs) readPort(dir, dev string, port int) (PortInfo, error) {
	pi := PortInfo{Device: dev, Port: port}
	// state reads "4: ACTIVE".
	if s, err := readLine(filepath.Join(dir, "state")); err == nil {
		if _, name, ok := strings.Cut(s, ": "); ok {
			s = name
		}
		pi.State = s
	}
	pi.LinkLayer, _ = readLine(filepath.Join(dir, "link_layer"))
	gids, err := os.ReadDir(filepath.Join(dir, "gids"))
	if err != nil {
		return pi, fmt.Errorf("ibv: gid table of %s/%d: %w", dev, port, err)
	}
	for _, g := range gids {
		idx, err := strconv.Atoi(g.Name())
		if err != nil {
			continue
		}
		s, err := readLine(filepath.Join(dir, "gids", g.Name()))
		if err != nil {
			continue
		}
		gid, err := ParseGID(s)
		if err != nil || gid == ([16]byte{}) {
			continue // unpopulated entries read as all zeroes
		}
		e := GIDEntry{Index: idx, GID: gid}
		// Both attribute files fail with EINVAL for entries being torn down:
		// such an entry is not usable, so it is left out.
		if e.Type, err = readLine(filepath.Join(dir, "gid_attrs", "types", g.Name())); err != nil {
			continue
		}
		e.Netdev, _ = readLine(filepath.Join(dir, "gid_attrs", "ndevs", g.Name()))
		pi.GIDs = append(pi.GIDs, e)
	}
	sort.Slice(pi.GIDs, func(i, j int) bool { return pi.GIDs[i].Index < pi.GIDs[j].Index })
	for _, g := range pi.GIDs {
		if g.Netdev != "" {
			pi.Netdev = g.Netdev
			break
		}
	}
	// sysfs has no active MTU; RoCE derives it from the netdev's MTU as rxe and
	// the hardware drivers do. The cgo build overrides it with ibv_query_port.
	if pi.Netdev != "" {
		if s, err := readLine(filepath.Join(string(fs), "class", "net", pi.Netdev, "mtu")); err == nil {
			if n, err := strconv.Atoi(s); err == nil {
				pi.MTU = RoCEMTU(n)
			}
		}
	}
	return pi, nil
}

// RoCEMTU returns the largest IB path MTU whose RoCE packets fit an Ethernet MTU
// of netMTU bytes, as the kernel's iboe_get_mtu computes it: GRH 40, UDP 8, BTH 12,
// XRC 4, atomic extension 28 and ICRC 4 bytes of headers.
func RoCEMTU(netMTU int) verbs.MTU {
	const headers = 40 + 8 + 12 + 4 + 28 + 4
	for m := verbs.MTU4096; m > verbs.MTU256; m-- {
		if netMTU-headers >= m.Bytes() {
			return m
		}
	}
	return verbs.MTU256
}

// ParseGID parses a GID as sysfs prints it (eight groups of four hex digits).
func ParseGID(s string) ([16]byte, error) {
	var g [16]byte
	h := strings.ReplaceAll(strings.TrimSpace(s), ":", "")
	if len(h) != 32 {
		return g, fmt.Errorf("ibv: malformed gid %q", s)
	}
	if _, err := hex.Decode(g[:], []byte(h)); err != nil {
		return g, fmt.Errorf("ibv: malformed gid %q: %w", s, err)
	}
	return g, nil
}

func readLine(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// Target names a device port and GID entry: what Open needs.
type Target struct {
	Device   string
	Port     int
	GIDIndex int
	Netdev   string
	Addr     netip.Addr // the address the GID encodes
}

// Resolve maps a configured interface name or IP address (ip_addr_list) to the RDMA
// device, port and GID index that carry it, the way the PNET table of smc-tools maps
// a netdev to its RDMA device. RoCE v2 GIDs are preferred over RoCE v1, and for an
// interface name IPv4-mapped GIDs over IPv6 ones (link-local last), since RoCE v2
// routes on the GID's IP address. It returns ErrNoDevice when nothing matches.
func Resolve(ifaceOrIP string) (Target, error) { return sysfs("/sys").resolve(ifaceOrIP) }

func (fs sysfs) resolve(ifaceOrIP string) (Target, error) {
	ports, err := fs.devices()
	if err != nil {
		return Target{}, err
	}
	return resolveIn(ports, ifaceOrIP)
}

func resolveIn(ports []PortInfo, ifaceOrIP string) (Target, error) {
	best, bestScore := Target{}, -1
	for _, p := range ports {
		for _, g := range p.GIDs {
			if score := gidScore(p, g, ifaceOrIP); score > bestScore {
				best = Target{Device: p.Device, Port: p.Port, GIDIndex: g.Index, Netdev: g.Netdev, Addr: g.Addr()}
				bestScore = score
			}
		}
	}
	if bestScore < 0 {
		return Target{}, fmt.Errorf("%w for %q", ErrNoDevice, ifaceOrIP)
	}
	return best, nil
}

// gidScore rates GID g of port p for a configured interface name or IP address
// (Resolve's preferences); -1 when g does not serve it.
func gidScore(p PortInfo, g GIDEntry, ifaceOrIP string) int {
	score := 0
	if ip, err := netip.ParseAddr(ifaceOrIP); err == nil {
		if g.Addr() != ip.Unmap() {
			return -1
		}
	} else {
		if g.Netdev != ifaceOrIP {
			return -1
		}
		switch a := g.Addr(); {
		case a.Is4():
			score += 4
		case !a.IsLinkLocalUnicast():
			score += 2
		}
	}
	if g.Type == GIDTypeRoCEv2 {
		score += 8
	}
	if p.Active() {
		score += 16
	}
	return score
}
