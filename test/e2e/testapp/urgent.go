package main

// Urgent data (MSG_OOB) end to end: the client sends its payload in pieces, each
// followed by an urgent byte, and waits until the server reports the mark before
// the next one (TCP keeps one urgent pointer: a second byte sent before the first
// is read moves the mark). The server reads with the urgent byte inline and tells
// where each mark fell, then the length and hash of everything.

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"

	"github.com/smcr-io/smcr/internal/tcpurg"
)

const urgentPieces = 8

func serveUrgent(c *net.TCPConn) {
	r, err := tcpurg.NewReader(c)
	if err != nil {
		return
	}
	h := sha256.New()
	var n int64
	buf := make([]byte, 64<<10)
	for {
		k, urgent, err := r.ReadMarked(buf)
		if urgent {
			fmt.Fprintf(c, "mark %d\n", n)
		}
		h.Write(buf[:k])
		n += int64(k)
		if err == io.EOF {
			fmt.Fprintf(c, "%d %x\n", n, h.Sum(nil))
			return
		}
		if err != nil {
			return
		}
	}
}

func sendUrgent(c *net.TCPConn, size int64, seed uint64) error {
	if _, err := c.Write([]byte{'U'}); err != nil {
		return err
	}
	answers := bufio.NewReader(c)
	rng := rand.New(rand.NewPCG(seed, 7))
	h := sha256.New()
	var sent int64
	piece := make([]byte, max(size/urgentPieces&^7, 8)) // payload fills whole words
	for i := range urgentPieces {
		io.ReadFull(payload(seed+uint64(i)), piece)
		if _, err := c.Write(piece); err != nil {
			return fmt.Errorf("send: %w", err)
		}
		h.Write(piece)
		sent += int64(len(piece))
		u := byte(rng.Uint32())
		if err := tcpurg.WriteUrgent(c, u); err != nil {
			return err
		}
		h.Write([]byte{u})
		var at int64
		if _, err := fmt.Fscanf(answers, "mark %d\n", &at); err != nil {
			return fmt.Errorf("urgent byte %d: no mark reported: %w", i, err)
		}
		if at != sent {
			return fmt.Errorf("urgent byte %d: server found the mark at %d, sent it at %d", i, at, sent)
		}
		sent++
	}
	c.CloseWrite()
	var n int64
	var sum string
	if _, err := fmt.Fscan(answers, &n, &sum); err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	if want := hex.EncodeToString(h.Sum(nil)); n != sent || sum != want {
		return fmt.Errorf("server got %d bytes %s, sent %d %s", n, sum, sent, want)
	}
	return nil
}
