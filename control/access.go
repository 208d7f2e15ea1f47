// Access control for the control socket: root, smcrd's own user, or the control
// group, decided from the caller's SO_PEERCRED credentials. Not part of RFC 7609.

package control

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/user"
	"slices"
	"strconv"
	"syscall"
)

// access decides who may use the socket.
type access struct {
	self      int    // smcrd's effective uid: it may always talk to itself
	gid       int    // the control group, -1 for none
	groupName string // for messages
	// monitorGid is the monitor group, which may read but not change, -1 for none.
	monitorGid  int
	monitorName string
	// groupsOf returns the supplementary groups of a process (SO_PEERCRED carries
	// only the primary gid). Replaced in tests.
	groupsOf func(pid int32) ([]int, error)
}

func newAccess(group, monitor string) (access, error) {
	a := access{self: os.Geteuid(), gid: -1, monitorGid: -1, groupsOf: procGroups}
	gid, err := LookupGroup(group)
	if err != nil {
		return a, err
	}
	mgid, err := LookupGroup(monitor)
	if err != nil {
		return a, err
	}
	a.gid, a.groupName = gid, group
	a.monitorGid, a.monitorName = mgid, monitor
	return a, nil
}

// LookupGroup returns the gid of control_group, a name or a numeric gid, as
// NewServer looks it up; -1 for "" (root only).
func LookupGroup(group string) (int, error) {
	if group == "" {
		return -1, nil
	}
	if n, err := strconv.Atoi(group); err == nil && n >= 0 {
		return n, nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return 0, fmt.Errorf("control: group %q: %w", group, err)
	}
	return strconv.Atoi(g.Gid)
}

// check admits root, smcrd's own uid and members of the control group, and
// members of the monitor group to what does not change anything (write false).
func (a access) check(c syscall.Ucred, write bool) error {
	if c.Uid == 0 || int(c.Uid) == a.self {
		return nil
	}
	var groups []int
	member := func(gid int) bool {
		if gid < 0 {
			return false
		}
		if int(c.Gid) == gid {
			return true
		}
		if groups == nil {
			groups, _ = a.groupsOf(c.Pid)
		}
		return slices.Contains(groups, gid)
	}
	switch {
	case member(a.gid):
		return nil
	case member(a.monitorGid) && !write:
		return nil
	case member(a.monitorGid):
		return fmt.Errorf("%w: uid %d is in group %s, which may only read (monitor_group)", ErrPermission, c.Uid, a.monitorName)
	case a.gid >= 0:
		return fmt.Errorf("%w: uid %d is neither root nor in group %s", ErrPermission, c.Uid, a.groupName)
	}
	return fmt.Errorf("%w: uid %d is not root (smcrd has no control_group)", ErrPermission, c.Uid)
}

// peerCred reads the credentials the kernel recorded when the caller connected.
func peerCred(c net.Conn) (syscall.Ucred, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return syscall.Ucred{}, fmt.Errorf("control: %T is not a Unix socket", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return syscall.Ucred{}, fmt.Errorf("control: peer credentials: %w", err)
	}
	var cred *syscall.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return syscall.Ucred{}, fmt.Errorf("control: peer credentials: %w", err)
	}
	if serr != nil {
		return syscall.Ucred{}, fmt.Errorf("control: peer credentials: %w", serr)
	}
	return *cred, nil
}

// procGroups reads the supplementary groups from /proc/PID/status ("Groups:").
func procGroups(pid int32) ([]int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		rest, ok := bytes.CutPrefix(sc.Bytes(), []byte("Groups:"))
		if !ok {
			continue
		}
		var out []int
		for _, f := range bytes.Fields(rest) {
			if n, err := strconv.Atoi(string(f)); err == nil {
				out = append(out, n)
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("no Groups line in /proc/%d/status", pid)
}
