// Tests of version 2.1's negotiation rules and their decline codes.

package clc

import (
	"errors"
	"testing"
)

// checkTerms wants the terms want, or a Decline with code when code is set.
func checkTerms(t *testing.T, name string, got V2Terms, err error, want V2Terms, code DeclineCode) {
	t.Helper()
	if code != 0 {
		if !errors.Is(err, code) {
			t.Errorf("%s: %v, want %v", name, err, code)
		}
		return
	}
	if err != nil || got != want {
		t.Errorf("%s: %+v, %v; want %+v", name, got, err, want)
	}
}

var own21 = V2Terms{Release: Release21, MaxConns: 255, MaxLinks: 2, FeatureMask: 0x1}

func TestServerTerms(t *testing.T) {
	tests := []struct {
		name string
		prop *ProposalV2
		want V2Terms
		code DeclineCode
	}{
		{"2.0 client gets 2.0's fixed terms", &ProposalV2{Release: 0, MaxConns: 20, MaxLinks: 1}, V2Terms{Release: 0, MaxConns: 255, MaxLinks: 2}, 0},
		{"2.1 lower of both", &ProposalV2{Release: 1, MaxConns: 64, MaxLinks: 1, FeatureMask: 0x3}, V2Terms{Release: 1, MaxConns: 64, MaxLinks: 1, FeatureMask: 0x1}, 0},
		{"newer release is met at ours", &ProposalV2{Release: 5, MaxConns: 255, MaxLinks: 3}, V2Terms{Release: 1, MaxConns: 255, MaxLinks: 2}, 0},
		{"max conns below 16", &ProposalV2{Release: 1, MaxConns: 15, MaxLinks: 1}, V2Terms{}, DeclineMaxConnsMismatch},
		{"max links 0", &ProposalV2{Release: 1, MaxConns: 16, MaxLinks: 0}, V2Terms{}, DeclineMaxLinksMismatch},
		{"no v2 extension", nil, V2Terms{}, DeclineNoV2Extension},
	}
	for _, tt := range tests {
		got, err := ServerTerms(tt.prop, own21)
		checkTerms(t, tt.name, got, err, tt.want, tt.code)
	}
	// A 2.0 server answers a 2.1 client with 2.0.
	if got, err := ServerTerms(&ProposalV2{Release: 1, MaxConns: 16, MaxLinks: 1}, V2Terms{Release: 0}); err != nil || got.Release != 0 || got.MaxConns != 255 {
		t.Errorf("2.0 server: %+v, %v", got, err)
	}
}

func TestClientTerms(t *testing.T) {
	tests := []struct {
		name string
		fce  FirstContactExt
		want V2Terms
		code DeclineCode
	}{
		{"2.0 server", FirstContactExt{Release: 0}, V2Terms{MaxConns: 255, MaxLinks: 2}, 0},
		{"2.1 server's values", FirstContactExt{Release: 1, MaxConns: 32, MaxLinks: 1, FeatureMask: 3}, V2Terms{Release: 1, MaxConns: 32, MaxLinks: 1, FeatureMask: 1}, 0},
		{"release above ours", FirstContactExt{Release: 2, MaxConns: 32, MaxLinks: 1}, V2Terms{}, DeclineReleaseMismatch},
		{"max conns below 16", FirstContactExt{Release: 1, MaxConns: 8, MaxLinks: 1}, V2Terms{}, DeclineMaxConnsMismatch},
		{"max links 3", FirstContactExt{Release: 1, MaxConns: 16, MaxLinks: 3}, V2Terms{}, DeclineMaxLinksMismatch},
		{"max links 0", FirstContactExt{Release: 1, MaxConns: 16}, V2Terms{}, DeclineMaxLinksMismatch},
	}
	for _, tt := range tests {
		got, err := ClientTerms(&tt.fce, own21)
		checkTerms(t, tt.name, got, err, tt.want, tt.code)
	}
}

func TestCheckConfirmTerms(t *testing.T) {
	agreed := V2Terms{Release: 1, MaxConns: 64, MaxLinks: 1, FeatureMask: 1}
	if f, err := CheckConfirmTerms(&FirstContactExt{Release: 1, MaxConns: 64, MaxLinks: 1, FeatureMask: 1}, agreed); err != nil || f != 1 {
		t.Fatalf("echo: %d, %v", f, err)
	}
	for _, tt := range []struct {
		fce  FirstContactExt
		code DeclineCode
	}{
		{FirstContactExt{Release: 0}, DeclineReleaseMismatch},
		{FirstContactExt{Release: 1, MaxConns: 65, MaxLinks: 1}, DeclineMaxConnsMismatch},
		{FirstContactExt{Release: 1, MaxConns: 64, MaxLinks: 2}, DeclineMaxLinksMismatch},
	} {
		if _, err := CheckConfirmTerms(&tt.fce, agreed); !errors.Is(err, tt.code) {
			t.Errorf("%+v: %v, want %v", tt.fce, err, tt.code)
		}
	}
	// Release 2.0 carries no terms to compare.
	if _, err := CheckConfirmTerms(&FirstContactExt{Release: 0, MaxConns: 1}, V2Terms{Release: 0}); err != nil {
		t.Fatalf("2.0: %v", err)
	}
}

func TestMatchEID(t *testing.T) {
	a, b, c := mustEID("A"), mustEID("B"), mustEID("C")
	if e, err := MatchEID([]EID{c, b, a}, []EID{a, b}); err != nil || e != b {
		t.Fatalf("MatchEID = %v, %v; want the peer's first common, B", e, err)
	}
	if _, err := MatchEID([]EID{c}, []EID{a, b}); !errors.Is(err, DeclineNoUEID) {
		t.Fatalf("no common eid: %v", err)
	}
	if _, err := MatchEID(nil, []EID{a}); !errors.Is(err, DeclineNoUEID) {
		t.Fatalf("peer without eids: %v", err)
	}
}
