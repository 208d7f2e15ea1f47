// Interop check: the golden LLC messages, framed by hand as RoCEv2 SENDs in a pcap,
// as tshark's SMC-R dissector decodes them (RFC 7609 §3.8 as Wireshark implements it).

package llc

import (
	"encoding/binary"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/smcr-io/smcr/internal/tsharktest"
)

// tsharkFields is what tshark's SMC dissector must show for m: field name to value
// (several occurrences joined by commas). The values come from the hand-written
// golden structs, never from the encoder.
func tsharkFields(m Message) map[string]string {
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	b := func(v bool) string {
		if v {
			return "1"
		}
		return "0"
	}
	gid := func(g GID) string { return netip.AddrFrom16(g).String() }
	mac := func(a MAC) string { return net.HardwareAddr(a[:]).String() }
	f := map[string]string{"smc.llc_msg": u(uint64(m.Type()))}
	switch m := m.(type) {
	case *ConfirmLink:
		f["smc.confirm.link.flags"] = u(uint64(m.Flags))
		f["smc.confirm.link.response"] = b(m.Response())
		f["smc.confirm.link.sender.mac"] = mac(m.MAC)
		f["smc.sender.gid"] = gid(m.GID)
		f["smc.confirm.link.sender.qp.number"] = u(uint64(m.QPN))
		f["smc.confirm.link.number"] = u(uint64(m.Link))
		f["smc.confirm.link.sender.link.userid"] = u(uint64(binary.BigEndian.Uint32(m.LinkUID[:])))
		f["smc.confirm.link.max.links"] = u(uint64(m.MaxLinks))
	case *AddLink:
		f["smc.add.link.flags"] = u(uint64(m.Flags))
		f["smc.add.link.response"] = b(m.Response())
		f["smc.add.link.response.rejected"] = b(m.Rejected())
		f["smc.add.link.sender.mac"] = mac(m.MAC)
		f["smc.add.link.sender.gid"] = gid(m.GID)
		f["smc.add.link.sender.qp.number"] = u(uint64(m.QPN))
		f["smc.add.link.link.number"] = u(uint64(m.Link))
		f["smc.add.link.qp.mtu.value"] = u(uint64(m.MTU))
		f["smc.add.link.initial.psn"] = u(uint64(m.PSN))
		// Wireshark 4.0 shows no reject reason for a version 1 ADD_LINK.
	case *AddLinkCont:
		f["smc.add.link.cont.flags"] = u(uint64(m.Flags))
		f["smc.add.link.cont.response"] = b(m.Response())
		f["smc.add.link.cont.link.number"] = u(uint64(m.Link))
		f["smc.add.link.cont.rkey.number"] = u(uint64(m.Remaining))
		// Not compared: Wireshark 4.0 reads the rkey pairs from offset 6, skipping
		// the two reserved bytes that Linux's packed struct smc_llc_msg_add_link_cont
		// puts before them; the pairs are at 8 on the wire Linux sends and reads.
	case *DeleteLink:
		f["smc.delete.link.flags"] = u(uint64(m.Flags))
		f["smc.delete.link.response"] = b(m.Response())
		f["smc.delete.link.all"] = b(m.All())
		f["smc.delete.link.orderly"] = b(m.Orderly())
		f["smc.delete.link.number"] = u(uint64(m.Link))
		f["smc.delete.link.reason.code"] = u(uint64(m.Reason))
	case *ConfirmRkey:
		f["smc.confirm.rkey.flags"] = u(uint64(m.Flags))
		f["smc.confirm.rkey.response"] = b(m.Response())
		f["smc.confirm.rkey.negative.response"] = b(m.Negative())
		f["smc.confirm.rkey.retry.rkey.set"] = b(m.Flags&FlagRkeyRetry != 0)
		f["smc.confirm.rkey.number.qp"] = u(uint64(m.NumOthers))
		rkeys, addrs, links := []string{u(uint64(m.RKey))}, []string{u(m.Addr)}, []string(nil)
		for _, o := range m.Entries() {
			rkeys = append(rkeys, u(uint64(o.RKey)))
			addrs = append(addrs, u(o.Addr))
			links = append(links, u(uint64(o.Link)))
		}
		f["smc.confirm.rkey.new.rkey"] = strings.Join(rkeys, ",")
		f["smc.confirm.rkey.new.virt"] = strings.Join(addrs, ",")
		f["smc.confirm.rkey.link.number"] = strings.Join(links, ",")
	case *ConfirmRkeyCont:
		f["smc.confirm.rkey.flags"] = u(uint64(m.Flags))
		f["smc.confirm.rkey.response"] = b(m.Response())
		f["smc.confirm.rkey.number.qp"] = u(uint64(m.Remaining))
		var rkeys, addrs, links []string
		for _, o := range m.Entries() {
			rkeys = append(rkeys, u(uint64(o.RKey)))
			addrs = append(addrs, u(o.Addr))
			links = append(links, u(uint64(o.Link)))
		}
		f["smc.confirm.rkey.new.rkey"] = strings.Join(rkeys, ",")
		f["smc.confirm.rkey.new.virt"] = strings.Join(addrs, ",")
		f["smc.confirm.rkey.link.number"] = strings.Join(links, ",")
	case *DeleteRkey:
		f["smc.delete.rkey.flags"] = u(uint64(m.Flags))
		f["smc.delete.rkey.response"] = b(m.Response())
		f["smc.delete.rkey.negative.response"] = b(m.Negative())
		f["smc.delete.rkey.count"] = u(uint64(m.Count))
		f["smc.delete.rkey.error.mask"] = u(uint64(m.ErrMask))
		var rkeys []string
		for _, k := range m.Entries() {
			rkeys = append(rkeys, u(uint64(k)))
		}
		f["smc.delete.rkey.deleted"] = strings.Join(rkeys, ",")
	case *TestLink:
		f["smc.test.link.flags"] = u(uint64(m.Flags))
		f["smc.test.link.response"] = b(m.Response())
	}
	return f
}

func TestTshark(t *testing.T) {
	var names []string
	var payloads [][]byte
	var want []map[string]string
	for _, g := range goldens {
		names = append(names, g.name)
		payloads = append(payloads, unhex(t, g.hex...))
		want = append(want, tsharkFields(g.want))
	}
	tsharktest.Check(t, names, tsharktest.RoCESends(payloads), want)
}
