// Golden, round-trip and fuzz tests of the pure codecs: the Endpoint, the control
// messages of the rendezvous socket and the request-ring slot header.

package shm

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/smcr-io/smcr/smcr/verbs"
)

var goldenEndpoint = endpoint{
	boot: [16]byte{0x64, 0x15, 0xf8, 0x32, 0x0b, 0xa2, 0x40, 0x76, 0x9a, 0x93, 0x6e, 0x55, 0x7d, 0x95, 0xab, 0xeb},
	ino:  0x1122334455667788,
	dev:  0x42,
	path: "/run/smcr/1-a.sock",
}

const goldenEndpointHex = "53484d31" + "01" + "12" +
	"6415f8320ba240769a936e557d95abeb" +
	"1122334455667788" + "0000000000000042" +
	"2f72756e2f736d63722f312d612e736f636b"

func TestEndpointGolden(t *testing.T) {
	got := hex.EncodeToString(goldenEndpoint.append(nil))
	if got != goldenEndpointHex {
		t.Fatalf("encoded\n %s\nwant\n %s", got, goldenEndpointHex)
	}
	b, _ := hex.DecodeString(goldenEndpointHex)
	e, err := parseEndpoint(b)
	if err != nil || e != goldenEndpoint {
		t.Fatalf("parsed %+v, %v", e, err)
	}
}

func TestEndpointRejects(t *testing.T) {
	good, _ := hex.DecodeString(goldenEndpointHex)
	mutate := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for name, b := range map[string][]byte{
		"empty":          nil,
		"magic":          mutate(func(b []byte) []byte { b[0] = 'X'; return b }),
		"version":        mutate(func(b []byte) []byte { b[epOffVer] = 2; return b }),
		"length short":   mutate(func(b []byte) []byte { return b[:len(b)-1] }),
		"length long":    mutate(func(b []byte) []byte { return append(b, 'x') }),
		"zero path":      mutate(func(b []byte) []byte { b[epOffLen] = 0; return b[:epOffPath] }),
		"relative path":  mutate(func(b []byte) []byte { b[epOffPath] = 'r'; return b }),
		"NUL in path":    mutate(func(b []byte) []byte { b[len(b)-2] = 0; return b }),
		"path too long":  (&endpoint{path: "/" + strings.Repeat("a", 120)}).append(nil),
		"header only":    good[:epOffPath],
		"truncated boot": good[:10],
	} {
		if _, err := parseEndpoint(b); !errors.Is(err, errEndpoint) {
			t.Errorf("%s: %v, want errEndpoint", name, err)
		}
	}
}

var goldenCtl = []struct {
	name string
	msg  ctl
	hex  string
}{
	{"hello", ctl{typ: ctlHello, dstQPN: 0xabcdef, srcQPN: 0x12, ino: 0x0102030405060708, segSize: 0x10000, rnr: 7},
		"01000000" + "00abcdef" + "00000012" + "0102030405060708" + "00010000" + "07000000"},
	{"hello ack", ctl{typ: ctlHelloAck, dstQPN: 0x12, srcQPN: 0xabcdef, ino: 9, segSize: 0x2000, rnr: 0},
		"02000000" + "00000012" + "00abcdef" + "0000000000000009" + "00002000" + "00000000"},
	{"doorbell", ctl{typ: ctlDoorbell}, "03000000"},
	{"map request", ctl{typ: ctlMapReq, rkey: 0xdeadbeef}, "04000000" + "deadbeef"},
	{"map reply", ctl{typ: ctlMapRep, rkey: 0xdeadbeef, status: mapOK, access: verbs.AccessRemoteWrite | verbs.AccessLocalWrite,
		addr: 0x7f0000001000, size: 1 << 20}, "05000000" + "deadbeef" + "00030000" + "00007f0000001000" + "0000000000100000"},
	{"map refused", ctl{typ: ctlMapRep, rkey: 5, status: mapNoAccess}, "05000000" + "00000005" + "01000000" + "0000000000000000" + "0000000000000000"},
	{"revoke", ctl{typ: ctlRevoke, rkey: 0x01020304}, "06000000" + "01020304"},
}

func TestCtlGolden(t *testing.T) {
	for _, g := range goldenCtl {
		got := hex.EncodeToString(g.msg.append(nil))
		if got != g.hex {
			t.Errorf("%s: encoded\n %s\nwant\n %s", g.name, got, g.hex)
		}
		b, _ := hex.DecodeString(g.hex)
		m, err := parseCtl(b)
		if err != nil || m != g.msg {
			t.Errorf("%s: parsed %+v, %v", g.name, m, err)
		}
	}
}

func TestCtlRejects(t *testing.T) {
	hello, _ := hex.DecodeString(goldenCtl[0].hex)
	rep, _ := hex.DecodeString(goldenCtl[4].hex)
	set := func(b []byte, i int, v byte) []byte { c := append([]byte(nil), b...); c[i] = v; return c }
	for name, b := range map[string][]byte{
		"short":             {3, 0},
		"unknown type":      {9, 0, 0, 0},
		"doorbell too long": {3, 0, 0, 0, 0},
		"hello truncated":   hello[:27],
		"reserved":          set(hello, 2, 1),
		"hello trailer":     set(hello, 26, 1),
		"qpn over 24 bits":  set(hello, 4, 1),
		"rnr over 7":        set(hello, 24, 8),
		"reply status":      set(rep, 8, 2),
		"reply reserved":    set(rep, 11, 1),
	} {
		if _, err := parseCtl(b); !errors.Is(err, errPeer) {
			t.Errorf("%s: %v, want errPeer", name, err)
		}
	}
}

func TestSlot(t *testing.T) {
	b := make([]byte, 128)
	putSlot(b, slotHdr{op: slotOpSend, len: 100, imm: 7})
	if h, err := parseSlot(b, 128); err != nil || h != (slotHdr{op: slotOpSend, len: 100, imm: 7}) {
		t.Fatalf("send slot: %+v %v", h, err)
	}
	putSlot(b, slotHdr{op: slotOpSend, len: 128 - slotHdrLen + 1})
	if _, err := parseSlot(b, 128); !errors.Is(err, errPeer) {
		t.Fatalf("send longer than its slot: %v", err)
	}
	putSlot(b, slotHdr{op: slotOpImm, len: 1 << 30, imm: 1})
	if h, err := parseSlot(b, 128); err != nil || h.len != 1<<30 {
		t.Fatalf("write-imm slot (data is elsewhere): %+v %v", h, err)
	}
	b[slotOffOp] = 0
	if _, err := parseSlot(b, 128); !errors.Is(err, errPeer) {
		t.Fatalf("opcode 0: %v", err)
	}
}

func FuzzParseEndpoint(f *testing.F) {
	b, _ := hex.DecodeString(goldenEndpointHex)
	f.Add(b)
	f.Add(b[:epOffPath])
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := parseEndpoint(b)
		if err != nil {
			return
		}
		if again := e.append(nil); !bytes.Equal(again, b) {
			t.Fatalf("re-encoded %x from %x", again, b)
		}
	})
}

func FuzzParseCtl(f *testing.F) {
	for _, g := range goldenCtl {
		b, _ := hex.DecodeString(g.hex)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseCtl(b)
		if err != nil {
			return
		}
		if again := m.append(nil); !bytes.Equal(again, b) {
			t.Fatalf("re-encoded %x from %x", again, b)
		}
	})
}

func FuzzParseSlot(f *testing.F) {
	b := make([]byte, slotHdrLen)
	putSlot(b, slotHdr{op: slotOpSend, len: 48, imm: 0})
	f.Add(b, 64)
	putSlot(b, slotHdr{op: slotOpImm, len: 4096, imm: 42})
	f.Add(b, 8256)
	f.Fuzz(func(t *testing.T, b []byte, slotSize int) {
		h, err := parseSlot(b, slotSize)
		if err != nil {
			return
		}
		if h.op == slotOpSend && int64(h.len) > int64(slotSize-slotHdrLen) {
			t.Fatalf("accepted a send of %d bytes in a %d-byte slot", h.len, slotSize)
		}
	})
}
