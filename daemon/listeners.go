// The listeners smcrd steers for, as smcrctl listeners shows them (smcss -l):
// the TCP sockets listening in smcrd's network namespace, and whether a SYN
// with the SMC option to one comes to smcrd (RFC 7609 §3.3, steer.go).

package daemon

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/smcr-io/smcr/control"
)

// Listeners lists the TCP listeners of smcrd's network namespace, smcrd's own
// left out, and whether smcrd steers their connections, and if not, why.
func (d *Daemon) Listeners(context.Context) ([]control.Listener, error) {
	var own []netip.AddrPort
	for _, ln := range append(d.redirect[:len(d.redirect):len(d.redirect)], d.steering...) {
		own = append(own, unmapAP(ln.Addr().(*net.TCPAddr).AddrPort()))
	}
	cfg := d.CurrentConfig()
	var out []control.Listener
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		aps, err := listening(file)
		if err != nil {
			return nil, fmt.Errorf("daemon: listeners: %w", err)
		}
		for _, ap := range aps {
			if slices.Contains(own, ap) {
				continue
			}
			l := control.Listener{Addr: ap.Addr().String(), Port: ap.Port()}
			switch {
			case !cfg.Enabled:
				l.Reason = "smcrd disabled"
			case !cfg.PortRanges.Contains(ap.Port()):
				l.Reason = "port not in port_range_list"
			case len(d.devs) == 0:
				l.Reason = "no device: smcrd steers nothing"
			case ap.Addr().IsLoopback():
				l.Reason = "loopback only: its connections do not arrive on the interfaces"
			default:
				l.Steered = true
			}
			out = append(out, l)
		}
	}
	return out, nil
}

// listening reads the listening sockets' addresses from file, /proc/net/tcp
// or tcp6: hexadecimal address words in host order, a big-endian port, state
// 0A (TCP_LISTEN).
func listening(file string) ([]netip.AddrPort, error) {
	f, err := os.Open(file)
	if os.IsNotExist(err) { // no IPv6
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []netip.AddrPort
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || fields[3] != "0A" {
			continue
		}
		hexAddr, hexPort, ok := strings.Cut(fields[1], ":")
		raw, err := hex.DecodeString(hexAddr)
		port, perr := strconv.ParseUint(hexPort, 16, 16)
		if !ok || err != nil || perr != nil || len(raw)%4 != 0 {
			return nil, fmt.Errorf("%s: %q is not an address", file, fields[1])
		}
		for i := 0; i < len(raw); i += 4 { // each word as it was in memory: network order
			binary.NativeEndian.PutUint32(raw[i:], binary.BigEndian.Uint32(raw[i:]))
		}
		a, _ := netip.AddrFromSlice(raw)
		out = append(out, netip.AddrPortFrom(a.Unmap(), uint16(port)))
	}
	return out, sc.Err()
}
