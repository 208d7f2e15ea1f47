// Beside a Linux SMC peer: programs on Linux's own AF_SMC sockets (net/smc, the
// kernel's SMC-R) talk to and from smcrd. Where Linux has no device it can use —
// soft-RoCE has only RoCE version-2 GIDs, Linux does SMC-R version 1 only with
// version-1 ones, and version 2 only with a User EID, which these hosts do not
// set — CLC ends in a Decline, and the bytes must go over TCP intact with the
// decline counted, never a connection closed on a Proposal Linux refused
// (docs/protocol.md, "Linux peers"). SMC-R version 2 against Linux is proven by
// test/vm's TestLinuxSMCv2OnSoftRoCE instead (package test/vm/linuxsmc): the
// VM kernel's rxe routes version 2 in the first network namespace only, and
// these hosts are network namespaces. The host's kernel may lack AF_SMC; the
// soft-RoCE VM's has it, and runs these with the rdma provider.

package e2e

import (
	"errors"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/control"
)

// requireAFSMC skips when the kernel has no AF_SMC (net/smc); Debian's kernel in
// the soft-RoCE VM has it.
func requireAFSMC(t *testing.T) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_SMC, unix.SOCK_STREAM, 0)
	if errors.Is(err, unix.EAFNOSUPPORT) {
		t.Skip("kernel lacks AF_SMC (CONFIG_SMC): the Linux-peer tests run in the soft-RoCE VM")
	}
	if err != nil {
		t.Fatalf("socket(AF_SMC): %v", err)
	}
	unix.Close(fd)
}

// linuxDecline finds the fallbacks a Linux peer's Decline caused.
func linuxDecline(s control.Stats) (control.FallbackCount, bool) {
	for _, f := range s.Fallbacks {
		if f.Side == control.SidePeer && f.Code != 0 {
			return f, true
		}
	}
	return control.FallbackCount{}, false
}

// TestLinuxSMCServer: smcrd's client side proposes to a server application on
// an AF_SMC socket. The SYN-ACK carries the SMC option without smcrd's SMCX one,
// so smcrd proposes what Linux accepts (a refused Proposal closes the
// connection): its rdma device alone, in a version-1 Proposal, which Linux
// declines here; with no rdma device, smcrd declines first. Either way the
// application's bytes go over TCP intact. With rdma the provider list puts shm
// first, so the Proposal names the rdma device though it is not the first.
func TestLinuxSMCServer(t *testing.T) {
	requireAFSMC(t)
	for _, p := range providers() {
		t.Run(p, func(t *testing.T) {
			a, b := hosts(t)
			conf := a.providerConf(p)
			if p == "rdma" {
				conf[0] = "providers = shm,rdma"
			}
			a.start(append(conf, ports)...)
			b.background(bins.testapp, "-listen", ":5201", "-smc")
			b.background(bins.testapp, "-listen", "[::]:5202", "-smc")
			b.waitListening(5201)
			b.waitListening(5202)
			for _, tc := range []struct{ dst, client netip.AddrPort }{
				{netip.AddrPortFrom(b.ns.Addr4(), 5201), netip.AddrPortFrom(a.ns.Addr4(), 0)},
				{netip.AddrPortFrom(b.ns.Addr6(), 5202), netip.AddrPortFrom(a.ns.Addr6(), 0)},
			} {
				r, err := a.client(tc.dst.String(), "-mode", "sink", "-bytes", "1000000")
				if err != nil || r.OK != 1 {
					t.Fatalf("sink to Linux's AF_SMC server %s: %+v: %v\nsmcrd log:\n%s", tc.dst, r, err, a.logText())
				}
				if ap, _ := netip.ParseAddrPort(r.Peers[0]); ap.Addr().Unmap() != tc.client.Addr() {
					t.Errorf("server saw %s, want %s", r.Peers[0], tc.client.Addr())
				}
			}
			s := a.stats()
			if s.Connections.Handled != 2 || s.Connections.Fallback != 2 {
				t.Fatalf("connections %+v, fallbacks %+v\nsmcrd log:\n%s", s.Connections, s.Fallbacks, a.logText())
			}
			f, declined := linuxDecline(s)
			switch {
			case p == "rdma" && !declined:
				t.Fatalf("smcrd did not record Linux's decline: %+v\nsmcrd log:\n%s", s.Fallbacks, a.logText())
			case p != "rdma" && (len(s.Fallbacks) != 1 || s.Fallbacks[0].Side != control.SideLocal):
				t.Fatalf("no rdma device: want smcrd's own decline, got %+v", s.Fallbacks)
			}
			t.Logf("fallback: %+v (Linux's: %v, %#08x)", s.Fallbacks, declined, f.Code)
		})
	}
}

// TestLinuxSMCClient: a client application on an AF_SMC socket connects to a
// server behind smcrd. Linux's SYN carries the SMC option, so smcrd's steering
// takes the connection and runs CLC as the server; Linux declines (no device
// it can use) and smcrd carries the bytes over TCP, counting the decline. IPv4
// and IPv6.
func TestLinuxSMCClient(t *testing.T) {
	requireAFSMC(t)
	p := providers()[0]
	a, b := hosts(t)
	b.start(append(b.providerConf(p), ports)...)
	b.serve(5201)
	for _, tc := range []struct{ dst, client netip.Addr }{{b.ns.Addr4(), a.ns.Addr4()}, {b.ns.Addr6(), a.ns.Addr6()}} {
		dst := netip.AddrPortFrom(tc.dst, 5201).String()
		r, err := a.client(dst, "-smc", "-mode", "sink", "-bytes", "1000000")
		if err != nil || r.OK != 1 {
			t.Fatalf("sink from Linux's AF_SMC client to %s: %+v: %v\nsmcrd log:\n%s", dst, r, err, b.logText())
		}
		if ap, _ := netip.ParseAddrPort(r.Peers[0]); ap.Addr().Unmap() != tc.client {
			t.Errorf("server saw %s, want %s", r.Peers[0], tc.client)
		}
		r, err = a.client(dst, "-smc", "-mode", "echo", "-bytes", "1000000", "-conns", "4")
		if err != nil || r.OK != 4 {
			t.Fatalf("echo from Linux's AF_SMC client to %s: %+v: %v", dst, r, err)
		}
	}
	s := b.stats()
	f, ok := linuxDecline(s)
	if s.Connections.Handled != 10 || s.Connections.Fallback != 10 || !ok || f.Count != 10 {
		t.Fatalf("smcrd did not take the connections and record Linux's declines: %+v, fallbacks %+v\nsmcrd log:\n%s",
			s.Connections, s.Fallbacks, b.logText())
	}
	t.Logf("Linux declined: %#08x (%s) ×%d", f.Code, f.Reason, f.Count)
}
