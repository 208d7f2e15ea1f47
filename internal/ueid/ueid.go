// Package ueid checks User EIDs, the names SMC-R version 2 peers must share to
// talk (Linux's smc_clc_ueid_valid), for the configuration and the CLC codec alike.
package ueid

import (
	"errors"
	"fmt"
	"strings"
)

// Len is a User EID's length on the wire, where it is padded with blanks.
const Len = 32

// Max is the most User EIDs a host may have (SMC_CLC_MAX_UEID).
const Max = 8

// Allowed names the characters a User EID may have, for error messages.
const Allowed = "A-Z 0-9 . -"

// ErrInvalid is wrapped by Check's errors.
var ErrInvalid = errors.New("invalid user EID")

// Check returns s without its trailing blanks (the wire's padding) when it is a
// User EID: 1 to Len characters, the first an upper-case letter or a digit, the
// others upper-case letters, digits, '.' or '-'.
func Check(s string) (string, error) {
	t := strings.TrimRight(s, " ")
	switch {
	case t == "":
		return "", fmt.Errorf("%q: empty: %w", s, ErrInvalid)
	case len(t) > Len:
		return "", fmt.Errorf("%q: %d characters, at most %d: %w", s, len(t), Len, ErrInvalid)
	case t[0] == '.' || t[0] == '-':
		return "", fmt.Errorf("%q: starts with %q, must start with a letter or digit: %w", s, t[0], ErrInvalid)
	}
	for i, c := range t {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			return "", fmt.Errorf("%q: character %q at %d, allowed are %s: %w", s, c, i+1, Allowed, ErrInvalid)
		}
	}
	return t, nil
}
