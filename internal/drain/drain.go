// Package drain reads a stream and drops its bytes through the caller's buffer:
// the receiving application of the benchmarks' bulk transfers (RFC 7609 §4's
// data path, or TCP's, read as a program reads it).
//
// io.Copy and io.CopyBuffer into io.Discard do not read through the buffer they
// are given: io.Discard is an io.ReaderFrom, and its ReadFrom reads through a
// pooled 8 KiB buffer of its own, so a receiver measured that way makes 32 reads
// where one reading into 256 KiB makes one. N and All read into buf itself.
package drain

import (
	"errors"
	"io"
)

// N reads and drops exactly n bytes of r, each read into buf (up to len(buf)
// bytes at a time), and returns how many it read: io.ErrUnexpectedEOF when r
// ended first. buf must not be empty.
func N(r io.Reader, n int64, buf []byte) (int64, error) {
	var got int64
	for got < n {
		k, err := r.Read(buf[:min(int64(len(buf)), n-got)])
		got += int64(k)
		if errors.Is(err, io.EOF) {
			if got < n {
				return got, io.ErrUnexpectedEOF
			}
			return got, nil
		}
		if err != nil {
			return got, err
		}
	}
	return got, nil
}

// All reads and drops r until EOF, each read into buf, and returns how many
// bytes it read. buf must not be empty.
func All(r io.Reader, buf []byte) (int64, error) {
	var got int64
	for {
		k, err := r.Read(buf)
		got += int64(k)
		if errors.Is(err, io.EOF) {
			return got, nil
		}
		if err != nil {
			return got, err
		}
	}
}
