// Interop check: the golden messages, framed by hand in a pcap, as tshark's SMC
// dissector decodes them. Covers RFC 7609 §3.7 as Wireshark implements it.

package clc

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/smcr-io/smcr/internal/tsharktest"
)

const smcPort = 12345

// tsharkFields is what tshark's SMC dissector must show for m: field name to value,
// numbers in any base strconv reads. The values come from the hand-written golden
// structs, never from the encoder.
func tsharkFields(m Message) map[string]string {
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	b := func(v bool) string {
		if v {
			return "1"
		}
		return "0"
	}
	gid := func(g [16]byte) string { return netip.AddrFrom16(g).String() }
	mac := func(a [6]byte) string { return net.HardwareAddr(a[:]).String() }
	f := map[string]string{"smc.clc_msg": u(uint64(m.Type()))}
	switch m := m.(type) {
	case *Proposal:
		f["smc.length"] = u(uint64(m.Len()))
		f["smc.proposal.sender.client.peer.id"] = u(binary.BigEndian.Uint64(m.PeerID[:]))
		f["smc.proposal.client.preferred.gid"] = gid(m.GID)
		f["smc.proposal.client.preferred.mac"] = mac(m.MAC)
		f["smc.outgoing.interface.subnet.mask"] = netip.AddrFrom4(m.Subnet).String()
		f["smc.outgoing.interface.subnet.mask.number.of.significant.bits"] = u(uint64(m.PrefixLen))
		f["smc.proposal.ipv6.prefix.count"] = u(uint64(len(m.IPv6)))
		var vals, lens []string
		for _, p := range m.IPv6 {
			vals = append(vals, gid(p.Addr))
			lens = append(lens, u(uint64(p.Len)))
		}
		f["smc.proposal.ipv6.prefix.value"] = strings.Join(vals, ",")
		f["smc.proposal.ipv6.prefix.length"] = strings.Join(lens, ",")
		if m.Version >= Version2 && m.SMCType == SMCTypeN {
			// A version-2-only Proposal has no version-1 part for tshark to show.
			for _, k := range []string{"gid", "mac"} {
				delete(f, "smc.proposal.client.preferred."+k)
			}
			for _, k := range []string{"smc.outgoing.interface.subnet.mask", "smc.outgoing.interface.subnet.mask.number.of.significant.bits", "smc.proposal.ipv6.prefix.count"} {
				delete(f, k)
			}
		}
	case *Accept:
		f["smc.length"] = u(uint64(m.Len()))
		f["smc.accept.sender.server.peer.id"] = u(binary.BigEndian.Uint64(m.PeerID[:]))
		f["smc.accept.server.preferred.gid"] = gid(m.GID)
		f["smc.accept.server.preferred.mac"] = mac(m.MAC)
		f["smc.accept.server.qp.number"] = u(uint64(m.QPN))
		f["smc.accept.server.rmb.rkey"] = u(uint64(m.RKey))
		f["smc.accept.server.tcp.conn.index"] = u(uint64(m.RMBEIndex))
		f["smc.accept.server.rmb.element.alert.token"] = u(uint64(m.AlertToken))
		f["smc.accept.rmb.buffer.size"] = u(uint64(m.SizeCode))
		f["smc.accept.qp.mtu.value"] = u(uint64(m.MTU))
		f["smc.accept.server.rmb.virtual.address"] = u(m.RMBAddr)
		f["smc.accept.initial.psn"] = u(uint64(m.PSN))
		f["smc.proposal.first.contact"] = b(m.FirstContact)
	case *Confirm:
		f["smc.length"] = u(uint64(m.Len()))
		f["smc.confirm.sender.client.peer.id"] = u(binary.BigEndian.Uint64(m.PeerID[:]))
		f["smc.client.gid"] = gid(m.GID)
		f["smc.confirm.client.mac"] = mac(m.MAC)
		f["smc.confirm.client.qp.number"] = u(uint64(m.QPN))
		f["smc.confirm.client.rmb.rkey"] = u(uint64(m.RKey))
		f["smc.confirm.client.tcp.conn.index"] = u(uint64(m.RMBEIndex))
		f["smc.client.rmb.element.alert.token"] = u(uint64(m.AlertToken))
		f["smc.confirm.rmb.buffer.size"] = u(uint64(m.SizeCode))
		f["smc.confirm.qp.mtu.value"] = u(uint64(m.MTU))
		f["smc.client.rmb.virtual.address"] = u(m.RMBAddr)
		f["smc.initial.psn"] = u(uint64(m.PSN))
	case *Decline:
		f["smc.length"] = u(uint64(m.Len()))
		f["smc.sender.peer.id"] = u(binary.BigEndian.Uint64(m.PeerID[:]))
		f["smc.peer.diag.info"] = u(uint64(m.Code))
		if m.Version >= Version2 {
			codes := []string{fmt.Sprintf("%#08x", uint32(m.Code))}
			for _, c := range m.MoreCodes {
				codes = append(codes, fmt.Sprintf("%#08x", uint32(c)))
			}
			f["smc.peer.diag.info"] = strings.Join(codes, ",")
		}
		f["smc.decline.osync"] = b(m.OutOfSync)
	}
	return f
}

func TestTshark(t *testing.T) {
	// Wireshark's dissector reads the IP area at Linux's fixed place and ignores
	// iparea_offset, so it misreads the old form (as it would a kernel's); the
	// codec's own tests cover that form.
	var gs []golden
	for _, g := range goldens {
		if g.name != "proposal-ipv4-old-form" {
			gs = append(gs, g)
		}
	}
	var names []string
	var payloads [][]byte
	var want []map[string]string
	for _, g := range gs {
		names = append(names, g.name)
		payloads = append(payloads, unhex(t, g.hex))
		want = append(want, tsharkFields(g.want))
	}
	tsharktest.Check(t, names, tsharktest.TCPSegments(payloads, smcPort), want)
}
