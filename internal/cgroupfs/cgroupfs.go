// Package cgroupfs finds the cgroup2 filesystem: smcrd attaches its programs
// to a cgroup under it, and the tests make theirs there.
package cgroupfs

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// Mount returns where the cgroup2 filesystem is mounted, from /proc/mounts.
func Mount() (string, error) {
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return "", fmt.Errorf("cgroup2: %w", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[2] == "cgroup2" {
			return f[1], nil
		}
	}
	return "", errors.New("cgroup2: no cgroup2 filesystem in /proc/mounts")
}
