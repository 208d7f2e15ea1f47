package smcr

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/smcr-io/smcr/internal/race"
	"github.com/smcr-io/smcr/smcr/clc"
)

var stressConns = flag.Int("smcr.stress", 512, "connections TestStress starts at once (a 16th of it under the race detector)")

// TestStress starts many connections at once between two namespaces, on shm and
// on soft, and echoes hash-checked content over each: whatever a connection does
// under the load (SMC-R, fallback, continuation over TCP), no byte may be lost and
// no connection may fail.
func TestStress(t *testing.T) {
	for _, kind := range []string{"shm", "soft"} {
		t.Run(kind, func(t *testing.T) {
			s := newNSSetup(t, kind)
			n := *stressConns
			if race.Enabled {
				// The detector slows the engine some tenfold: CLC and resync
				// timeouts, not bugs, would fail a full-size run on 2 cores.
				n = max(n/16, 1)
			}
			const size = 256 << 10
			errs := make(chan error, 2*n)
			var echoes sync.WaitGroup
			go func() {
				for {
					c, err := s.ln.AcceptSMC()
					if err != nil {
						return
					}
					echoes.Add(1)
					go func() {
						defer echoes.Done()
						defer c.Close()
						if _, err := io.Copy(c, c); err != nil {
							errs <- fmt.Errorf("server echo: %w", err)
						}
						c.CloseWrite()
					}()
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			start := make(chan struct{})
			modes := make(chan string, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					mode, err := stressEcho(ctx, s, uint64(i), size)
					if err != nil {
						errs <- fmt.Errorf("conn %d: %w", i, err)
					}
					modes <- mode
				}()
			}
			close(start)
			wg.Wait()
			echoes.Wait() // every client closed: the echoes end
			close(errs)
			close(modes)
			count := map[string]int{}
			for m := range modes {
				count[m]++
			}
			t.Logf("%d connections: %v; client %+v", n, count, s.cli.Stats())
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

// stressEcho dials, writes size seeded bytes, and reads them back, checked by hash.
func stressEcho(ctx context.Context, s *nsSetup, seed uint64, size int) (string, error) {
	var c *Conn
	err := s.pair.A.Do(func() error {
		var err error
		c, err = s.cli.Dial(ctx, "tcp", s.addr)
		return err
	})
	if err != nil {
		return "dial failed", fmt.Errorf("dial: %w", err)
	}
	defer c.Close()
	mode := c.Mode().String()
	if d := c.Decline(); d != nil {
		mode = fmt.Sprintf("%v %#08x", c.Mode(), uint32(d.Code))
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	src := randomBytes(seed, size)
	rng := rand.New(rand.NewPCG(seed, 7))
	werr := make(chan error, 1)
	go func() {
		for off := 0; off < size; {
			k := min(1+rng.IntN(64<<10), size-off)
			if _, err := c.Write(src[off : off+k]); err != nil {
				werr <- fmt.Errorf("write at %d: %w", off, err)
				return
			}
			off += k
		}
		werr <- c.CloseWrite()
	}()
	got, rerr := io.ReadAll(c)
	if err := <-werr; err != nil {
		return mode, err
	}
	if rerr != nil {
		return mode, fmt.Errorf("read after %d bytes: %w", len(got), rerr)
	}
	if want := sha256.Sum256(src); sha256.Sum256(got) != want || !bytes.Equal(got, src) {
		i := 0
		for i < min(len(got), len(src)) && got[i] == src[i] {
			i++
		}
		return mode, fmt.Errorf("echo of %d bytes came back as %d different bytes, from byte %d: % x", size, len(got), i, got[i:min(len(got), i+64)])
	}
	return mode, nil
}

// TestCloseUnderLoad closes and aborts connections at random moments while
// their Reads and Writes run, on shm (whose buffers are mappings a release
// unmaps) and soft: no Close or Abort may free a buffer a copy is using or
// hang, and every connection must release its buffers once both ends closed.
// Before Close waited for copies, every run on shm ended in a fault: a Write
// copying into a send buffer a concurrent Close had unmapped.
func TestCloseUnderLoad(t *testing.T) {
	for _, kind := range []string{"shm", "soft"} {
		t.Run(kind, func(t *testing.T) {
			s := newNSSetup(t, kind)
			n := 512
			if race.Enabled {
				n = 32
			}
			go func() {
				for {
					c, err := s.ln.AcceptSMC()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						go io.Copy(io.Discard, c) // reads until our end closes
						buf := make([]byte, 64<<10)
						for {
							if _, err := c.Write(buf); err != nil {
								return
							}
						}
					}()
				}
			}()
			rng := rand.New(rand.NewPCG(1, 2))
			var wg sync.WaitGroup
			for i := range n {
				var c *Conn
				err := s.pair.A.Do(func() error {
					var err error
					c, err = s.cli.Dial(context.Background(), "tcp", s.addr)
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				after := time.Duration(rng.IntN(3000)) * time.Microsecond
				wg.Add(3)
				go func() { defer wg.Done(); io.Copy(io.Discard, c) }()
				go func() {
					defer wg.Done()
					buf := make([]byte, 48<<10)
					for {
						if _, err := c.Write(buf); err != nil {
							return
						}
					}
				}()
				go func() {
					defer wg.Done()
					time.Sleep(after) // the scenario: a close at a random point of the stream
					if i%2 == 0 {
						c.Close()
					} else {
						c.Abort()
					}
				}()
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("Reads, Writes or Closes still running after 30 s")
			}
			eventually(t, "every connection released on both ends", func() bool {
				return len(s.cli.Conns()) == 0 && len(s.srv.Conns()) == 0
			})
		})
	}
}

// TestCrossingDecline: after our Decline, an Accept or a Decline the peer sent at
// the same time is dropped, and application bytes that merely begin like one are kept.
func TestCrossingDecline(t *testing.T) {
	peer := clc.PeerID{1, 2, 3, 4, 5, 6, 7, 8}
	dec, _ := (&clc.Decline{PeerID: peer, Code: DeclineTimeoutCLC}).AppendTo(nil)
	other, _ := (&clc.Decline{PeerID: clc.PeerID{9}, Code: DeclineTimeoutCLC}).AppendTo(nil)
	dec2, _ := (&clc.Decline{PeerID: peer, Code: DeclineTimeoutCLC, Version: clc.Version2, OSType: clc.OSLinux}).AppendTo(nil)
	acc := make([]byte, 48) // an Accept's frame: header, peer ID, body, trailer
	copy(acc, clc.Eyecatcher[:])
	acc[4], acc[6], acc[7] = byte(clc.TypeAccept), 48, 0x10
	copy(acc[8:], peer[:])
	copy(acc[44:], clc.Eyecatcher[:])
	for _, tc := range []struct {
		name string
		in   []byte
		want []byte
	}{
		{"decline then data", append(append([]byte{}, dec...), "data"...), []byte("data")},
		{"version 2 decline then data", append(append([]byte{}, dec2...), "data"...), []byte("data")},
		{"data only", []byte("data"), []byte("data")},
		{"another peer's decline", append(append([]byte{}, other...), 'x'), append(append([]byte{}, other...), 'x')},
		{"eyecatcher then data", append(append([]byte{}, dec[:6]...), "data"...), append(append([]byte{}, dec[:6]...), "data"...)},
		{"nothing", nil, []byte{}},
		{"accept then data", append(append([]byte{}, acc...), "data"...), []byte("data")},
		{"short accept", acc[:40], acc[:40]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := net.Pipe()
			go func() { a.Write(tc.in); a.Close() }()
			c := &readAheadConn{Conn: b, r: bufio.NewReader(b), crossing: true, peer: peer}
			got, err := io.ReadAll(c)
			if err != nil || !bytes.Equal(got, tc.want) {
				t.Fatalf("read %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
