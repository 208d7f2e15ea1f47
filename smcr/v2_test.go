package smcr

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/smcr-io/smcr/llc"
	"github.com/smcr-io/smcr/smcr/clc"
	"github.com/smcr-io/smcr/smcr/internal/memverbs"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// v2Engines are a client and a server engine with an rdma device each, whose
// GID is IPv4-mapped as a RoCE v2 one (127.0.0.x), and the User EIDs given.
func v2Engines(t *testing.T, cli, srv []string) (*Engine, *Engine) {
	t.Helper()
	return newEngine(t, Config{Devices: roceV2Device(t, 1), UEIDs: cli}),
		newEngine(t, Config{Devices: roceV2Device(t, 2), UEIDs: srv})
}

func roceV2Device(t *testing.T, host byte) []verbs.Device {
	d := memverbs.New(verbs.KindRDMA)
	t.Cleanup(func() { closeChecked(t, d) })
	d.ChangeGID([16]byte{10: 0xff, 11: 0xff, 12: 127, 15: host})
	return []verbs.Device{d}
}

// exchange sends n random bytes each way over c and s and checks them.
func exchange(t *testing.T, c, s net.Conn, n int) {
	t.Helper()
	for _, dir := range [][2]net.Conn{{c, s}, {s, c}} {
		want := make([]byte, n)
		rand.NewChaCha8([32]byte{byte(n)}).Read(want)
		errc := make(chan error, 1)
		go func() { _, err := dir[0].Write(want); errc <- err }()
		got := make([]byte, n)
		dir[1].SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(dir[1], got); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatal("bytes differ")
		}
	}
}

// TestVersion2: a client for a standard server (Linux's) with a User EID
// proposes versions 1 and 2; a server with that EID answers version 2, first
// contact with the first-contact extension, and both ends run the link group
// with version 2's LLC; later connections join it. Release 2.1 on both ends,
// and 2.0 (as Linux 6.1), where the server's empty ADD_LINK is rejected.
func TestVersion2(t *testing.T) {
	t.Run("2.1", func(t *testing.T) { testVersion2(t, clc.Release21) })
	t.Run("2.0", func(t *testing.T) {
		defer func(o clc.V2Terms) { v2Offer = o }(v2Offer)
		v2Offer.Release = clc.Release20
		testVersion2(t, clc.Release20)
	})
}

func testVersion2(t *testing.T, release uint8) {
	e1, e2 := v2Engines(t, []string{"SMCR-TEST.A", "SMCR-TEST.B"}, []string{"SMCR-TEST.B"})
	var lg *linkGroup
	for i := range 3 {
		c, s := connectWith(t, e1, e2, ClientOptions{Standard: true}, ServerOptions{})
		t.Cleanup(func() { c.Close(); s.Close() })
		mustSMC(t, c, s)
		for _, x := range []*Conn{c, s} {
			if x.v2 == nil || x.v2.eid.String() != "SMCR-TEST.B" || !x.lg.key.v2 || x.lg.v2.Release != release ||
				(release == clc.Release21) != (x.lg.v2.MaxLinks == 1) {
				t.Fatalf("conn %d: v2 %+v, group key %+v terms %+v", i, x.v2, x.lg.key, x.lg.v2)
			}
			if x.lnk.rslot != recvSlotV2 {
				t.Fatalf("receive slots of %d bytes in a version-2 link", x.lnk.rslot)
			}
		}
		if lg == nil {
			lg = s.lg
		} else if s.lg != lg || s.reusedLG != true {
			t.Fatalf("connection %d did not join the link group", i)
		}
		exchange(t, c, s, 300<<10)
	}
	if s1, s2 := e1.Stats(), e2.Stats(); s1.SMCV2 != 3 || s2.SMCV2 != 3 {
		t.Fatalf("version-2 connections counted: client %d, server %d; want 3", s1.SMCV2, s2.SMCV2)
	}
	if n := e1.st.protoErrors.Load() + e2.st.protoErrors.Load(); n != 0 {
		t.Fatalf("%d protocol errors", n)
	}
	// TEST_LINK both ways over version 2's LLC.
	for _, l := range []*link{lg.primary(), e1.lgs[0].primary()} {
		if err := l.testOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestVersion2Fallbacks: no EID in common, or none configured on one end, and
// the handshake is version 1's, as before version 2.
func TestVersion2Fallbacks(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cli, srv []string
	}{
		{"no common eid", []string{"SMCR-A"}, []string{"SMCR-B"}},
		{"server without", []string{"SMCR-A"}, nil},
		{"client without", nil, []string{"SMCR-A"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e1, e2 := v2Engines(t, tc.cli, tc.srv)
			c, s := connectWith(t, e1, e2, ClientOptions{Standard: true}, ServerOptions{})
			t.Cleanup(func() { c.Close(); s.Close() })
			mustSMC(t, c, s)
			if c.v2 != nil || s.v2 != nil || s.lg.key.v2 || e1.Stats().SMCV2 != 0 {
				t.Fatalf("version 2 agreed: %+v %+v", c.v2, s.v2)
			}
			exchange(t, c, s, 64<<10)
		})
	}
}

// TestVersion2NeedsIPv4: a device whose GID is not IPv4-mapped proposes version
// 1 only: version 2 routes on IPv4 addresses.
func TestVersion2NeedsIPv4(t *testing.T) {
	e1 := newEngine(t, Config{Devices: memDevices(t, verbs.KindRDMA), UEIDs: []string{"SMCR-A"}})
	_, e2 := v2Engines(t, nil, []string{"SMCR-A"})
	c, s := connectWith(t, e1, e2, ClientOptions{Standard: true}, ServerOptions{})
	t.Cleanup(func() { c.Close(); s.Close() })
	mustSMC(t, c, s)
	if c.v2 != nil || s.v2 != nil {
		t.Fatalf("version 2 agreed with an IPv6 GID: %+v %+v", c.v2, s.v2)
	}
}

// TestVersion2Declines: a version-2-only Proposal (as Linux sends over RoCE v2)
// that the server cannot take is declined with version 2's codes.
func TestVersion2Declines(t *testing.T) {
	_, e2 := v2Engines(t, nil, []string{"SMCR-B"})
	eid := func(s string) clc.EID { e, _ := clc.ParseEID(s); return e }
	gid := [16]byte{10: 0xff, 11: 0xff, 12: 127, 15: 1}
	for _, tc := range []struct {
		name string
		v2   clc.ProposalV2
		want clc.DeclineCode
	}{
		{"no common eid", clc.ProposalV2{RoCEGID: gid, UEIDs: []clc.EID{eid("SMCR-A")}}, clc.DeclineNoUEID},
		{"max conns", clc.ProposalV2{Release: 1, MaxConns: 5, MaxLinks: 2, RoCEGID: gid, UEIDs: []clc.EID{eid("SMCR-B")}}, clc.DeclineMaxConnsMismatch},
		{"max links", clc.ProposalV2{Release: 1, MaxConns: 255, RoCEGID: gid, UEIDs: []clc.EID{eid("SMCR-B")}}, clc.DeclineMaxLinksMismatch},
		{"no gid", clc.ProposalV2{UEIDs: []clc.EID{eid("SMCR-B")}}, clc.DeclineNoRoute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			done := make(chan *Conn, 1)
			go func() {
				tcp, err := ln.Accept()
				if err != nil {
					done <- nil
					return
				}
				s, _ := e2.ServerWith(context.Background(), tcp, ServerOptions{})
				done <- s
			}()
			tcp, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer tcp.Close()
			v := tc.v2
			p := &clc.Proposal{Version: clc.Version2, SMCType: clc.SMCTypeN, SMCTypeV2: clc.SMCTypeR, V2: &v}
			b, err := p.AppendTo(nil)
			if err != nil {
				t.Fatal(err)
			}
			tcp.Write(b)
			tcp.SetReadDeadline(time.Now().Add(5 * time.Second))
			m, err := clc.ReadMessage(tcp, clc.MaxLen)
			if err != nil {
				t.Fatal(err)
			}
			d, ok := m.(*clc.Decline)
			if !ok || d.Code != tc.want {
				t.Fatalf("got %+v, want a Decline %v", m, tc.want)
			}
			if s := within(t, done, "the server's fallback"); s == nil || s.Mode() != ModeFallback || s.Decline().Code != tc.want {
				t.Fatalf("server: %+v", s)
			}
		})
	}
}

// sendRaw posts b as one SEND on l, as a peer's LLC message of any length.
func sendRaw(t *testing.T, l *link, b []byte) {
	t.Helper()
	mr, err := l.pd.AllocMR(len(b), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mr.Close() })
	copy(mr.Bytes(), b)
	if !l.takeCredits(1) { // the completion gives it back (a WRITE of no connection)
		t.Fatal("link down")
	}
	wr := verbs.SendWR{ID: tagWrite << 56, Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: mr, Length: len(b)}}, Signaled: true}
	l.postMu.Lock()
	err = l.qp.PostSend(&wr)
	l.postMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
}

// TestVersion2LLCFromLinux: what Linux's server sends in a version-2 group and
// the engine's answers: an 88-byte ADD_LINK with its rkey list, rejected in 44
// bytes; a REQ_ADD_LINK, ignored; a message whose length field lies, counted as
// a protocol error; the link stays up through all of them.
func TestVersion2LLCFromLinux(t *testing.T) {
	e1, e2 := v2Engines(t, []string{"SMCR-A"}, []string{"SMCR-A"})
	c, s := connectWith(t, e1, e2, ClientOptions{Standard: true}, ServerOptions{})
	t.Cleanup(func() { c.Close(); s.Close() })
	mustSMC(t, c, s)
	ls := s.lnk

	add := &llc.AddLinkV2{AddLink: llc.AddLink{QPN: 99, Link: 2, MTU: 3, PSN: 7}, Ext: true, Direct: true,
		Rkeys: []llc.RkeyV2{{Rkey: 1, NewRkey: 2, NewAddr: 3}}}
	b, err := add.AppendBinary(nil)
	if err != nil || len(b) != 88 {
		t.Fatalf("%d bytes, %v", len(b), err)
	}
	ch := ls.register(pendKey{t: llc.TypeAddLink})
	sendRaw(t, ls, b)
	resp := within(t, ch, "the client's answer to ADD_LINK v2")
	var r llc.AddLink
	if err := r.Decode(resp[:]); err != nil || !r.Response() || r.Flags&llc.FlagAddLinkRejected == 0 {
		t.Fatalf("answer %+v, %v; want a rejection", r, err)
	}

	req, _ := (&llc.ReqAddLinkV2{GIDs: []llc.GID{{1}}}).AppendBinary(nil)
	sendRaw(t, ls, req)
	bad := make([]byte, llc.MsgLen)
	bad[0], bad[1], bad[3] = byte(llc.TypeTestLinkV2), 100, 0 // length 100 in 44 bytes
	sendRaw(t, ls, bad)
	eventually(t, "the lying message counted", func() bool { return e1.Stats().ProtoErrors == 1 })
	if err := c.lnk.testOnce(context.Background()); err != nil {
		t.Fatalf("link after the peer's messages: %v", err)
	}
	exchange(t, c, s, 64<<10)
	if n := e1.Stats().ProtoErrors; n != 1 {
		t.Fatalf("%d protocol errors, want the one", n)
	}
}

// TestVersion2MaxConns: release 2.1's max conns bounds the connections a
// server puts in a link group: the one past it makes a new group.
func TestVersion2MaxConns(t *testing.T) {
	defer func(o clc.V2Terms) { v2Offer = o }(v2Offer)
	v2Offer.MaxConns = clc.MinConnsPerLinkGroup
	e1, e2 := v2Engines(t, []string{"SMCR-A"}, []string{"SMCR-A"})
	for i := range clc.MinConnsPerLinkGroup + 1 {
		c, s := connectWith(t, e1, e2, ClientOptions{Standard: true}, ServerOptions{})
		t.Cleanup(func() { c.Close(); s.Close() })
		mustSMC(t, c, s)
		reused := i != 0 && i != clc.MinConnsPerLinkGroup
		if s.lg.v2.MaxConns != clc.MinConnsPerLinkGroup || s.reusedLG != reused {
			t.Fatalf("connection %d: terms %+v, reused %v", i, s.lg.v2, s.reusedLG)
		}
	}
	if n := e2.Stats().LinkGroups; n != 2 {
		t.Fatalf("%d link groups for %d connections, want 2", n, clc.MinConnsPerLinkGroup+1)
	}
}
