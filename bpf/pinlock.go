// Pin directory lock: one smcrd per pin directory. The links pinned there and the
// shared smcr_config (redirect listeners, liveness) belong to one smcrd; a second
// one loading into the same directory would take them over from the first.

package bpf

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// PinDirLock is an exclusive hold on a pin directory: a flock on the directory
// itself, as a bpf filesystem takes no regular files and the directory is what
// outlives each smcrd. The kernel drops it when its holder exits, crash or
// SIGKILL included, so no stale lock keeps the next smcrd out.
type PinDirLock struct{ f *os.File }

// PinDirHeldError is LockPinDir's answer when another process holds the lock.
type PinDirHeldError struct {
	Dir string
	PID int // 0 when not known (the holder is in another pid namespace)
}

func (e *PinDirHeldError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("another smcrd holds %s (pid %d)", e.Dir, e.PID)
	}
	return fmt.Sprintf("another smcrd holds %s", e.Dir)
}

// LockPinDir creates dir as Load would and takes its lock without waiting. Take
// it before Load and keep it for as long as the Loader is in use.
func LockPinDir(dir string) (*PinDirLock, error) {
	if dir == "" {
		dir = DefaultPinDir
	}
	if err := ensurePinDir(dir); err != nil {
		return nil, err
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("bpf: lock pin dir: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &PinDirHeldError{Dir: dir, PID: flockHolder(f)}
		}
		return nil, fmt.Errorf("bpf: lock pin dir %s: %w", dir, err)
	}
	return &PinDirLock{f: f}, nil
}

// Release gives the lock up.
func (l *PinDirLock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// flockHolder finds the pid holding a flock on f's inode in /proc/locks, whose
// lines read "1: FLOCK  ADVISORY  WRITE 1234 00:27:5678 0 EOF"; 0 if none.
func flockHolder(f *os.File) int {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0
	}
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	locks, err := os.Open("/proc/locks")
	if err != nil {
		return 0
	}
	defer locks.Close()
	sc := bufio.NewScanner(locks)
	for sc.Scan() {
		// Waiters are listed as "1: -> FLOCK ..."; they hold nothing.
		fs := strings.Fields(sc.Text())
		if len(fs) < 6 || fs[1] != "FLOCK" || fs[5] != want {
			continue
		}
		if pid, err := strconv.Atoi(fs[4]); err == nil && pid > 0 {
			return pid
		}
	}
	return 0
}
