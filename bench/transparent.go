// The transparent path: unmodified TCP client and server, one smcrd per namespace
// (RFC 7609 SMC-R negotiated by the daemons on the applications' behalf).

package bench

import "context"

// transparentResult is what the transparent-path runs add to the report.
type transparentResult struct {
	figures     []Figure
	unavailable []Unavailable
	notes       []string
}

func (e *runEnv) transparent(ctx context.Context, opts Options, sz sizes, jobs func(scenario) []job) transparentResult {
	return transparentResult{unavailable: []Unavailable{{"smcrd-*", "not wired yet"}}}
}
