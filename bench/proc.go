// Process accounting: CPU time (each process's CPU-time clock, in ns) and resident
// memory (VmRSS of /proc/<pid>/status) of the peers and daemons, so the cost of
// moving bytes counts every process that moves them.

package bench

import (
	"bytes"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// clockTick is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every Linux
// architecture Go supports.
const clockTick = 100

// cpuClockSched selects a CPU-time clock's scheduler time (CPUCLOCK_SCHED in
// linux/posix-timers.h): nanoseconds on CPU, user and system together.
const cpuClockSched = 2

// Fields of /proc/<pid>/stat counted after the ")" that ends the command name:
// field 3 (state) is index 0 there, so utime (14) and stime (15) are 11 and 12.
const (
	statUtime = 11
	statStime = 12
)

// cpuOf is the CPU seconds the processes have used, user and system; processes
// that are gone count zero.
func cpuOf(pids []int) float64 {
	var total float64
	for _, pid := range pids {
		total += cpuOfPID(pid)
	}
	return total
}

// cpuOfPID reads the process's CPU-time clock: the scheduler's nanoseconds on
// CPU summed over all its threads, those that exited included (the transfers
// last tens of ms, where 10 ms ticks would be coarse). /proc/<pid>/schedstat
// has the same nanoseconds, but of the thread group leader alone, and a Go
// program runs on several threads. Where the clock cannot be read, it falls back
// to utime+stime of /proc/<pid>/stat, in ticks.
func cpuOfPID(pid int) float64 {
	var ts unix.Timespec
	if pid > 0 && unix.ClockGettime(processCPUClock(pid), &ts) == nil { // pid 0 would be this process
		return float64(ts.Nano()) / 1e9
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	return parseStatCPU(b)
}

// processCPUClock is the clock ID of pid's process-wide scheduler CPU clock,
// MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED) of linux/posix-timers.h.
func processCPUClock(pid int) int32 {
	return int32(^uint32(pid)<<3 | cpuClockSched)
}

// parseStatCPU returns utime+stime in seconds from a /proc/<pid>/stat line.
func parseStatCPU(b []byte) float64 {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) <= statStime {
		return 0
	}
	u, err1 := strconv.ParseUint(f[statUtime], 10, 64)
	s, err2 := strconv.ParseUint(f[statStime], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return float64(u+s) / clockTick
}

// rssOf is the resident memory of the processes in bytes.
func rssOf(pids []int) int64 {
	var total int64
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		if err != nil {
			continue
		}
		total += parseVmRSS(b)
	}
	return total
}

// parseVmRSS returns the VmRSS line of /proc/<pid>/status in bytes.
func parseVmRSS(b []byte) int64 {
	for line := range strings.Lines(string(b)) {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0
		}
		return kb << 10
	}
	return 0
}

// runtimeGC settles this process's heap before memory is sampled.
func runtimeGC() { runtime.GC() }
