// port_range_list: the AIX syntax for the TCP ports SMC-R is tried for.

package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// PortRange is an inclusive range of TCP ports.
type PortRange struct{ First, Last uint16 }

// PortRanges is a sorted list of non-overlapping, non-adjacent port ranges.
type PortRanges []PortRange

// ParsePortRanges reads the AIX port_range_list syntax: "1-20,23,50". Overlapping and
// adjacent ranges are merged; an empty string is the empty list.
func ParsePortRanges(s string) (PortRanges, error) {
	var out PortRanges
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(f, "-")
		first, err := parsePort(lo)
		if err != nil {
			return nil, fmt.Errorf("bad range %q: %w", f, err)
		}
		last := first
		if isRange {
			if last, err = parsePort(hi); err != nil {
				return nil, fmt.Errorf("bad range %q: %w", f, err)
			}
			if last < first {
				return nil, fmt.Errorf("bad range %q: start %d is above end %d", f, first, last)
			}
		}
		out = append(out, PortRange{first, last})
	}
	return out.normalize(), nil
}

func parsePort(s string) (uint16, error) {
	s = strings.TrimSpace(s)
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%q is not a port number", s)
	}
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %d is out of range 1-65535", n)
	}
	return uint16(n), nil
}

func (rs PortRanges) normalize() PortRanges {
	slices.SortFunc(rs, func(a, b PortRange) int { return int(a.First) - int(b.First) })
	var out PortRanges
	for _, r := range rs {
		if n := len(out); n > 0 && uint32(r.First) <= uint32(out[n-1].Last)+1 {
			out[n-1].Last = max(out[n-1].Last, r.Last)
			continue
		}
		out = append(out, r)
	}
	return out
}

// Contains reports whether port is in one of the ranges.
func (rs PortRanges) Contains(port uint16) bool {
	_, found := slices.BinarySearchFunc(rs, port, func(r PortRange, p uint16) int {
		switch {
		case r.Last < p:
			return -1
		case r.First > p:
			return 1
		}
		return 0
	})
	return found
}

// String formats the ranges in the AIX syntax that ParsePortRanges reads.
func (rs PortRanges) String() string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		if r.First == r.Last {
			parts[i] = strconv.Itoa(int(r.First))
		} else {
			parts[i] = fmt.Sprintf("%d-%d", r.First, r.Last)
		}
	}
	return strings.Join(parts, ",")
}
