// Tests of the decline codes' names and of DeclineError with errors.Is.
// Covers RFC 7609 §3.7.4 diagnosis codes as Linux's smc_clc.h lists them.

package clc

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestDeclineCodeNames(t *testing.T) {
	// Linux's codes, one by one, with smcr's wording.
	table := map[uint32]string{
		0x01010000: "insufficient memory",
		0x02010000: "timeout waiting for CONFIRM LINK",
		0x02020000: "timeout waiting for ADD LINK",
		0x03000000: "configuration error",
		0x03010000: "peer did not send the SMC option",
		0x03020000: "IPsec in use",
		0x03030000: "no SMC device",
		0x03030002: "no SMC-R device",
		0x03040000: "SMC mode mismatch",
		0x03050000: "peer has eyecatcher in RMBE",
		0x03070000: "IP subnet mismatch",
		0x030a0000: "no active link in the link group",
		0x030c0000: "version mismatch",
		0x04000000: "synchronisation error",
		0x05000000: "peer declined during handshake",
		0x09990000: "internal error",
	}
	for code, want := range table {
		if got := DeclineCode(code).String(); got != want {
			t.Errorf("%#08x: %q, want %q", code, got, want)
		}
	}
	seen := map[string]DeclineCode{}
	for c, name := range declineNames {
		if prev, dup := seen[name]; dup {
			t.Errorf("%#x and %#x share the name %q", uint32(prev), uint32(c), name)
		}
		seen[name] = c
		if _, ok := declineClasses[c.Class()]; !ok {
			t.Errorf("%#x: class %d unknown", uint32(c), c.Class())
		}
	}
	// Codes this package does not know keep their class and value.
	if got := DeclineCode(0x0303007f).String(); got != "configuration error 0x0303007f" {
		t.Errorf("unknown configuration code: %q", got)
	}
	if got := DeclineCode(0x77000000).String(); got != "decline code 0x77000000" {
		t.Errorf("unknown class: %q", got)
	}
}

func TestDeclineError(t *testing.T) {
	d := &Decline{Code: DeclinePeerNoSMC}
	err := fmt.Errorf("smcr: dial: %w", d.Err())
	if !errors.Is(err, ErrDeclined) || !errors.Is(err, DeclinePeerNoSMC) {
		t.Fatalf("errors.Is fails on %v", err)
	}
	if errors.Is(err, DeclineIPSubnetMismatch) {
		t.Fatalf("%v matches another code", err)
	}
	var de *DeclineError
	if !errors.As(err, &de) || de.Code != DeclinePeerNoSMC || de.Local {
		t.Fatalf("errors.As: %+v", de)
	}
	if !strings.Contains(err.Error(), "peer did not send the SMC option") || !strings.Contains(err.Error(), "peer declined") {
		t.Errorf("message %q", err)
	}
	local := &DeclineError{Code: DeclineSyncError, Local: true}
	if s := local.Error(); !strings.Contains(s, "0x04000000") || strings.Contains(s, "peer declined") {
		t.Errorf("local message %q", s)
	}
	if errors.Is(ErrEyecatcher, ErrDeclined) {
		t.Errorf("a format error reads as a decline")
	}
}

func TestDeclineIgnoresReserved(t *testing.T) {
	// Newer Linux puts its OS type in byte 20 and may set the SMC type bits: read
	// past them, send zeros.
	b := goldenBytes(t, "decline-out-of-sync")
	b[declOffReserved] = 0x30
	b[offVersion] |= byte(SMCTypeN)
	m, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if d := m.(*Decline); !d.OutOfSync || d.Code != DeclineSyncError {
		t.Fatalf("%+v", d)
	}
	if enc, _ := m.AppendTo(nil); enc[declOffReserved] != 0 || enc[offVersion] != 0x18 {
		t.Fatalf("re-encoded % x", enc)
	}
}
