package bpf

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// tcObjects loads the programs unpinned and unattached, with port 7002 listed and
// smcrd alive, for running the tc program on crafted packets (BPF_PROG_TEST_RUN).
func tcObjects(tb testing.TB) *smcrObjects {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root (CAP_BPF) to load eBPF programs")
	}
	var o smcrObjects
	spec, err := loadSmcr()
	if err != nil {
		tb.Fatal(err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	if err := spec.LoadAndAssign(&o, nil); err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) {
			tb.Skipf("kernel lacks a BPF feature smcr needs: %v", err)
		}
		tb.Fatal(err)
	}
	tb.Cleanup(func() { o.Close() })
	l := &Loader{objs: o}
	must2(tb, l.SetPorts([]PortRange{{portSteered, portSteered}}))
	must2(tb, l.SetAlive(1<<40))
	return &o
}

func must2(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

// synWithOptions builds an Ethernet/IPv4/TCP SYN from 198.18.0.1:40000 to
// 198.18.0.2:7002 with opts (padded with EOL to a multiple of 4, at most 40 bytes).
func synWithOptions(opts []byte) []byte {
	opts = opts[:min(len(opts), 40)]
	olen := (len(opts) + 3) &^ 3
	f := make([]byte, 14+20+20+olen)
	binary.BigEndian.PutUint16(f[12:], unix.ETH_P_IP)
	ip := f[14:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+20+olen))
	ip[8], ip[9] = 64, unix.IPPROTO_TCP
	copy(ip[12:], []byte{198, 18, 0, 1, 198, 18, 0, 2})
	th := ip[20:]
	binary.BigEndian.PutUint16(th[0:], 40000)
	binary.BigEndian.PutUint16(th[2:], portSteered)
	th[12] = byte((20+olen)/4) << 4
	th[13] = 0x02 // SYN
	copy(th[20:], opts)
	return f
}

var synKey = smcrTuple{
	Family: unix.AF_INET,
	Laddr:  [4]uint32{binary.NativeEndian.Uint32([]byte{198, 18, 0, 2})},
	Raddr:  [4]uint32{binary.NativeEndian.Uint32([]byte{198, 18, 0, 1})},
	Lport:  portSteered, Rport: 40000,
}

// marked runs the tc program on a SYN with opts and reports whether it marked it.
func marked(tb testing.TB, o *smcrObjects, opts []byte) bool {
	tb.Helper()
	o.SmcrSynmark.Delete(synKey)
	return runTC(tb, o, opts)
}

// runTC runs the tc program on a SYN with opts and reports whether its 4-tuple
// is marked afterwards.
func runTC(tb testing.TB, o *smcrObjects, opts []byte) bool {
	tb.Helper()
	ret, err := o.SmcrTcIngress.Run(&ebpf.RunOptions{Data: synWithOptions(opts)})
	if err != nil {
		tb.Fatalf("run tc program: %v", err)
	}
	if int32(ret) != -1 { // TC_ACT_UNSPEC: the packet always goes on
		tb.Fatalf("tc program returned %d, want TC_ACT_UNSPEC", int32(ret))
	}
	var ts uint64
	return o.SmcrSynmark.Lookup(synKey, &ts) == nil
}

var smcOpt = []byte{254, 6, 0xe2, 0xd4, 0xc3, 0xd9}

var optionCases = []struct {
	name string
	opts []byte
	want bool
}{
	{"none", nil, false},
	{"smc alone", smcOpt, true},
	{"linux SYN then smc", append([]byte{2, 4, 5, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7}, smcOpt...), true},
	{"nops then smc", append([]byte{1, 1, 1}, smcOpt...), true},
	{"smc at the very end", append(make([]byte, 0), append([]byte{1, 1}, append([]byte{254, 34}, make([]byte, 32)...)...)...), false},
	{"smc in the last 6 bytes", append(append([]byte{254, 34}, make([]byte, 32)...), smcOpt...), true},
	{"other ExID", []byte{254, 6, 0xe2, 0xd4, 0xc3, 0xda}, false},
	{"16-bit ExID form", []byte{254, 4, 0xe2, 0xd4}, false},
	{"wrong length", []byte{254, 8, 0xe2, 0xd4, 0xc3, 0xd9, 0, 0}, false},
	{"after EOL", append([]byte{0, 1}, smcOpt...), false},
	{"zero length before", append([]byte{8, 0}, smcOpt...), false},
	{"length past end", []byte{254, 6, 0xe2, 0xd4}, false},
	{"inside another option", []byte{253, 8, 254, 6, 0xe2, 0xd4, 0xc3, 0xd9}, false},
	// As the steering listener finds the option to echo it (bpf_load_hdr_opt).
	{"other ExID then smc", append([]byte{254, 6, 'S', 'M', 'C', 'X'}, smcOpt...), true},
	{"experimental fast open then smc", append([]byte{254, 4, 0xf9, 0x89}, smcOpt...), false},
	{"wrong length then smc", append([]byte{254, 8, 0xe2, 0xd4, 0xc3, 0xd9, 0, 0}, smcOpt...), false},
}

func TestTCOptionWalk(t *testing.T) {
	o := tcObjects(t)
	for _, c := range optionCases {
		if ref := hasSMCOption(padOpts(c.opts)); ref != c.want {
			t.Fatalf("%s: reference walk says %v, case says %v", c.name, ref, c.want)
		}
		if got := marked(t, o, c.opts); got != c.want {
			t.Errorf("%s: marked %v, want %v", c.name, got, c.want)
		}
	}
	// Not a SYN to a listed port, or smcrd dead: never marked.
	must2(t, (&Loader{objs: *o}).SetAlive(0))
	if marked(t, o, smcOpt) {
		t.Error("smcrd dead: SYN marked")
	}
}

// TestTCUnmarks: a SYN the program does not mark clears the mark an earlier
// connection left on its 4-tuple, whatever keeps it from marking, so sk_lookup
// does not steer the new connection.
func TestTCUnmarks(t *testing.T) {
	o := tcObjects(t)
	l := &Loader{objs: *o}
	for _, c := range []struct {
		name  string
		opts  []byte
		setup func() error
	}{
		{"no option", nil, func() error { return nil }},
		{"port no longer listed", smcOpt, func() error { return l.SetPorts(nil) }},
		{"smcrd dead", smcOpt, func() error { return l.SetAlive(0) }},
	} {
		must2(t, l.SetPorts([]PortRange{{portSteered, portSteered}}))
		must2(t, l.SetAlive(1<<40))
		must2(t, c.setup())
		must2(t, o.SmcrSynmark.Put(synKey, uint64(monotonic())))
		if runTC(t, o, c.opts) {
			t.Errorf("%s: the earlier connection's mark survived the SYN", c.name)
		}
	}
}

func padOpts(opts []byte) []byte {
	opts = opts[:min(len(opts), 40)]
	return append(append([]byte(nil), opts...), make([]byte, (4-len(opts)%4)%4)...)
}

// FuzzTCOptions: the tc program's option walk agrees with the reference walk on
// any option bytes, and the program always passes the packet on.
func FuzzTCOptions(f *testing.F) {
	for _, c := range optionCases {
		f.Add(c.opts)
	}
	o := tcObjects(f)
	f.Fuzz(func(t *testing.T, opts []byte) {
		want := hasSMCOption(padOpts(opts))
		if got := marked(t, o, opts); got != want {
			t.Errorf("options %x: marked %v, reference %v", opts, got, want)
		}
	})
}

var syn6Src, syn6Dst = netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")

var syn6Key = smcrTuple{Family: unix.AF_INET6, Laddr: addrWords(syn6Dst), Raddr: addrWords(syn6Src), Lport: portSteered, Rport: 40000}

// syn6WithOptions builds an Ethernet/IPv6/TCP SYN from [2001:db8::1]:40000 to
// [2001:db8::2]:7002 with opts (a multiple of 4 long), behind extension
// headers of the kinds ext (hop-by-hop, destination options, routing), each 16
// bytes of padding.
func syn6WithOptions(opts []byte, ext ...uint8) []byte {
	f := make([]byte, 14+40+16*len(ext)+20+len(opts))
	binary.BigEndian.PutUint16(f[12:], unix.ETH_P_IPV6)
	ip := f[14:]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(f)-14-40))
	ip[7] = 64
	copy(ip[8:], syn6Src.AsSlice())
	copy(ip[24:], syn6Dst.AsSlice())
	next := ip[6:7]
	h := ip[40:]
	for _, kind := range ext {
		next[0] = kind
		h[1] = 1           // (1+1)*8 bytes
		h[2], h[3] = 1, 12 // PadN over the rest
		next, h = h[0:1], h[16:]
	}
	next[0] = unix.IPPROTO_TCP
	binary.BigEndian.PutUint16(h[0:], 40000)
	binary.BigEndian.PutUint16(h[2:], portSteered)
	h[12] = byte((20+len(opts))/4) << 4
	h[13] = 0x02 // SYN
	copy(h[20:], opts)
	return f
}

// TestTCIPv6ExtensionHeaders: a SYN behind IPv6 extension headers is read like
// any other: marked with the option, and without it clearing the mark an
// earlier connection left on its 4-tuple, which would otherwise steer this
// plain connection to smcrd (who would wait for a CLC Proposal).
func TestTCIPv6ExtensionHeaders(t *testing.T) {
	o := tcObjects(t)
	smc := append([]byte{1, 1}, smcOpt...)
	for _, c := range []struct {
		name string
		opts []byte
		ext  []uint8
		want bool
	}{
		{"option", smc, nil, true},
		{"option behind hop-by-hop", smc, []uint8{unix.IPPROTO_HOPOPTS}, true},
		{"option behind hop-by-hop, routing, destination", smc, []uint8{unix.IPPROTO_HOPOPTS, unix.IPPROTO_ROUTING, unix.IPPROTO_DSTOPTS}, true},
		{"no option behind hop-by-hop", nil, []uint8{unix.IPPROTO_HOPOPTS}, false},
		{"no option behind destination options", nil, []uint8{unix.IPPROTO_DSTOPTS}, false},
	} {
		if !c.want {
			must2(t, o.SmcrSynmark.Put(syn6Key, uint64(monotonic())))
		} else {
			o.SmcrSynmark.Delete(syn6Key)
		}
		ret, err := o.SmcrTcIngress.Run(&ebpf.RunOptions{Data: syn6WithOptions(c.opts, c.ext...)})
		if err != nil || int32(ret) != -1 {
			t.Fatalf("%s: tc program returned %d, %v; want TC_ACT_UNSPEC", c.name, int32(ret), err)
		}
		var ts uint64
		if got := o.SmcrSynmark.Lookup(syn6Key, &ts) == nil; got != c.want {
			t.Errorf("%s: marked %v, want %v", c.name, got, c.want)
		}
	}
	// A header claiming more than the frame holds: passed on, unread.
	f := syn6WithOptions(smc, unix.IPPROTO_HOPOPTS)
	f[14+40+1] = 255
	o.SmcrSynmark.Delete(syn6Key)
	if ret, err := o.SmcrTcIngress.Run(&ebpf.RunOptions{Data: f}); err != nil || int32(ret) != -1 {
		t.Errorf("truncated extension header: tc program returned %d, %v; want TC_ACT_UNSPEC", int32(ret), err)
	}
	var ts uint64
	if o.SmcrSynmark.Lookup(syn6Key, &ts) == nil {
		t.Error("truncated extension header: marked")
	}
}
