// Urgent data (MSG_OOB) in the direct mode: programs with the library on both
// hosts send and read it as on kernel sockets, through real smcrds.

package e2e

import (
	"testing"
	"time"
)

// TestDirectUrgentData: an urgent byte each way between two programs with the
// library (testdata/direct_urgent.py) arrives as urgent data at its place:
// the reads stop at the mark, recv(MSG_OOB) takes it, the stream goes on
// without it, and the socket's owner had SIGURG; over shm library to library
// (the library writes the peer's mark and signals its owner), over soft
// through smcrd's pumps and the CDC's urgent flag (smcrd signals). And after
// a CLC fallback, where the kernel carries it: the sockets get back the
// program's SO_OOBINLINE, which smcrd's engine had changed.
func TestDirectUrgentData(t *testing.T) {
	requirePython(t)
	eachProvider(t, func(t *testing.T, p string) {
		a, b := directHosts(t, p)
		urgentPrograms(t, a, b)
		wantDirect(t, a, 1)
		wantDirect(t, b, 1)
	})
	t.Run("clc-fallback", func(t *testing.T) {
		a, b := hosts(t)
		startWith(a, "shm")
		startWith(b, "soft") // no provider in common: a Decline
		urgentPrograms(t, a, b)
		for _, h := range []*host{a, b} {
			if st := h.stats(); st.Direct.TCP != 1 || st.Direct.SMCR != 0 {
				t.Errorf("smcrd %s: direct %+v, want one plain TCP", h.name, st.Direct)
			}
		}
	})
}

// urgentPrograms runs direct_urgent.py with the library, the client on a and
// the server on b, and fails the test unless both say ok.
func urgentPrograms(t *testing.T, a, b *host) {
	t.Helper()
	srv := b.startProc(true, "python3", "testdata/direct_urgent.py", "-", "5201")
	b.waitListening(5201)
	cli := a.startProc(true, "python3", "testdata/direct_urgent.py", "198.18.0.2", "5201")
	for _, pr := range []struct {
		who string
		p   *proc
	}{{"client", cli}, {"server", srv}} {
		if !pr.p.wait(30 * time.Second) {
			t.Fatalf("%s still runs after 30s: %s%s", pr.who, pr.p.out(), pr.p.errOut())
		}
		if pr.p.err != nil || pr.p.out() != "ok\n" {
			t.Errorf("%s: %v: %s%s", pr.who, pr.p.err, pr.p.out(), pr.p.errOut())
		}
	}
}
