// Interop check: the golden messages, framed by hand in a pcap, as tshark's SMC
// dissector decodes them. Covers RFC 7609 §3.7 as Wireshark implements it.

package clc

import (
	"encoding/binary"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const smcPort = 12345

// writePcap writes one Ethernet/IPv4/TCP segment per payload, client to server on
// one connection with consecutive sequence numbers.
func writePcap(t *testing.T, path string, payloads [][]byte) {
	t.Helper()
	var f []byte
	f = binary.LittleEndian.AppendUint32(f, 0xa1b2c3d4)
	f = binary.LittleEndian.AppendUint16(f, 2)
	f = binary.LittleEndian.AppendUint16(f, 4)
	f = append(f, make([]byte, 8)...) // thiszone, sigfigs
	f = binary.LittleEndian.AppendUint32(f, 65535)
	f = binary.LittleEndian.AppendUint32(f, 1) // LINKTYPE_ETHERNET
	seq := uint32(1000)
	for i, p := range payloads {
		var pkt []byte
		pkt = append(pkt, 0x52, 0x54, 0, 0x12, 0x34, 0x56, 0x52, 0x54, 0, 0x67, 0x89, 0xab, 0x08, 0x00)
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+20+len(p)))
		binary.BigEndian.PutUint16(ip[4:], uint16(i+1))
		ip[8], ip[9] = 64, 6
		copy(ip[12:], []byte{192, 168, 10, 2})
		copy(ip[16:], []byte{192, 168, 10, 1})
		var sum uint32
		for j := 0; j < 20; j += 2 {
			sum += uint32(binary.BigEndian.Uint16(ip[j:]))
		}
		for sum > 0xffff {
			sum = sum&0xffff + sum>>16
		}
		binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
		pkt = append(pkt, ip...)
		tcp := make([]byte, 20)
		binary.BigEndian.PutUint16(tcp[0:], 40000)
		binary.BigEndian.PutUint16(tcp[2:], smcPort)
		binary.BigEndian.PutUint32(tcp[4:], seq)
		binary.BigEndian.PutUint32(tcp[8:], 1)
		tcp[12], tcp[13] = 5<<4, 0x18 // header length 20, PSH|ACK
		binary.BigEndian.PutUint16(tcp[14:], 65535)
		pkt = append(pkt, tcp...)
		pkt = append(pkt, p...)
		seq += uint32(len(p))

		f = binary.LittleEndian.AppendUint32(f, uint32(1700000000+i))
		f = binary.LittleEndian.AppendUint32(f, 0)
		f = binary.LittleEndian.AppendUint32(f, uint32(len(pkt)))
		f = binary.LittleEndian.AppendUint32(f, uint32(len(pkt)))
		f = append(f, pkt...)
	}
	if err := os.WriteFile(path, f, 0o644); err != nil {
		t.Fatal(err)
	}
}

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
		f["smc.length"] = u(DeclineLen)
		f["smc.sender.peer.id"] = u(binary.BigEndian.Uint64(m.PeerID[:]))
		f["smc.peer.diag.info"] = u(uint64(m.Code))
		f["smc.decline.osync"] = b(m.OutOfSync)
	}
	return f
}

// sameValue compares a tshark value with an expected one, numbers by value.
func sameValue(got, want string) bool {
	g, gerr := strconv.ParseUint(got, 0, 64)
	w, werr := strconv.ParseUint(want, 0, 64)
	if gerr == nil && werr == nil {
		return g == w
	}
	return got == want
}

func TestTshark(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed")
	}
	// Wireshark's dissector reads the IP area at Linux's fixed place and ignores
	// iparea_offset, so it misreads the old form (as it would a kernel's); the
	// codec's own tests cover that form.
	var gs []golden
	for _, g := range goldens {
		if g.name != "proposal-ipv4-old-form" {
			gs = append(gs, g)
		}
	}
	var payloads [][]byte
	for _, g := range gs {
		payloads = append(payloads, unhex(t, g.hex))
	}
	path := filepath.Join(t.TempDir(), "clc.pcap")
	writePcap(t, path, payloads)

	fieldSet := map[string]bool{}
	for _, g := range gs {
		for k := range tsharkFields(g.want) {
			fieldSet[k] = true
		}
	}
	fields := slices.Sorted(maps.Keys(fieldSet))
	args := []string{"-r", path, "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=,", "-E", "separator=/t"}
	for _, k := range fields {
		args = append(args, "-e", k)
	}
	cmd := exec.Command(tshark, args...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir()) // no user preferences
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != len(gs) {
		t.Fatalf("tshark printed %d frames, want %d:\n%s", len(lines), len(gs), out)
	}
	for i, g := range gs {
		vals := strings.Split(lines[i], "\t")
		if len(vals) != len(fields) {
			t.Fatalf("%s: %d values for %d fields: %q", g.name, len(vals), len(fields), lines[i])
		}
		for k, want := range tsharkFields(g.want) {
			got := vals[slices.Index(fields, k)]
			if !sameValue(got, want) {
				t.Errorf("%s: tshark %s = %q, want %q", g.name, k, got, want)
			}
		}
	}
}
