// The machine a report was measured on: figures from these noisy VMs mean
// something only beside the CPU, core count, kernel and Go version that made them.

package bench

import (
	"bufio"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Machine describes where a report was made.
type Machine struct {
	CPU      string // model name from /proc/cpuinfo
	Cores    int    // logical CPUs this process may use
	Kernel   string // uname release
	Go       string
	OS, Arch string
	MemTotal string // from /proc/meminfo
}

// Describe returns this machine's description; fields it cannot read are empty.
func Describe() Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	m.CPU = procField("/proc/cpuinfo", "model name")
	m.MemTotal = procField("/proc/meminfo", "MemTotal")
	return m
}

// procField returns the value of the first "key: value" line with this key.
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// CoreHandoff returns how long a cache line takes to pass from CPU 0 to CPU 1,
// in ns (half a round trip of a flag that threads pinned to each flip in turn),
// or false where there are not two CPUs to pin to. On a VM it tells where the
// host put the two vCPUs at that moment: cores that share a last-level cache
// hand off in tens of ns, cores that do not in hundreds, and same-host
// transfers (shm, and TCP's to a lesser degree) slow with it (docs/benchmarks.md,
// "The machine's spells").
func CoreHandoff() (float64, bool) {
	if runtime.NumCPU() < 2 {
		return 0, false
	}
	const rounds = 100_000
	var flag atomic.Int64
	type result struct {
		d  time.Duration
		ok bool
	}
	done := make(chan result, 2)
	for cpu := range 2 {
		go func() {
			// Locked to the end, so the pinned thread exits with the goroutine
			// instead of going back to the runtime with its affinity.
			runtime.LockOSThread()
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				flag.Store(-1) // the other side gives up too
				done <- result{}
				return
			}
			start := time.Now()
			for i := int64(cpu); i < 2*rounds; i += 2 {
				for v := flag.Load(); v != i; v = flag.Load() {
					if v < 0 {
						done <- result{}
						return
					}
				}
				flag.Store(i + 1)
			}
			done <- result{time.Since(start), true}
		}()
	}
	a, b := <-done, <-done
	if !a.ok || !b.ok {
		return 0, false
	}
	return float64(max(a.d, b.d).Nanoseconds()) / (2 * rounds), true
}

// ParallelCopy returns the MB/s of two goroutines copying 32 MiB buffers at
// once, one per CPU as the scheduler places them. Beside CoreHandoff it tells
// two cores sharing a last-level cache (fast hand-off, fast copies) from two
// hyperthreads of one core (fast hand-off, copies a fifth slower).
func ParallelCopy() float64 {
	const size, rounds = 32 << 20, 8
	var bufs [2][2][]byte
	for i := range bufs {
		bufs[i] = [2][]byte{make([]byte, size), make([]byte, size)}
		copy(bufs[i][1], bufs[i][0]) // fault the pages in before the clock runs
	}
	var wg sync.WaitGroup
	start := time.Now()
	for i := range bufs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				copy(bufs[i][1], bufs[i][0])
			}
		}()
	}
	wg.Wait()
	return 2 * rounds * size / time.Since(start).Seconds() / 1e6
}
