// Tests of the peer-credential decision itself, without sockets.

package control

import (
	"errors"
	"syscall"
	"testing"
)

func TestAccessCheck(t *testing.T) {
	groups := map[int32][]int{100: {10, 4321}, 101: {10}, 103: {10, 777}}
	a := access{self: 999, gid: 4321, groupName: "smcr", monitorGid: -1, groupsOf: func(pid int32) ([]int, error) {
		if g, ok := groups[pid]; ok {
			return g, nil
		}
		return nil, errors.New("no such process")
	}}
	rootOnly := a
	rootOnly.gid, rootOnly.groupName = -1, ""
	monitor := a
	monitor.monitorGid, monitor.monitorName = 777, "smcrmon"
	monitorOnly := monitor
	monitorOnly.gid, monitorOnly.groupName = -1, ""
	for _, tc := range []struct {
		name  string
		a     access
		cred  syscall.Ucred
		write bool
		ok    bool
	}{
		{"root", a, syscall.Ucred{Pid: 1, Uid: 0, Gid: 0}, false, true},
		{"smcrd's own user", a, syscall.Ucred{Pid: 1, Uid: 999, Gid: 999}, false, true},
		{"primary group", a, syscall.Ucred{Pid: 1, Uid: 1000, Gid: 4321}, false, true},
		{"supplementary group", a, syscall.Ucred{Pid: 100, Uid: 1000, Gid: 1000}, false, true},
		{"other groups", a, syscall.Ucred{Pid: 101, Uid: 1000, Gid: 1000}, false, false},
		{"process gone", a, syscall.Ucred{Pid: 102, Uid: 1000, Gid: 1000}, false, false},
		{"root only: group member", rootOnly, syscall.Ucred{Pid: 100, Uid: 1000, Gid: 4321}, false, false},
		{"root only: root", rootOnly, syscall.Ucred{Pid: 1, Uid: 0, Gid: 4321}, false, true},
		{"root changes", a, syscall.Ucred{Pid: 1, Uid: 0, Gid: 0}, true, true},
		{"control group changes", monitor, syscall.Ucred{Pid: 100, Uid: 1000, Gid: 1000}, true, true},
		{"monitor group reads", monitor, syscall.Ucred{Pid: 103, Uid: 1000, Gid: 1000}, false, true},
		{"monitor group, primary, reads", monitorOnly, syscall.Ucred{Pid: 1, Uid: 1000, Gid: 777}, false, true},
		{"monitor group changes", monitor, syscall.Ucred{Pid: 103, Uid: 1000, Gid: 1000}, true, false},
		{"monitor group changes, no control group", monitorOnly, syscall.Ucred{Pid: 103, Uid: 1000, Gid: 1000}, true, false},
		{"other groups read", monitor, syscall.Ucred{Pid: 101, Uid: 1000, Gid: 1000}, false, false},
	} {
		err := tc.a.check(tc.cred, tc.write)
		if (err == nil) != tc.ok {
			t.Errorf("%s: check = %v, want allowed %v", tc.name, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrPermission) {
			t.Errorf("%s: %v is not ErrPermission", tc.name, err)
		}
	}
}

func TestProcGroups(t *testing.T) {
	want, err := syscall.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	got, err := procGroups(int32(syscall.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("procGroups = %v, getgroups = %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("procGroups = %v, getgroups = %v", got, want)
		}
	}
}
