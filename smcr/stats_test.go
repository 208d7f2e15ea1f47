package smcr

import (
	"maps"
	"sync"
	"testing"

	"github.com/smcr-io/smcr/smcr/clc"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// TestResetLosesNothing: counts made while the counters are being read and reset
// land either in what a reset returned or in what follows it.
func TestResetLosesNothing(t *testing.T) {
	var s stats
	const writers, each = 4, 20000
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				s.txBytes.Add(1)
				s.txReq.observe(100)
				s.countFallback(DeclineTimeoutCLC, SideLocal)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	var bytes, reqs, fallbacks uint64
	add := func(st Stats) {
		bytes += st.TxBytes
		for _, n := range st.TxReqSizes {
			reqs += n
		}
		for _, n := range st.Fallback {
			fallbacks += n
		}
	}
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		add(s.take(true))
	}
	add(s.take(false))
	if want := uint64(writers * each); bytes != want || reqs != want || fallbacks != want {
		t.Fatalf("counted %d bytes, %d requests, %d fallbacks across the resets; want %d of each", bytes, reqs, fallbacks, want)
	}
}

// TestFallbackCodesBounded: the codes a peer picks for its Declines cannot grow
// the fallback counts (and smcrd's metrics series) without bound: unknown ones
// are counted by class.
func TestFallbackCodesBounded(t *testing.T) {
	var s stats
	for i := range 500 {
		s.countFallback(DeclineCode(0x7f000000|uint32(i)), SidePeer)
	}
	s.countFallback(clc.DeclineNoMemory, SidePeer)
	s.countFallback(DeclineTimeoutCLC, SideLocal)
	got := s.take(false).Fallback
	want := map[FallbackKey]uint64{
		{0x7f000000, SidePeer}:          500,
		{clc.DeclineNoMemory, SidePeer}: 1,
		{DeclineTimeoutCLC, SideLocal}:  1,
	}
	if !maps.Equal(got, want) {
		t.Errorf("fallback counts %v, want %v", got, want)
	}
}

// TestStatsByRole: the counters say which connections the engine made and
// which it served, as smc-tools' smcr stats does: an SMC-R connection and a
// fallback, counted on each side in its own role.
func TestStatsByRole(t *testing.T) {
	p := newPair(t, Config{Devices: memDevices(t, verbs.KindSoft)}, Config{Devices: memDevices(t, verbs.KindSoft)})
	c, s := p.connect(t)
	mustSMC(t, c, s)
	if cli, srv := p.cli.Stats(), p.srv.Stats(); cli.Server != (RoleStats{}) || srv.Server != (RoleStats{Handled: 1, SMC: 1}) {
		t.Errorf("SMC-R: the client's engine counts %+v served, the server's %+v; want none and 1 handled, 1 SMC-R", cli.Server, srv.Server)
	}
	fb := newPair(t, Config{}, Config{Devices: memDevices(t, verbs.KindSoft)}) // the client has no device
	fb.connect(t)
	eventually(t, "the server's fallback counted", func() bool { return fb.srv.Stats().Server == RoleStats{Handled: 1, Fallback: 1} })
	if cli := fb.cli.Stats(); cli.Server != (RoleStats{}) || cli.Handled != 1 {
		t.Errorf("fallback: the client's engine counts %+v served of %d handled, want none of 1", cli.Server, cli.Handled)
	}
}
