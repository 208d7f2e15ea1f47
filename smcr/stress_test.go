package smcr

import (
	"bytes"
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

var stressConns = flag.Int("smcr.stress", 512, "connections TestStress starts at once")

// TestStress starts many connections at once between two namespaces, on shm and
// on soft, and echoes hash-checked content over each: whatever a connection does
// under the load (SMC-R, fallback, continuation over TCP), no byte may be lost and
// no connection may fail.
func TestStress(t *testing.T) {
	for _, kind := range []string{"shm", "soft"} {
		t.Run(kind, func(t *testing.T) {
			s := newNSSetup(t, kind)
			n := *stressConns
			const size = 256 << 10
			go func() {
				for {
					c, err := s.ln.AcceptSMC()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						io.Copy(c, c)
						c.CloseWrite()
					}()
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			start := make(chan struct{})
			errs := make(chan error, n)
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
	src := make([]byte, size)
	rng := rand.New(rand.NewPCG(seed, 7))
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
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
		return mode, fmt.Errorf("echo of %d bytes came back as %d different bytes", size, len(got))
	}
	return mode, nil
}
