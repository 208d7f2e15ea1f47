package main

// AF_SMC: Linux's own SMC sockets (net/smc), for the tests that put smcrd beside
// a Linux SMC peer (-smc). An AF_SMC socket takes AF_INET or AF_INET6 addresses
// and reports them back, so once connected or listening Go's net package wraps
// it as a TCP socket.

import (
	"fmt"
	"net"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// Linux's SMCPROTO_SMC and SMCPROTO_SMC6 (include/uapi/linux/smc.h).
const (
	smcProto4 = 0
	smcProto6 = 1
)

// smcSocket opens an AF_SMC socket for addr's family.
func smcSocket(addr string) (int, unix.Sockaddr, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return -1, nil, fmt.Errorf("smc: %q: %w", addr, err)
	}
	proto := smcProto6
	var sa unix.Sockaddr = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	if a := ap.Addr().Unmap(); a.Is4() {
		proto = smcProto4
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.As4()}
	}
	fd, err := unix.Socket(unix.AF_SMC, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return -1, nil, fmt.Errorf("smc: socket(AF_SMC): %w", err)
	}
	return fd, sa, nil
}

// dialSMC connects an AF_SMC socket to addr: the kernel runs CLC and SMC-R, or
// falls back to TCP, before connect returns.
func dialSMC(addr string) (net.Conn, error) {
	fd, sa, err := smcSocket(addr)
	if err != nil {
		return nil, err
	}
	if err := unix.Connect(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("smc: connect %s: %w", addr, err)
	}
	f := os.NewFile(uintptr(fd), "smc")
	defer f.Close()
	return net.FileConn(f)
}

// listenSMC listens on addr ("ip:port"; an empty ip is 0.0.0.0) with an AF_SMC socket.
func listenSMC(addr string) (net.Listener, error) {
	if len(addr) > 0 && addr[0] == ':' {
		addr = "0.0.0.0" + addr
	}
	fd, sa, err := smcSocket(addr)
	if err != nil {
		return nil, err
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("smc: bind %s: %w", addr, err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("smc: listen %s: %w", addr, err)
	}
	f := os.NewFile(uintptr(fd), "smc")
	defer f.Close()
	return net.FileListener(f)
}
