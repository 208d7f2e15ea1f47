// The machine a report was measured on: figures from these noisy VMs mean
// something only beside the CPU, core count, kernel and Go version that made them.

package bench

import (
	"bufio"
	"os"
	"runtime"
	"strings"

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
