//go:build linuxsmc

// Linux against Linux: two AF_SMC programs in the soft-RoCE VM talk SMC-R version 2
// over rxe on lo, with a User EID, a PNET entry and test/vm/rxefix loaded. What the
// VM's kernel can do before smcr is tried against it (issue #36, proof step 1).
// Run by test/vm's TestLinuxSMCv2OnSoftRoCE.
package linuxsmc

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/smcr/clc"
)

const (
	afSMC     = 43 // AF_SMC
	smcProto  = 0  // SMCPROTO_SMC: IPv4
	soDomain  = 39 // SO_DOMAIN: 43 while a socket runs SMC, 2 once it fell back
	transfer  = 4 << 20
	testUEID  = "SMCR-VM.LINUX-V2"
	testPNET  = "SMCRVMLO"
	loopback  = "lo"
	rxeOnLo   = "rxe1" // test/vm/init.sh puts rxe1 on lo
	rxePort   = 1
	smcPort   = 5000
	ioTimeout = 3 * time.Minute
)

// smcSocket opens an AF_SMC stream socket; the kernel takes IPv4 addresses for it.
func smcSocket(t *testing.T) int {
	t.Helper()
	fd, err := unix.Socket(afSMC, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, smcProto)
	if err != nil {
		t.Fatalf("socket(AF_SMC): %v (is the smc module loaded?)", err)
	}
	return fd
}

func domain(t *testing.T, fd int) int {
	t.Helper()
	d, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, soDomain)
	if err != nil {
		t.Fatalf("getsockopt SO_DOMAIN: %v", err)
	}
	return d
}

// kernelSetup is done once per guest boot: the tests of this package share it.
var kernelSetup struct {
	once sync.Once
	err  error
}

// setupKernel makes the guest's Linux ready for SMC-R version 2 on rxe1 over lo:
// rxefix.ko loaded, the smc module, a User EID (testUEID, global) and a PNET
// entry lo ↔ rxe1.
func setupKernel(t *testing.T) {
	t.Helper()
	kernelSetup.once.Do(func() { kernelSetup.err = doSetupKernel() })
	if kernelSetup.err != nil {
		t.Fatal(kernelSetup.err)
	}
}

func doSetupKernel() error {
	rxefix := os.Getenv("SMCR_RXEFIX")
	if rxefix == "" {
		return errors.New("SMCR_RXEFIX: the path of rxefix.ko (test/vm/rxefix.sh) is not set")
	}
	kernelRoot := os.Getenv("SMCR_KERNEL_ROOT")
	if kernelRoot == "" {
		return errors.New("SMCR_KERNEL_ROOT: the unpacked guest kernel (test/vm/kernel.sh) is not set")
	}
	for _, cmd := range [][]string{{"insmod", rxefix}, {"modprobe", "-d", kernelRoot, "smc"}} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %v\n%s", cmd, err, out)
		}
	}
	eid, err := clc.ParseEID(testUEID)
	if err != nil {
		return err
	}
	if err := addUEID(eid); err != nil {
		return err
	}
	return addPNET(testPNET, loopback, rxeOnLo, rxePort)
}

func TestLinuxSMCv2OverRxe(t *testing.T) {
	setupKernel(t)

	lfd := smcSocket(t)
	defer unix.Close(lfd)
	unix.SetsockoptInt(lfd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	addr := &unix.SockaddrInet4{Port: smcPort, Addr: [4]byte{127, 0, 0, 1}}
	if err := unix.Bind(lfd, addr); err != nil {
		t.Fatalf("bind: %v", err)
	}
	if err := unix.Listen(lfd, 1); err != nil {
		t.Fatalf("listen: %v", err)
	}
	payload := make([]byte, transfer)
	rand.NewChaCha8([32]byte{36}).Read(payload)
	want := sha256.Sum256(payload)

	type served struct {
		sum    [32]byte
		n      int64
		domain int
		err    error
	}
	done := make(chan served, 1)
	go func() {
		var s served
		defer func() { done <- s }()
		fd, _, err := unix.Accept(lfd)
		if err != nil {
			s.err = fmt.Errorf("accept: %w", err)
			return
		}
		f := os.NewFile(uintptr(fd), "smc-server")
		defer f.Close()
		h := sha256.New()
		s.n, s.err = io.Copy(h, f)
		copy(s.sum[:], h.Sum(nil))
		s.domain, _ = unix.GetsockoptInt(fd, unix.SOL_SOCKET, soDomain)
		if s.err == nil { // answer with the digest: data the other way too
			_, s.err = f.Write(s.sum[:])
		}
	}()

	cfd := smcSocket(t)
	start := time.Now()
	if err := unix.Connect(cfd, addr); err != nil {
		t.Fatalf("connect: %v", err)
	}
	c := os.NewFile(uintptr(cfd), "smc-client")
	defer c.Close()
	clientDomain := domain(t, cfd)
	if _, err := c.Write(payload); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := unix.Shutdown(cfd, unix.SHUT_WR); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	echo := make([]byte, sha256.Size)
	if _, err := io.ReadFull(c, echo); err != nil {
		t.Fatalf("read the server's digest: %v", err)
	}
	elapsed := time.Since(start)
	var s served
	select {
	case s = <-done:
	case <-time.After(ioTimeout):
		t.Fatal("server did not finish")
	}
	if s.err != nil && !errors.Is(s.err, io.EOF) {
		t.Fatalf("server: %v", s.err)
	}
	if s.n != transfer || s.sum != want || !bytes.Equal(echo, want[:]) {
		t.Fatalf("server got %d bytes, digest %x; echoed %x; want %d bytes, %x", s.n, s.sum, echo, transfer, want)
	}
	// SO_DOMAIN stays AF_SMC only on a connection that did not fall back to TCP;
	// rxe has RoCE v2 GIDs only, so SMC-R here is version 2.
	if clientDomain != afSMC || s.domain != afSMC {
		t.Fatalf("SO_DOMAIN client %d server %d: fell back to TCP (want %d on both)", clientDomain, s.domain, afSMC)
	}
	t.Logf("linux smc-r v2 over %s: %d bytes, sha256 equal, both ends AF_SMC, %v (%.1f MB/s)",
		rxeOnLo, transfer, elapsed.Round(time.Millisecond), float64(transfer)/elapsed.Seconds()/1e6)
}
