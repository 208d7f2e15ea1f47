//go:build !lockrank

// The lock order unchecked: a build without the tag lockrank (lockrank.go).

package smcr

const lockrankOn = false

func lockOrder(lockRank, any) uint64 { return 0 }
func lockHeld(uint64, lockRank, any) {}
func goid() uint64                   { return 0 }
func lockFreed(any)                  {}

func lockOrderBreaches() []string          { return nil }
func forgetLockOrderBreach(_, _ lockRank)  {}
func lockOrderBreached(_, _ lockRank) bool { return false }
