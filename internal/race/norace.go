//go:build !race

// Package race tells tests whether the race detector is on: it allocates and
// slows everything down, so allocation counts and load sizes do not hold.
package race

// Enabled is true in race builds.
const Enabled = false
