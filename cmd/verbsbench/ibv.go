// Whether this binary has the real-RDMA provider, so -provider rdma can say how to
// get it instead of failing deep inside the session.

package main

// ibvBuilt is set by ibv_tag.go when built with -tags ibv.
var ibvBuilt bool
