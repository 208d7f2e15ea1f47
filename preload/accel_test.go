package preload

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/smcr-io/smcr/daemon"
)

// fakeSmcrd starts daemon.NewDirectServer: every connection decided SMC-R, its
// bytes carried over its own TCP connection.
func fakeSmcrd(t *testing.T) string {
	t.Helper()
	path, _ := fakeSmcrdWith(t, daemon.DirectOptions{})
	return path
}

func fakeSmcrdWith(t *testing.T, opts daemon.DirectOptions) (string, *daemon.DirectServer) {
	t.Helper()
	opts.Path = filepath.Join(t.TempDir(), "direct.sock")
	path := opts.Path
	s, err := daemon.NewDirectServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				s.Beat()
			}
		}
	}()
	t.Cleanup(func() {
		close(done)
		s.Close()
	})
	return path, s
}

// TestAccelerated: with every connection accelerated, programs see what they
// see of the kernel's sockets.
func TestAccelerated(t *testing.T) {
	build(t)
	sock := fakeSmcrd(t)
	for _, m := range []mode{
		{name: "smcr", lib: "libsmcr-preload.so", socket: sock},
		{name: "smcr-ubsan", lib: "libsmcr-preload-ubsan.so", socket: sock},
		{name: "smcr-asan", lib: "libsmcr-preload-asan.so", socket: sock},
	} {
		t.Run(m.name, func(t *testing.T) {
			compareReady(t, m, true)
			echoAll(t, m, true)
		})
	}
}

// TestFork: a connection shared by fork goes on in the child after the parent
// closed its copy, and ends with the child's close (fork.c); a child waits with
// epoll and poll on a connection it inherited and one of its own, woken through
// the parent's process eventfd and its own (forkwait.c).
func TestFork(t *testing.T) {
	build(t)
	sock := fakeSmcrd(t)
	for _, prog := range []string{"fork", "forkwait"} {
		for _, m := range []mode{{name: "kernel"}, {name: "smcr", lib: "libsmcr-preload.so", socket: sock},
			{name: "smcr-asan", lib: "libsmcr-preload-asan.so", socket: sock}} {
			out, errOut, err := run(t, m, prog)
			if err != nil || out != "ok\n" {
				t.Errorf("%s %s: %v\nstdout: %s\nstderr: %s", prog, m.name, err, out, errOut)
			}
		}
	}
}

// TestManyConnections: one epoll loop (edge- and level-triggered, and a set
// inside another set) over many
// accelerated connections at once, content checked by hash.
func TestManyConnections(t *testing.T) {
	build(t)
	sock := fakeSmcrd(t)
	for _, trig := range []string{"et", "lt", "nested"} {
		for _, m := range []mode{{name: "kernel"}, {name: "smcr", lib: "libsmcr-preload.so", socket: sock}} {
			out, errOut, err := run(t, m, "multi", trig, "40", "300000")
			if err != nil || out != "ok 40\n" {
				t.Errorf("multi %s %s: %v\nstdout: %s\nstderr: %s", trig, m.name, err, out, errOut)
				continue
			}
			want := "accelerated 0\n"
			if m.lib != "" {
				want = "accelerated 40\n"
			}
			if errOut != want {
				t.Errorf("multi %s %s: %q, want %q", trig, m.name, errOut, want)
			}
		}
	}
}

// TestOneEventfdPerProcess: an epoll set over a thousand accelerated
// connections holds one eventfd for all of them in the kernel (the process's,
// beside the set's own wake-up eventfd), not one per connection; through
// smcrd's pumps and library to library.
func TestOneEventfdPerProcess(t *testing.T) {
	build(t)
	const conns = "1000"
	pumped, _ := fakeSmcrdWith(t, daemon.DirectOptions{})
	sameHost, _ := fakeSmcrdWith(t, daemon.DirectOptions{SameHost: true})
	for _, c := range []struct {
		m    mode
		want int
	}{
		{mode{name: "kernel"}, 0},
		{mode{name: "smcr", lib: "libsmcr-preload.so", socket: pumped}, 2},
		{mode{name: "shm", lib: "libsmcr-preload.so", socket: sameHost}, 2},
	} {
		out, errOut, err := run(t, c.m, "epollfds", conns)
		var ok, inSet, all int
		if _, perr := fmt.Sscanf(out, "ok %d\nset-eventfds %d\neventfds %d\n", &ok, &inSet, &all); err != nil || perr != nil || ok != 1000 {
			t.Errorf("%s: %v\nstdout: %s\nstderr: %s", c.m.name, err, out, errOut)
			continue
		}
		if inSet != c.want {
			t.Errorf("%s: the epoll set holds %d eventfds, want %d", c.m.name, inSet, c.want)
		}
		t.Logf("%s: %d eventfds in the set, %d in the process", c.m.name, inSet, all)
	}
}

// TestEpollWake: a thread asleep in epoll_wait wakes for a socket another
// thread adds or modifies, whether it waits in the kernel (the set was empty)
// or in the library's wait (the set has an accelerated member), as without the
// library.
func TestEpollWake(t *testing.T) {
	build(t)
	sock := fakeSmcrd(t)
	const want = "empty-set 1 42 prompt\nmodified 1 43 prompt\nadded-back 1 44 prompt\nok\n"
	for _, c := range []struct {
		m     mode
		accel string
	}{
		{mode{name: "kernel"}, "accelerated 0\n"},
		{mode{name: "smcr", lib: "libsmcr-preload.so", socket: sock}, "accelerated 4\n"},
		{mode{name: "smcr-asan", lib: "libsmcr-preload-asan.so", socket: sock}, "accelerated 4\n"},
	} {
		out, errOut, err := run(t, c.m, "epollwake")
		if err != nil || out != want || errOut != c.accel {
			t.Errorf("%s: %v\nstdout: %q, want %q\nstderr: %q, want %q", c.m.name, err, out, want, errOut, c.accel)
		}
	}
}

// TestSameHost: both ends libraries of one server's, decided SMCR_MODE_SHM: each
// library writes into the other's receive ring. The echo matrix and the epoll loop
// over many connections, as with smcrd's pumps. (Not fork.c: its one thread
// accepts only after its connect returned, and the stand-in for CLC needs both
// ends at once.)
func TestSameHost(t *testing.T) {
	build(t)
	sock, s := fakeSmcrdWith(t, daemon.DirectOptions{SameHost: true})
	for _, m := range []mode{
		{name: "shm", lib: "libsmcr-preload.so", socket: sock},
		{name: "shm-asan", lib: "libsmcr-preload-asan.so", socket: sock},
	} {
		t.Run(m.name, func(t *testing.T) {
			before := s.Bypassed()
			echoAll(t, m, true)
			for _, trig := range []string{"et", "lt", "nested"} {
				out, errOut, err := run(t, m, "multi", trig, "40", "300000")
				if err != nil || out != "ok 40\n" || errOut != "accelerated 40\n" {
					t.Errorf("multi %s: %v\nstdout: %s\nstderr: %s", trig, err, out, errOut)
				}
			}
			if s.Bypassed() == before {
				t.Errorf("no connection went library to library")
			}
		})
	}
}

// TestExec: connections live on across exec (execv, execvp, execl) into an image
// with the library: the new image adopts them, accelerated, with the bytes the
// old one left unread, and both directions and the close go on. Into an image
// without the library they end with a reset.
func TestExec(t *testing.T) {
	build(t)
	sock := fakeSmcrd(t)
	for _, m := range []mode{{name: "kernel"}, {name: "smcr", lib: "libsmcr-preload.so", socket: sock},
		{name: "smcr-asan", lib: "libsmcr-preload-asan.so", socket: sock},
		{name: "smcr-ubsan", lib: "libsmcr-preload-ubsan.so", socket: sock}} {
		for _, call := range []string{"execv", "execvp", "execl", "closefrom", "close_range"} {
			out, errOut, err := run(t, m, "exec", call)
			want := "accelerated 0\n"
			if m.lib != "" {
				want = "accelerated 2\n"
			}
			if err != nil || out != "ok\n" || errOut != want {
				t.Errorf("exec %s %s: %v\nstdout: %s\nstderr: %s (want %q)", call, m.name, err, out, errOut, want)
			}
		}
		// Into an image without the library: the kernel's connection goes
		// on; an accelerated one is reset (smcrd resets the socket itself),
		// never a wait on a TCP connection that carries nothing.
		want := "noenv reset\n"
		if m.lib == "" {
			want = "noenv data\n"
		}
		if out, errOut, err := run(t, m, "exec", "execve-noenv"); err != nil || out != want {
			t.Errorf("exec execve-noenv %s: %v\nstdout: %q, want %q\nstderr: %s", m.name, err, out, want, errOut)
		}
	}
}

// TestAbort: a close with SO_LINGER {1, 0}, or with received bytes left unread,
// reaches the peer as a reset, as the kernel's does; a close after reading all
// stays a clean end. Through smcrd's pumps and library to library (shm).
func TestAbort(t *testing.T) {
	build(t)
	sock := fakeSmcrd(t)
	shmSock, _ := fakeSmcrdWith(t, daemon.DirectOptions{SameHost: true})
	const want = "linger -1 Connection reset by peer\nunread -1 Connection reset by peer\nclean 0 \n"
	for _, m := range []mode{{name: "kernel"}, {name: "smcr", lib: "libsmcr-preload.so", socket: sock},
		{name: "smcr-asan", lib: "libsmcr-preload-asan.so", socket: sock},
		{name: "shm", lib: "libsmcr-preload.so", socket: shmSock}} {
		out, errOut, err := run(t, m, "abort")
		accel := "accelerated 0\n"
		if m.lib != "" {
			accel = "accelerated 6\n"
		}
		if err != nil || out != want+accel {
			t.Errorf("abort %s: %v\nstdout: %s\nwant: %s\nstderr: %s", m.name, err, out, want+accel, errOut)
		}
	}
}

// TestPolicyExcludes: the library offers smcrd no connection that the policy
// page excludes by local address (ip_addr_list) or by memory (max_memory
// reached): those stay the kernel's, with no round trip to smcrd; listed, the
// same connections are accelerated.
func TestPolicyExcludes(t *testing.T) {
	build(t)
	for _, c := range []struct {
		name  string
		opts  daemon.DirectOptions
		accel string
	}{
		{"other-address", daemon.DirectOptions{Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.7")}}, "accelerated 0\n"},
		{"loopback-listed", daemon.DirectOptions{Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("127.0.0.1")}}, "accelerated 4\n"},
		{"memory-full", daemon.DirectOptions{Memory: func() (int64, int64) { return 256 << 20, 256 << 20 }}, "accelerated 0\n"},
		{"memory-left", daemon.DirectOptions{Memory: func() (int64, int64) { return 1 << 20, 256 << 20 }}, "accelerated 4\n"},
	} {
		sock, _ := fakeSmcrdWith(t, c.opts)
		out, errOut, err := run(t, mode{name: c.name, lib: "libsmcr-preload.so", socket: sock}, "multi", "lt", "4", "100000")
		if err != nil || out != "ok 4\n" || errOut != c.accel {
			t.Errorf("%s: %v\nstdout: %s\nstderr: %s (want %q)", c.name, err, out, errOut, c.accel)
		}
	}
}

// releaseServers are the two test servers a released connection goes through:
// the pumps' and the same-host stand-in's, with the releases each should have
// counted so far.
type releaseServers struct {
	pumped, sameHost string
	srv, shm         *daemon.DirectServer
	want, wantShm    uint64
}

func newReleaseServers(t *testing.T) *releaseServers {
	r := &releaseServers{}
	r.pumped, r.srv = fakeSmcrdWith(t, daemon.DirectOptions{})
	r.sameHost, r.shm = fakeSmcrdWith(t, daemon.DirectOptions{SameHost: true})
	return r
}

// check counts n releases more for m's server, and compares both servers'
// counts with theirs.
func (r *releaseServers) check(t *testing.T, m mode, n uint64, what string) {
	t.Helper()
	switch m.socket {
	case r.pumped:
		r.want += n
	case r.sameHost:
		r.wantShm += n
	}
	if got := r.srv.Released(); got != r.want {
		t.Errorf("%s %s: the test server released %d connections, want %d", what, m.name, got, r.want)
	}
	if got := r.shm.Released(); got != r.wantShm {
		t.Errorf("%s %s: the same-host test server released %d connections, want %d", what, m.name, got, r.wantShm)
	}
}

// TestPassFd: an accelerated socket sent to a process that knows nothing of
// it (SCM_RIGHTS), its sender closing its copy. With the kernel's sockets the
// bytes go on; with the library's the connection is handed back to the kernel
// socket before it goes (SMCR_LIB_RELEASE), so that the receiver reads the
// bytes sent after the pass and its answer reaches the client, as the test
// server releases (its pumps read and write the socket itself). The same-host
// stand-in (SMCR_MODE_SHM), whose bytes never travel on the TCP connection,
// releases too: its smcrd asks the peer's, which stops the peer library's
// writes into the passed end's ring and resends over TCP what the program left
// in it, and the peer library reads the rest of its own ring first. With
// "unread", each end leaves bytes unread in the other's ring at the pass
// (the pumps, which took the bytes off the socket, cannot release those).
func TestPassFd(t *testing.T) {
	build(t)
	r := newReleaseServers(t)
	pumped, sameHost := r.pumped, r.sameHost
	for _, c := range []struct {
		m    mode
		args []string
	}{
		{mode{name: "kernel"}, nil},
		{mode{name: "kernel"}, []string{"unread"}},
		{mode{name: "smcr", lib: "libsmcr-preload.so", socket: pumped}, nil},
		{mode{name: "smcr-asan", lib: "libsmcr-preload-asan.so", socket: pumped}, nil},
		{mode{name: "shm", lib: "libsmcr-preload.so", socket: sameHost}, nil},
		{mode{name: "shm", lib: "libsmcr-preload.so", socket: sameHost}, []string{"unread"}},
		{mode{name: "shm-asan", lib: "libsmcr-preload-asan.so", socket: sameHost}, []string{"unread"}},
		// passed with sendmmsg
		{mode{name: "kernel"}, []string{"mmsg"}},
		{mode{name: "smcr", lib: "libsmcr-preload.so", socket: pumped}, []string{"mmsg"}},
		{mode{name: "shm", lib: "libsmcr-preload.so", socket: sameHost}, []string{"mmsg"}},
	} {
		const want = "receiver data\nclient data\n"
		if out, errOut, err := run(t, c.m, "passfd", c.args...); err != nil || out != want {
			t.Errorf("passfd %s %v: %v\nstdout: %q, want %q\nstderr: %s", c.m.name, c.args, err, out, want, errOut)
		}
		r.check(t, c.m, 1, "passfd")
	}
}

// TestUring: a process that makes an io_uring instance (io_uring_setup through
// libc's syscall) has its accelerated connections released to their sockets
// first, as the test server releases them, so that reads and writes around the
// library carry the rest of the stream; it accelerates no new connection (the
// accepted end of one is released as soon as decided).
func TestUring(t *testing.T) {
	build(t)
	sock, srv := fakeSmcrdWith(t, daemon.DirectOptions{})
	var released uint64
	for _, c := range []struct {
		m     mode
		accel string
	}{
		{mode{name: "kernel"}, "accelerated 0 0 0\n"},
		{mode{name: "smcr", lib: "libsmcr-preload.so", socket: sock}, "accelerated 2 0 0\n"},
		{mode{name: "smcr-asan", lib: "libsmcr-preload-asan.so", socket: sock}, "accelerated 2 0 0\n"},
	} {
		out, errOut, err := run(t, c.m, "uring")
		if err != nil || out != "ok\n" || errOut != c.accel {
			t.Errorf("uring %s: %v\nstdout: %q\nstderr: %q, want %q", c.m.name, err, out, errOut, c.accel)
		}
		if c.m.lib != "" {
			// both ends of the first connection, and the server's end of
			// the new one: its listener, registered before, still has it
			// decided, then released at once
			released += 3
		}
		if got := srv.Released(); got != released {
			t.Errorf("uring %s: the test server released %d connections, want %d", c.m.name, got, released)
		}
	}
}

// TestSpawn: a child started with posix_spawn, posix_spawnp, system or popen
// (glibc's own clone and execve, which the library does not see) gets an
// accelerated socket. Where the child's image has the library and every fd behind
// the connection reaches it, the connection goes with it, shared, as across fork
// and exec; otherwise (no library, the file actions close the library's fds,
// popen) it is released to its socket first. Either way the child reads what the
// parent sent after the spawn, and its answer and its end reach the parent.
func TestSpawn(t *testing.T) {
	build(t)
	r := newReleaseServers(t)
	pumped, sameHost := r.pumped, r.sameHost
	for _, m := range []mode{{name: "kernel"}, {name: "smcr", lib: "libsmcr-preload.so", socket: pumped},
		{name: "smcr-asan", lib: "libsmcr-preload-asan.so", socket: pumped},
		{name: "smcr-ubsan", lib: "libsmcr-preload-ubsan.so", socket: pumped},
		{name: "shm", lib: "libsmcr-preload.so", socket: sameHost}} {
		for _, c := range []struct {
			how      string
			goesWith bool
		}{{"spawn", true}, {"system", true}, {"spawnp-noenv", false}, {"closefrom", false}, {"popen", false}} {
			want := "accel 0\nok\n"
			if m.lib != "" && c.goesWith {
				want = "accel 1\nok\n"
			}
			out, errOut, err := run(t, m, "spawn", c.how)
			if err != nil || out != want {
				t.Errorf("spawn %s %s: %v\nstdout: %q, want %q\nstderr: %s", c.how, m.name, err, out, want, errOut)
			}
			var n uint64
			if !c.goesWith {
				n = 1
			}
			r.check(t, m, n, "spawn "+c.how)
		}
	}
}

// TestSharedRelease: a connection shared by fork is released (its socket sent
// away with SCM_RIGHTS) by one process while the other streams into it, eight
// times. The release waits for the copies under way in both processes and the
// writer follows it to the kernel socket: the reader gets every word once, in
// order.
func TestSharedRelease(t *testing.T) {
	build(t)
	r := newReleaseServers(t)
	pumped, sameHost := r.pumped, r.sameHost
	for _, m := range []mode{{name: "kernel"}, {name: "smcr", lib: "libsmcr-preload.so", socket: pumped},
		{name: "smcr-asan", lib: "libsmcr-preload-asan.so", socket: pumped},
		{name: "shm", lib: "libsmcr-preload.so", socket: sameHost}} {
		const want = "ok 33554432\n" // 8 connections of 16 MiB, in 4-byte words
		if out, errOut, err := run(t, m, "sharedrelease"); err != nil || out != want {
			t.Errorf("sharedrelease %s: %v\nstdout: %q, want %q\nstderr: %s", m.name, err, out, want, errOut)
		}
		r.check(t, m, 8, "sharedrelease")
	}
}

// TestVfork: a vfork'd child that closes its fds, in its parent's memory,
// leaves the parent's accelerated connection known to the parent's library.
func TestVfork(t *testing.T) {
	build(t)
	sock := fakeSmcrd(t)
	for _, c := range []struct {
		m     mode
		accel string
	}{
		{mode{name: "kernel"}, "accelerated 0 0\n"},
		{mode{name: "smcr", lib: "libsmcr-preload.so", socket: sock}, "accelerated 2 2\n"},
		{mode{name: "smcr-asan", lib: "libsmcr-preload-asan.so", socket: sock}, "accelerated 2 2\n"},
	} {
		if out, errOut, err := run(t, c.m, "vfork"); err != nil || out != "ok\n" || errOut != c.accel {
			t.Errorf("vfork %s: %v\nstdout: %q\nstderr: %q, want %q", c.m.name, err, out, errOut, c.accel)
		}
	}
}

// TestRingFiles: with the rings in a file of their own (SMCR_RING_FILES, the
// receive ring at its start, the send ring a page-rounded offset in), as smcrd
// passes the engine's buffers, the library maps them where the area says:
// bytes both ways, many connections in one epoll loop, and an exec's new image
// adopting them.
func TestRingFiles(t *testing.T) {
	build(t)
	sock, _ := fakeSmcrdWith(t, daemon.DirectOptions{RingFiles: true})
	for _, m := range []mode{
		{name: "smcr", lib: "libsmcr-preload.so", socket: sock},
		{name: "smcr-asan", lib: "libsmcr-preload-asan.so", socket: sock},
	} {
		t.Run(m.name, func(t *testing.T) {
			echoAll(t, m, true)
			if out, errOut, err := run(t, m, "multi", "et", "20", "300000"); err != nil || out != "ok 20\n" || errOut != "accelerated 20\n" {
				t.Errorf("multi: %v\nstdout: %s\nstderr: %s", err, out, errOut)
			}
			// The ring files cross an exec too, also after a closefrom or
			// close_range (the library keeps every fd a connection holds).
			for _, call := range []string{"execv", "closefrom", "close_range"} {
				if out, errOut, err := run(t, m, "exec", call); err != nil || out != "ok\n" || errOut != "accelerated 2\n" {
					t.Errorf("exec %s: %v\nstdout: %s\nstderr: %s", call, err, out, errOut)
				}
			}
		})
	}
}

// TestUrgentData: TCP urgent data (MSG_OOB) on accelerated sockets is what the
// kernel's is (oob.c's transcript: send and recv with MSG_OOB, reads that stop
// at the mark, SO_OOBINLINE, SIOCATMARK, POLLPRI, select's exceptfds,
// EPOLLPRI, FIONREAD), through smcrd's pumps over TCP (the mark is the
// kernel's there), with the rings in files of their own, and library to
// library on the same host (the library writes the peer's rx_urg itself).
func TestUrgentData(t *testing.T) {
	build(t)
	want, errOut, err := run(t, mode{name: "kernel"}, "oob")
	if err != nil {
		t.Fatalf("oob without the library: %v\n%s%s", err, want, errOut)
	}
	pumped, _ := fakeSmcrdWith(t, daemon.DirectOptions{})
	files, _ := fakeSmcrdWith(t, daemon.DirectOptions{RingFiles: true})
	sameHost, _ := fakeSmcrdWith(t, daemon.DirectOptions{SameHost: true})
	for _, m := range []mode{
		{name: "smcr", lib: "libsmcr-preload.so", socket: pumped},
		{name: "smcr-ubsan", lib: "libsmcr-preload-ubsan.so", socket: pumped},
		{name: "smcr-asan", lib: "libsmcr-preload-asan.so", socket: pumped},
		{name: "ring-files", lib: "libsmcr-preload.so", socket: files},
		{name: "shm", lib: "libsmcr-preload.so", socket: sameHost},
		{name: "shm-asan", lib: "libsmcr-preload-asan.so", socket: sameHost},
	} {
		t.Run(m.name, func(t *testing.T) {
			got, errOut, err := run(t, m, "oob")
			if err != nil {
				t.Fatalf("oob: %v\nstdout:\n%s\nstderr:\n%s", err, got, errOut)
			}
			if got != want {
				t.Errorf("transcript differs from the kernel's\n%s", diff(want, got))
			}
			for _, who := range []string{"client", "server"} {
				if !strings.Contains(errOut, who+" accel=1") {
					t.Errorf("%s not accelerated (stderr: %q)", who, errOut)
				}
			}
		})
	}
}

// TestUrgentPartialSend: a non-blocking send with MSG_OOB that the ring cannot
// take whole marks the last byte it took, as the kernel's (oobfull.c), through
// smcrd's pumps and library to library.
func TestUrgentPartialSend(t *testing.T) {
	build(t)
	pumped, _ := fakeSmcrdWith(t, daemon.DirectOptions{})
	sameHost, _ := fakeSmcrdWith(t, daemon.DirectOptions{SameHost: true})
	for _, m := range []mode{
		{name: "kernel"},
		{name: "smcr", lib: "libsmcr-preload.so", socket: pumped},
		{name: "shm", lib: "libsmcr-preload.so", socket: sameHost},
	} {
		t.Run(m.name, func(t *testing.T) {
			out, errOut, err := run(t, m, "oobfull")
			if err != nil || out != "ok\n" {
				t.Fatalf("oobfull: %v\nstdout: %s\nstderr: %s", err, out, errOut)
			}
			if accel := strings.Count(errOut, "accel=1"); accel != map[bool]int{true: 2}[m.lib != ""] {
				t.Errorf("%d ends accelerated (stderr: %q)", accel, errOut)
			}
		})
	}
}
