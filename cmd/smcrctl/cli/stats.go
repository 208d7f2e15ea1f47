// stats: the connection summary and traffic counters, after `smcr stats` of
// smc-tools; -r resets them in smcrd. RFC 7609 defines no counters: fallbacks are
// counted by CLC decline code (§3.7) and the side that declined.

package cli

import (
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/smcr-io/smcr/control"
)

var statsCmd = &command{
	name:     "stats",
	synopsis: "[-d] [-r] [--json]",
	short:    "show connection, fallback, traffic and buffer counters",
	long: `Shows the counters since smcrd started or since the last reset:
connections handled, how many went SMC-R and how many fell back to TCP, each
fallback reason with the side that declined (local: this host, peer: the other),
handshake errors, bytes and requests each way, and buffer events: full (the
writer waited for space), too small (a request larger than the buffer), downgrade
(a smaller buffer than configured, for lack of memory) and reuse (a buffer taken
from the pool).

Options:
  -d      details: buffer and request size histograms, memory, protocol
          errors, and the eBPF programs' counters: connections redirected to
          smcrd or left direct and why (skip_dead: smcrd not alive,
          skip_negative: peer without SMC-R, skip_prefix: route not through a
          listed interface, skip_unreachable: smcrd could not reach it lately),
          SYNs marked and steered, SMC options sent and echoed, and
          applications' socket options smcrd could not be told of
          (sockopt_lost)
  -r      reset the counters: smcrd hands over their values and zeroes them
          in one step, so nothing counted in between is lost; the values are
          printed afterwards. If they cannot be written, smcrctl says so and
          exits 1: smcrd no longer has them
  --json  print the counters as JSON (always everything)

Examples:
  smcrctl stats
  smcrctl stats -d
  smcrctl stats -r --json > stats-$(date +%F).json`,
	flags: func(fs *flag.FlagSet, o *options) {
		jsonFlag(fs, o)
		fs.BoolVar(&o.detail, "d", false, "")
		fs.BoolVar(&o.reset, "r", false, "")
	},
	run: func(e *env, o *options, args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		var st control.Stats
		var err error
		if o.reset {
			st, err = e.client.ResetStats(e.ctx)
		} else {
			st, err = e.client.Stats(e.ctx)
		}
		if err != nil {
			return err
		}
		if o.json {
			err = writeJSON(e.stdout, st)
		} else {
			err = writeStats(e.stdout, st, o.detail)
		}
		if err == nil && o.reset && !o.json {
			_, err = fmt.Fprintln(e.stdout, "\ncounters reset")
		}
		if err != nil && o.reset {
			return fmt.Errorf("the counters were reset in smcrd, but their values could not be written: %w", err)
		}
		return err
	},
}

// writeStats prints st and returns the first write error.
func writeStats(out io.Writer, st control.Stats, detail bool) error {
	w := &firstError{w: out}
	c := st.Connections
	fmt.Fprintf(w, "Counters for the last %s\n\n", seconds(st.SinceResetSeconds))

	tw := table(w)
	row(tw, "Connections")
	row(tw, "  handled", c.Handled)
	row(tw, "  SMC-R", c.SMCR)
	row(tw, "  fallback to TCP", c.Fallback)
	row(tw, "  handshake errors", c.HandshakeErrors)
	row(tw, "  as client", fmt.Sprintf("%d handled, %d SMC-R, %d fallback", c.Client.Handled, c.Client.SMCR, c.Client.Fallback))
	row(tw, "  as server", fmt.Sprintf("%d handled, %d SMC-R, %d fallback", c.Server.Handled, c.Server.SMCR, c.Server.Fallback))
	row(tw, "  SMC-R by version", fmt.Sprintf("v1 %d, v2 %d", c.V1, c.V2))
	row(tw, "  first contact", c.FirstContact)
	row(tw, "  link group reused", c.Reused)
	row(tw, "  open now", c.Active)
	tw.Flush()

	fmt.Fprintln(w)
	tw = table(w)
	row(tw, "Fallbacks", "SIDE", "CODE", "COUNT")
	if len(st.Fallbacks) == 0 {
		row(tw, "  none")
	}
	for _, f := range st.Fallbacks {
		row(tw, "  "+f.Reason, f.Side, hexCode(f.Code), f.Count)
	}
	tw.Flush()

	fmt.Fprintln(w)
	tw = table(w)
	row(tw, "Traffic", "RX", "TX")
	row(tw, "  bytes", st.RX.Bytes, st.TX.Bytes)
	row(tw, "  requests", st.RX.Requests, st.TX.Requests)
	row(tw, "  bytes after fallback", st.RX.FallbackBytes, st.TX.FallbackBytes)
	row(tw, "  buffer full", st.RX.BufferFull, st.TX.BufferFull)
	row(tw, "  buffer too small", st.RX.BufferTooSmall, st.TX.BufferTooSmall)
	row(tw, "  buffer downgrades", st.RX.Downgrades, st.TX.Downgrades)
	row(tw, "  buffer reuses", st.RX.Reuses, st.TX.Reuses)
	tw.Flush()

	if !detail {
		return w.err
	}
	for _, h := range []struct {
		title  string
		rx, tx control.Histogram
	}{
		{"Buffer sizes", st.RX.BufferSizes, st.TX.BufferSizes},
		{"Request sizes", st.RX.RequestSizes, st.TX.RequestSizes},
	} {
		fmt.Fprintln(w)
		writeHistograms(w, h.title, h.rx, h.tx)
	}
	fmt.Fprintln(w)
	tw = table(w)
	row(tw, "Other")
	row(tw, "  memory in use", control.FormatSize(uint64(st.MemoryInUse)))
	row(tw, "  memory pooled", control.FormatSize(uint64(st.MemoryPooled)))
	row(tw, "  memory peak", control.FormatSize(uint64(st.MemoryPeak)))
	row(tw, "  protocol errors", st.ProtocolErrors)
	row(tw, "  aborts", st.Aborts)
	row(tw, "  links added", st.Links.Added)
	row(tw, "  links deleted by the peer", st.Links.Deleted)
	row(tw, "  connections moved to another link", st.Links.ConnsMoved)
	row(tw, "  connections continued over TCP", st.Links.ConnsContinued)
	tw.Flush()

	fmt.Fprintln(w)
	tw = table(w)
	row(tw, "Direct mode (smcrctl run)")
	row(tw, "  SMC-R through shared memory", st.Direct.SMCR)
	row(tw, "    library to library", st.Direct.Bypass)
	row(tw, "    released to the program's socket", st.Direct.Released)
	row(tw, "  handed back as TCP", st.Direct.TCP)
	row(tw, "  connects failed", st.Direct.Failed)
	row(tw, "  not taken", st.Direct.Refused)
	tw.Flush()

	if len(st.Programs) > 0 {
		fmt.Fprintln(w)
		tw = table(w)
		row(tw, "eBPF programs")
		for _, name := range slices.Sorted(maps.Keys(st.Programs)) {
			row(tw, "  "+name, st.Programs[name])
		}
		tw.Flush()
	}
	return w.err
}

// firstError passes writes on until one fails, then keeps that error and
// refuses the rest, so that a page of small writes is checked once, at the end.
type firstError struct {
	w   io.Writer
	err error
}

func (f *firstError) Write(p []byte) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	n, err := f.w.Write(p)
	f.err = err
	return n, err
}

// writeHistograms prints RX and TX as two rows under one header of bucket labels.
func writeHistograms(w io.Writer, title string, rx, tx control.Histogram) {
	tw := table(w)
	head := []any{title}
	for i := range rx {
		head = append(head, rx.Label(i))
	}
	row(tw, head...)
	for _, r := range []struct {
		name string
		h    control.Histogram
	}{{"  RX", rx}, {"  TX", tx}} {
		cells := []any{r.name}
		for _, b := range r.h {
			cells = append(cells, b.Count)
		}
		row(tw, cells...)
	}
	tw.Flush()
}
