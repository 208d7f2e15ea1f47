// Profiles: with Options.ProfileDir, each peer process writes pprof profiles of
// its own work, one set per client job, so a figure can be traced to where its
// time went (CPU, and where goroutines waited on mutexes or blocked).

package bench

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sync"
	"syscall"
)

// A client profiles each job itself and has its server do the same: SIGUSR1
// ends the server's profile and starts its next, so the server's nth profile
// runs from the start of the client's nth job to the start of the next (or the
// server's end). One signal, not a start and a stop: a busy server may take two
// different pending signals in either order. The server's nth is the client's
// nth job:
//
//	<transport>-client-<server pid>-<n>-<job>.{cpu,mutex,block}.pprof
//	<transport>-server-<server pid>-<n>.{cpu,mutex,block}.pprof
//
// Mutex and block profiles are cumulative over the process: compare a job's
// with the previous one's (go tool pprof -base).
type profiler struct {
	dir, prefix string
	n           int
	cpu         *os.File
}

func newProfiler(spec peerSpec) *profiler {
	if spec.ProfileDir == "" {
		return nil
	}
	runtime.SetMutexProfileFraction(5)
	runtime.SetBlockProfileRate(10_000) // one sample per 10 µs blocked
	return &profiler{dir: spec.ProfileDir}
}

// start begins profile n+1, named name-n-suffix; it logs and goes on without a
// profile on error, as a benchmark's figures matter more than its profiles.
func (p *profiler) start(name, suffix string) {
	p.n++
	p.prefix = filepath.Join(p.dir, fmt.Sprintf("%s-%d%s", name, p.n, suffix))
	f, err := os.Create(p.prefix + ".cpu.pprof")
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: profile:", err)
		return
	}
	p.cpu = f
}

func (p *profiler) stop() {
	if p == nil || p.cpu == nil {
		return
	}
	pprof.StopCPUProfile()
	p.cpu.Close()
	p.cpu = nil
	for _, kind := range []string{"mutex", "block"} {
		f, err := os.Create(p.prefix + "." + kind + ".pprof")
		if err == nil {
			err = pprof.Lookup(kind).WriteTo(f, 0)
			f.Close()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: profile:", err)
		}
	}
}

// serveProfiles makes a server profile on its client's signals; the returned
// function ends the last one (the server calls it as it stops).
func serveProfiles(spec peerSpec) (stop func()) {
	p := newProfiler(spec)
	if p == nil {
		return func() {}
	}
	var mu sync.Mutex
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGUSR1)
	name := fmt.Sprintf("%s-server-%d", spec.Transport, os.Getpid())
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-sig:
				mu.Lock()
				p.stop()
				p.start(name, "")
				mu.Unlock()
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(sig)
		close(done)
		mu.Lock()
		p.stop()
		mu.Unlock()
	}
}

// jobProfile profiles one client job here, and has the server (the first of
// spec.PeerPIDs) begin its next profile; the returned function ends the
// client's.
func (p *profiler) jobProfile(spec peerSpec, j job) func() {
	if p == nil || len(spec.PeerPIDs) == 0 {
		return func() {}
	}
	srv := spec.PeerPIDs[0]
	syscall.Kill(srv, syscall.SIGUSR1)
	p.start(fmt.Sprintf("%s-client-%d", spec.Transport, srv), "-"+jobName(j))
	return p.stop
}

// jobName names j's profiles: its kind and its size or connections.
func jobName(j job) string {
	switch {
	case j.Kind == "scale":
		return fmt.Sprintf("scale-%dconns", j.Size)
	case j.Size == 0:
		return j.Kind
	}
	return j.Kind + "-" + byteName(j.Size)
}
