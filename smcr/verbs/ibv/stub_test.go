//go:build !ibv

package ibv

import (
	"errors"
	"testing"

	"github.com/smcr-io/smcr/smcr/verbs"
)

func TestOpenWithoutTag(t *testing.T) {
	if _, err := Open(Config{Device: "rxe0"}); !errors.Is(err, verbs.ErrUnsupported) {
		t.Fatalf("Open without the ibv tag: %v, want ErrUnsupported", err)
	}
}
