package ueid

import (
	"errors"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	ok := map[string]string{
		"SMCR-V2PROBE.UEID":      "SMCR-V2PROBE.UEID",
		"0":                      "0",
		"A.B-C  ":                "A.B-C",
		strings.Repeat("Z", Len): strings.Repeat("Z", Len),
	}
	for in, want := range ok {
		if got, err := Check(in); err != nil || got != want {
			t.Errorf("Check(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	bad := map[string]string{
		"":                         "empty",
		"   ":                      "empty",
		"lower":                    "character 'l' at 1",
		".DOT":                     "starts with '.'",
		"-DASH":                    "starts with '-'",
		"SPACE INSIDE":             "character ' ' at 6",
		"UNDER_SCORE":              "character '_' at 6",
		strings.Repeat("Z", Len+1): "33 characters, at most 32",
		"\xc3\x84RGER":             "character 'Ä' at 1",
	}
	for in, want := range bad {
		_, err := Check(in)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("Check(%q) = %v; want ErrInvalid saying %q", in, err, want)
		}
	}
}
