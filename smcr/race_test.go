//go:build race

package smcr

// The race detector slows the engine some tenfold: load tests scale down so that
// they still test correctness, not how long 2 cores take to set 512 links' worth of
// CLC under instrumentation (then CLC and resync timeouts, not bugs, fail them).
func init() { raceEnabled = true }
