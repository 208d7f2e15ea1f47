//go:build !ibv

// Stand-in for builds without the "ibv" tag (no rdma-core needed): the provider
// reports itself unsupported.

package ibv

import (
	"fmt"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// Open opens a device port. Without the ibv build tag it always fails with
// verbs.ErrUnsupported.
func Open(cfg Config) (verbs.Device, error) {
	return nil, fmt.Errorf("ibv: built without the ibv tag: %w", verbs.ErrUnsupported)
}
