// Interop check: the golden LLC messages, framed by hand as RoCEv2 SENDs in a pcap,
// as tshark's SMC-R dissector decodes them (RFC 7609 §3.8 as Wireshark implements it).

package llc

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

const roceV2Port = 4791 // UDP port of RoCE v2

// writeRoCEPcap writes one Ethernet/IPv4/UDP/BTH packet per payload: an RC SEND Only
// carrying the payload, then a 4-byte invariant CRC (not checked by Wireshark).
func writeRoCEPcap(t *testing.T, path string, payloads [][]byte) {
	t.Helper()
	var f []byte
	f = binary.LittleEndian.AppendUint32(f, 0xa1b2c3d4) // pcap magic
	f = binary.LittleEndian.AppendUint16(f, 2)
	f = binary.LittleEndian.AppendUint16(f, 4)
	f = append(f, make([]byte, 8)...) // thiszone, sigfigs
	f = binary.LittleEndian.AppendUint32(f, 65535)
	f = binary.LittleEndian.AppendUint32(f, 1) // LINKTYPE_ETHERNET
	for i, p := range payloads {
		// BTH: opcode RC SEND Only, MigReq, P_Key 0xffff, dest QP, PSN.
		bth := []byte{0x04, 0x40, 0xff, 0xff, 0, 0, 0x01, 0x1a, 0, 0, 0, byte(i)}
		udpPayload := slices.Concat(bth, p, []byte{0, 0, 0, 0})

		pkt := []byte{0x52, 0x54, 0, 0x12, 0x34, 0x56, 0x52, 0x54, 0, 0x67, 0x89, 0xab, 0x08, 0x00}
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(udpPayload)))
		binary.BigEndian.PutUint16(ip[4:], uint16(i+1))
		ip[8], ip[9] = 64, 17 // TTL, UDP
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
		udp := make([]byte, 8) // checksum 0: none, allowed over IPv4
		binary.BigEndian.PutUint16(udp[0:], 49152)
		binary.BigEndian.PutUint16(udp[2:], roceV2Port)
		binary.BigEndian.PutUint16(udp[4:], uint16(8+len(udpPayload)))
		pkt = append(pkt, udp...)
		pkt = append(pkt, udpPayload...)

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

// sameValue compares a tshark value with an expected one; numbers by value, lists
// element by element.
func sameValue(got, want string) bool {
	gs, ws := strings.Split(got, ","), strings.Split(want, ",")
	if len(gs) != len(ws) {
		return false
	}
	for i := range gs {
		g, gerr := strconv.ParseUint(gs[i], 0, 64)
		w, werr := strconv.ParseUint(ws[i], 0, 64)
		if gerr == nil && werr == nil {
			if g != w {
				return false
			}
		} else if gs[i] != ws[i] {
			return false
		}
	}
	return true
}

func TestTshark(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed")
	}
	var payloads [][]byte
	for _, g := range goldens {
		payloads = append(payloads, unhex(t, g.hex...))
	}
	path := filepath.Join(t.TempDir(), "llc.pcap")
	writeRoCEPcap(t, path, payloads)

	fieldSet := map[string]bool{}
	for _, g := range goldens {
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
	if len(lines) != len(goldens) {
		t.Fatalf("tshark printed %d frames, want %d:\n%s", len(lines), len(goldens), out)
	}
	for i, g := range goldens {
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
