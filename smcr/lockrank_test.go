package smcr

import (
	"fmt"
	"os"
	"testing"
)

// lockOrderChecked fails a test run built with the tag lockrank in which a
// mutex was taken out of the lock order (lockrank.go), listing each breach.
func lockOrderChecked(code int) int {
	bs := lockOrderBreaches()
	for _, b := range bs {
		fmt.Fprintln(os.Stderr, "smcr: lock order breached:", b)
	}
	if len(bs) > 0 && code == 0 {
		return 1
	}
	return code
}

// TestLockOrderChecked: with the tag lockrank, a mutex taken while one of a
// higher rank is held is a breach, one in order is not.
func TestLockOrderChecked(t *testing.T) {
	if !lockrankOn {
		t.Skip("built without the tag lockrank (make test-lockrank)")
	}
	var c mutex[connRank]
	var tx mutex[connTxRank]
	var lg rwMutex[groupRank]
	tx.Lock()
	lg.RLock()
	c.Lock()
	//lint:ignore SA2001 taking it is the test: the checker records the order
	c.Unlock()
	lg.RUnlock()
	tx.Unlock()
	if lockOrderBreached(rankConnTx, rankGroup) || lockOrderBreached(rankGroup, rankConn) {
		t.Fatal("a breach for mutexes taken in order")
	}
	if lockOrderBreached(rankConn, rankConnTx) {
		t.Skip("Conn.txMu under Conn.mu breached already: the run fails with it")
	}
	c.Lock()
	tx.Lock()
	//lint:ignore SA2001 taking it is the test: the checker records the order
	tx.Unlock()
	c.Unlock()
	if !lockOrderBreached(rankConn, rankConnTx) {
		t.Fatal("Conn.txMu taken under Conn.mu: no breach")
	}
	forgetLockOrderBreach(rankConn, rankConnTx)
}
