// The application's user on smcrd's connections. Firewall rules that match a
// socket's owner (iptables -m owner --uid-owner, nft meta skuid) look at the
// credentials a socket was created with; a relayed connection's packets go out
// on smcrd's socket, so smcrd creates that socket as the application's user:
// the rule that would have refused the application's own connection refuses
// smcrd's.

package daemon

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// socketUID is the user owning the TCP socket whose local address is local
// and remote address remote, as sock_diag tells (an exact lookup, not a dump
// of every socket).
func socketUID(local, remote netip.AddrPort) (uint32, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Sendto(fd, diagRequest(local, remote), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	return parseDiagReply(buf[:n])
}

// Layout of sock_diag's messages (linux/inet_diag.h, linux/netlink.h).
const (
	nlmsgHdrLen  = 16
	diagReqLen   = 56 // struct inet_diag_req_v2
	diagMsgUID   = 64 // struct inet_diag_msg's idiag_uid
	sockDiagByFa = 20 // SOCK_DIAG_BY_FAMILY
)

// diagRequest is the netlink message asking for the one TCP socket local→remote.
func diagRequest(local, remote netip.AddrPort) []byte {
	b := make([]byte, nlmsgHdrLen+diagReqLen)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(len(b)))
	ne.PutUint16(b[4:], sockDiagByFa)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST)
	r := b[nlmsgHdrLen:]
	r[0] = unix.AF_INET
	if !local.Addr().Unmap().Is4() {
		r[0] = unix.AF_INET6
	}
	r[1] = unix.IPPROTO_TCP
	ne.PutUint32(r[4:], 0xffffffff) // every state
	binary.BigEndian.PutUint16(r[8:], local.Port())
	binary.BigEndian.PutUint16(r[10:], remote.Port())
	putDiagAddr(r[12:28], local.Addr())
	putDiagAddr(r[28:44], remote.Addr())
	ne.PutUint32(r[48:], 0xffffffff) // INET_DIAG_NOCOOKIE
	ne.PutUint32(r[52:], 0xffffffff)
	return b
}

func putDiagAddr(b []byte, a netip.Addr) {
	if a.Unmap().Is4() {
		v := a.Unmap().As4()
		copy(b, v[:])
		return
	}
	v := a.As16()
	copy(b, v[:])
}

// parseDiagReply is the uid in sock_diag's answer to diagRequest.
func parseDiagReply(b []byte) (uint32, error) {
	ne := binary.NativeEndian
	if len(b) < nlmsgHdrLen {
		return 0, errors.New("sock_diag: short answer")
	}
	switch ne.Uint16(b[4:]) {
	case unix.NLMSG_ERROR:
		if len(b) >= nlmsgHdrLen+4 {
			if errno := -int32(ne.Uint32(b[nlmsgHdrLen:])); errno != 0 {
				return 0, fmt.Errorf("sock_diag: %w", unix.Errno(errno))
			}
		}
		return 0, errors.New("sock_diag: no socket")
	case sockDiagByFa:
		if len(b) < nlmsgHdrLen+diagMsgUID+4 {
			return 0, errors.New("sock_diag: short answer")
		}
		return ne.Uint32(b[nlmsgHdrLen+diagMsgUID:]), nil
	}
	return 0, fmt.Errorf("sock_diag: answer of type %d", ne.Uint16(b[4:]))
}

// ownedBy adds to control the swap of the dialer's socket for one created as
// uid (dup3 over its descriptor, before control sets anything on it and before
// the connect), so that the connection is uid's to the firewall. The dialer's
// socket is plain TCP, with none of its own options set yet that TCP keeps
// (Go sets only IPV6_V6ONLY off, the default, before Control).
func ownedBy(uid uint32, control dialControl) dialControl {
	return func(network, address string, c syscall.RawConn) error {
		if uid != uint32(os.Geteuid()) {
			var serr error
			if err := c.Control(func(fd uintptr) { serr = replaceSocket(int(fd), network, uid) }); err != nil {
				return err
			}
			if serr != nil {
				return serr
			}
		}
		return control(network, address, c)
	}
}

// replaceSocket puts a TCP socket of network ("tcp4", "tcp6") created as uid
// in the place of descriptor fd.
func replaceSocket(fd int, network string, uid uint32) error {
	family := unix.AF_INET
	if network == "tcp6" {
		family = unix.AF_INET6
	}
	var s int
	var err error
	if aerr := asUser(uid, func() {
		s, err = unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	}); aerr != nil {
		return aerr
	}
	if err != nil {
		return fmt.Errorf("socket as uid %d: %w", uid, err)
	}
	defer unix.Close(s)
	if err := unix.Dup3(s, fd, unix.O_CLOEXEC); err != nil {
		return fmt.Errorf("socket as uid %d: %w", uid, err)
	}
	return nil
}

// asUser runs do on a thread whose file-system uid is uid: the sockets it
// creates are uid's (their file's credentials, which the firewall's owner
// matches look at). Only the calling thread changes (setfsuid(2) is per
// thread, and Go's wrapper does not spread it), and it goes back to the
// scheduler only once its uid is smcrd's again. Without CAP_SETUID the uid
// does not change: errNotAsUser, and do is not run.
func asUser(uid uint32, do func()) error {
	own := os.Geteuid()
	runtime.LockOSThread()
	unix.SetfsuidRetUid(int(uid))
	// setfsuid returns the uid before, whether it changed it or not.
	if now, _ := unix.SetfsuidRetUid(int(uid)); uint32(now) != uid {
		runtime.UnlockOSThread()
		return fmt.Errorf("%w %d", errNotAsUser, uid)
	}
	do()
	unix.SetfsuidRetUid(own)
	if prev, _ := unix.SetfsuidRetUid(own); prev == own {
		runtime.UnlockOSThread()
	} // else the thread ends with its goroutine
	return nil
}

// errNotAsUser: smcrd cannot create sockets as another user (CAP_SETUID).
var errNotAsUser = errors.New("cannot create a socket as the application's user (smcrd needs CAP_SETUID): user")
