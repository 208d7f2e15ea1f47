// Package tsharktest checks wire formats against Wireshark: it frames messages by hand
// into a pcap and reads back the fields tshark's dissector decodes from them. The
// framing uses documentation-only addresses and never touches a network.
package tsharktest

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// RoCEv2Port is the UDP port of RoCE v2, where tshark looks for InfiniBand BTHs.
const RoCEv2Port = 4791

// TCPSegments frames payloads as consecutive segments of one TCP connection from
// port 40000 to dstPort.
func TCPSegments(payloads [][]byte, dstPort uint16) [][]byte {
	seq := uint32(1000)
	frames := make([][]byte, len(payloads))
	for i, p := range payloads {
		tcp := make([]byte, 20, 20+len(p))
		binary.BigEndian.PutUint16(tcp[0:], 40000)
		binary.BigEndian.PutUint16(tcp[2:], dstPort)
		binary.BigEndian.PutUint32(tcp[4:], seq)
		binary.BigEndian.PutUint32(tcp[8:], 1)
		tcp[12], tcp[13] = 5<<4, 0x18 // header length 20, PSH|ACK
		binary.BigEndian.PutUint16(tcp[14:], 65535)
		frames[i] = ipv4Frame(i, 6, append(tcp, p...))
		seq += uint32(len(p))
	}
	return frames
}

// RoCESends frames payloads as RoCE v2 RC SEND Only packets (UDP to port 4791), each
// followed by a 4-byte invariant CRC that Wireshark does not check.
func RoCESends(payloads [][]byte) [][]byte {
	frames := make([][]byte, len(payloads))
	for i, p := range payloads {
		// BTH: opcode RC SEND Only, MigReq, P_Key 0xffff, dest QP, PSN.
		bth := []byte{0x04, 0x40, 0xff, 0xff, 0, 0, 0x01, 0x1a, 0, 0, 0, byte(i)}
		payload := slices.Concat(bth, p, []byte{0, 0, 0, 0})
		udp := make([]byte, 8, 8+len(payload)) // checksum 0: none, allowed over IPv4
		binary.BigEndian.PutUint16(udp[0:], 49152)
		binary.BigEndian.PutUint16(udp[2:], RoCEv2Port)
		binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
		frames[i] = ipv4Frame(i, 17, append(udp, payload...))
	}
	return frames
}

// ipv4Frame wraps a transport segment in Ethernet and IPv4 (192.0.2.2 → 192.0.2.1).
func ipv4Frame(id int, proto byte, segment []byte) []byte {
	pkt := []byte{0x52, 0x54, 0, 0x12, 0x34, 0x56, 0x52, 0x54, 0, 0x67, 0x89, 0xab, 0x08, 0x00}
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(segment)))
	binary.BigEndian.PutUint16(ip[4:], uint16(id+1))
	ip[8], ip[9] = 64, proto
	copy(ip[12:], []byte{192, 0, 2, 2})
	copy(ip[16:], []byte{192, 0, 2, 1})
	var sum uint32
	for j := 0; j < 20; j += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[j:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	return slices.Concat(pkt, ip, segment)
}

// pcap encodes Ethernet frames as a classic little-endian pcap file.
func pcap(frames [][]byte) []byte {
	var f []byte
	f = binary.LittleEndian.AppendUint32(f, 0xa1b2c3d4)
	f = binary.LittleEndian.AppendUint16(f, 2)
	f = binary.LittleEndian.AppendUint16(f, 4)
	f = append(f, make([]byte, 8)...) // thiszone, sigfigs
	f = binary.LittleEndian.AppendUint32(f, 65535)
	f = binary.LittleEndian.AppendUint32(f, 1) // LINKTYPE_ETHERNET
	for i, pkt := range frames {
		f = binary.LittleEndian.AppendUint32(f, uint32(1700000000+i))
		f = binary.LittleEndian.AppendUint32(f, 0)
		f = binary.LittleEndian.AppendUint32(f, uint32(len(pkt)))
		f = binary.LittleEndian.AppendUint32(f, uint32(len(pkt)))
		f = append(f, pkt...)
	}
	return f
}

// Check writes frames to a pcap, has tshark decode it, and compares, frame by frame,
// every field named in want[i] with tshark's value (several occurrences joined by
// commas; numbers compared by value). A missing tshark fails the test: the set-up
// installs it, so its absence is a broken set-up, not a reason to check nothing.
func Check(t *testing.T, names []string, frames [][]byte, want []map[string]string) {
	t.Helper()
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Fatalf("tshark is not installed: run scripts/deps.sh (%v)", err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "capture.pcap")
	if err := os.WriteFile(path, pcap(frames), 0o644); err != nil {
		t.Fatal(err)
	}
	var fields []string
	for _, w := range want {
		for k := range w {
			if !slices.Contains(fields, k) {
				fields = append(fields, k)
			}
		}
	}
	slices.Sort(fields)
	args := []string{"-r", path, "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=,", "-E", "separator=/t"}
	for _, k := range fields {
		args = append(args, "-e", k)
	}
	cmd := exec.Command(tshark, args...)
	cmd.Env = append(os.Environ(), "HOME="+dir) // no user preferences
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != len(frames) {
		t.Fatalf("tshark printed %d frames, want %d:\n%s", len(lines), len(frames), out)
	}
	for i, w := range want {
		vals := strings.Split(lines[i], "\t")
		if len(vals) != len(fields) {
			t.Fatalf("%s: %d values for %d fields: %q", names[i], len(vals), len(fields), lines[i])
		}
		for k, wantVal := range w {
			if got := vals[slices.Index(fields, k)]; !SameValue(got, wantVal) {
				t.Errorf("%s: tshark %s = %q, want %q", names[i], k, got, wantVal)
			}
		}
	}
}

// SameValue compares a tshark value with an expected one: numbers by value in any
// base strconv reads, lists element by element.
func SameValue(got, want string) bool {
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
