// Meeting the peer's smcrd for a direct connection's memory: when both ends of
// an SMC-R connection over shm are programs with the library (tlvDirect in CLC,
// smcr.Conn.PeerDirect), the two smcrds swap the libraries' shared areas, and
// each library then writes straight into the other's receive ring, as SMC-D
// does: the bytes cross no process but the two programs.
//
// The meet socket is a SOCK_SEQPACKET socket in the shm directory, which the
// smcrds sharing shm share too. The value each smcrd sends in tlvDirect is a
// nonce of 16 bytes and the path of its meet socket. The client's smcrd asks:
//
//	MEET: the server's nonce, the client's nonce + memfd, efd_lib, wake page ──▶
//	      ◀── MEET: the same nonces + the server's memfd, efd_lib, wake page
//
// The server's smcrd answers only the client its CLC named (both nonces match
// those of that connection's CLC), within clc_timeout.

package daemon

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/internal/scm"
)

const nonceLen = 16

// meetFds is the number of descriptors each end brings: the library's area,
// its process's eventfd and wake page.
const meetFds = 3

// meetMsg is a meet exchange's message: the asked end's nonce, then the
// asking end's.
type meetMsg struct{ to, from [nonceLen]byte }

// meeting is a server connection waiting for its client's smcrd.
type meeting struct {
	peer [nonceLen]byte // the client's nonce, from CLC
	in   chan meetIn
}

// meetIn is what the client's smcrd brought, and where to answer.
type meetIn struct {
	fds   []int
	reply chan []int    // the server's fds; closed without them to refuse
	sent  chan struct{} // closed once the answer is written: the fds may close
}

// meetPoint serves this smcrd's meet socket.
type meetPoint struct {
	log  *slog.Logger
	path string
	ln   *net.UnixListener
	mu   sync.Mutex
	wait map[[nonceLen]byte]*meeting
	wg   sync.WaitGroup
}

func newMeetPoint(dir string, log *slog.Logger) (*meetPoint, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("meet socket: %w", err)
	}
	var id [8]byte
	rand.Read(id[:])
	path := filepath.Join(dir, fmt.Sprintf("smcr-meet-%x.sock", id))
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("meet socket: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	m := &meetPoint{log: log, path: path, ln: ln, wait: map[[nonceLen]byte]*meeting{}}
	m.wg.Add(1)
	go m.serve()
	return m, nil
}

func (m *meetPoint) close() {
	m.ln.Close()
	m.wg.Wait()
}

// value is what this end sends in tlvDirect: a new nonce and the socket.
func (m *meetPoint) value() (nonce [nonceLen]byte, v []byte) {
	rand.Read(nonce[:])
	return nonce, append(nonce[:], m.path...)
}

func (m *meetPoint) serve() {
	defer m.wg.Done()
	for {
		c, err := m.ln.AcceptUnix()
		if err != nil {
			return
		}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			defer c.Close()
			m.answer(c)
		}()
	}
}

// answer serves one client smcrd's MEET.
func (m *meetPoint) answer(c *net.UnixConn) {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	msg, fds, err := readMeet(c)
	if err != nil {
		m.log.Debug("meet: read", "err", err)
		return
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	// The server's CLC may end a little after the client's.
	var mt *meeting
	for deadline := time.Now().Add(5 * time.Second); mt == nil && time.Now().Before(deadline); {
		m.mu.Lock()
		mt = m.wait[msg.to]
		m.mu.Unlock()
		if mt == nil {
			time.Sleep(time.Millisecond)
		}
	}
	if mt == nil || mt.peer != msg.from || len(fds) != meetFds {
		m.log.Debug("meet: no such connection here")
		return
	}
	in := meetIn{fds: fds, reply: make(chan []int, 1), sent: make(chan struct{})}
	defer close(in.sent)
	select {
	case mt.in <- in:
		fds = nil // taken
	default:
		return // answered already
	}
	mine, ok := <-in.reply
	if !ok {
		return
	}
	writeMeet(c, meetMsg{to: msg.from, from: msg.to}, mine)
}

// expect registers a server connection that waits for its client's smcrd.
func (m *meetPoint) expect(mine, peer [nonceLen]byte) (*meeting, func()) {
	mt := &meeting{peer: peer, in: make(chan meetIn, 1)}
	m.mu.Lock()
	m.wait[mine] = mt
	m.mu.Unlock()
	return mt, func() {
		m.mu.Lock()
		delete(m.wait, mine)
		m.mu.Unlock()
	}
}

// meet is the client's side: it brings fds to the server's smcrd named in
// peerValue and returns the server's.
func meet(mine [nonceLen]byte, peerValue []byte, fds []int, timeout time.Duration) ([]int, error) {
	if len(peerValue) <= nonceLen {
		return nil, errors.New("meet: short direct value")
	}
	var to [nonceLen]byte
	copy(to[:], peerValue)
	path := string(peerValue[nonceLen:])
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("meet: %w", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if err := writeMeet(c, meetMsg{to: to, from: mine}, fds); err != nil {
		return nil, fmt.Errorf("meet: %w", err)
	}
	msg, got, err := readMeet(c)
	if err != nil {
		return nil, fmt.Errorf("meet: answer: %w", err)
	}
	if msg.to != mine || msg.from != to || len(got) != meetFds {
		for _, fd := range got {
			unix.Close(fd)
		}
		return nil, errors.New("meet: answer for another connection")
	}
	return got, nil
}

func writeMeet(c *net.UnixConn, m meetMsg, fds []int) error {
	b := append(append([]byte("MEET"), m.to[:]...), m.from[:]...)
	_, _, err := c.WriteMsgUnix(b, unix.UnixRights(fds...), nil)
	return err
}

func readMeet(c *net.UnixConn) (meetMsg, []int, error) {
	buf := make([]byte, 64)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return meetMsg{}, nil, err
	}
	fds := scm.Rights(oob[:oobn])
	if n != 4+2*nonceLen || !bytes.Equal(buf[:4], []byte("MEET")) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return meetMsg{}, nil, errors.New("meet: malformed message")
	}
	var m meetMsg
	copy(m.to[:], buf[4:])
	copy(m.from[:], buf[4+nonceLen:])
	return m, fds, nil
}

// swapServer waits for the client's smcrd of the connection whose CLC sent
// mine and received peerValue, gives it fds and returns the client's.
func (m *meetPoint) swapServer(mine [nonceLen]byte, peerValue []byte, fds []int, timeout time.Duration) ([]int, error) {
	if len(peerValue) <= nonceLen {
		return nil, errors.New("meet: short direct value")
	}
	var peer [nonceLen]byte
	copy(peer[:], peerValue)
	mt, done := m.expect(mine, peer)
	defer done()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case in := <-mt.in:
		in.reply <- fds
		<-in.sent
		return in.fds, nil
	case <-t.C:
		return nil, errors.New("meet: the client's smcrd did not come")
	}
}
