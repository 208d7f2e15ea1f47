package nstest

import (
	"os"
	"strings"
	"testing"

	"github.com/smcr-io/smcr/internal/cgroupfs"
	"golang.org/x/sys/unix"
)

// Cgroup2 returns where the cgroup2 filesystem is mounted, mounting it for the
// test when the kernel has it and nothing mounts it (a container or a minimal
// system): a test skips only when the kernel lacks cgroup v2, or when it
// would have to mount it without root.
func Cgroup2(t testing.TB) string {
	t.Helper()
	if mnt, err := cgroupfs.Mount(); err == nil {
		return mnt
	}
	fs, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		t.Fatalf("nstest: %v", err)
	}
	if !strings.Contains(string(fs), "\tcgroup2\n") {
		t.Skip("nstest: kernel lacks cgroup v2 (not in /proc/filesystems)")
	}
	if os.Geteuid() != 0 {
		t.Skip("nstest: no cgroup2 mount, and mounting one needs root")
	}
	dir, err := os.MkdirTemp("", "smcr-cgroup2-")
	if err != nil {
		t.Fatalf("nstest: %v", err)
	}
	if err := unix.Mount("cgroup2", dir, "cgroup2", 0, ""); err != nil {
		os.Remove(dir)
		t.Fatalf("nstest: mount cgroup2 at %s: %v", dir, err)
	}
	t.Cleanup(func() {
		unix.Unmount(dir, unix.MNT_DETACH)
		os.Remove(dir)
	})
	return dir
}
