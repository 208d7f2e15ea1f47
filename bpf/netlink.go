package bpf

import (
	"errors"

	"github.com/vishvananda/netlink"
)

// dumpTries bounds the runs of a netlink dump the kernel keeps interrupting.
const dumpTries = 50

// retryDump runs a netlink dump again while the kernel reports it interrupted
// (NLM_F_DUMP_INTR: the table changed under it, as when an address finishes
// duplicate address detection or another program adds one), so the caller gets
// a consistent answer where it would have had an error with a partial one.
func retryDump[T any](dump func() (T, error)) (T, error) {
	for try := 1; ; try++ {
		v, err := dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) || try == dumpTries {
			return v, err
		}
	}
}
