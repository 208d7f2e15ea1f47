// Package control is smcrd's control API: the operator's way in, used by smcrctl.
// It is not part of RFC 7609; it exposes the state RFC 7609 §3 defines (link groups,
// links, connections) and the counters Linux smc-tools shows.
//
// The API is HTTP/1.1 with JSON bodies over a Unix socket, so it can be explored with
// curl:
//
//	curl --unix-socket /run/smcr/smcrd.sock http://smcrd/v1/stats
//
// Paths carry the API version; a future incompatible version gets /v2 beside /v1.
//
//	GET  /v1/status        Status
//	GET  /v1/config        []Attribute
//	POST /v1/config        SetConfigRequest   → SetConfigResult
//	POST /v1/enable        EnableRequest
//	POST /v1/disable       EnableRequest
//	GET  /v1/stats         Stats
//	POST /v1/stats/reset   → Stats (the counters just before the reset)
//	GET  /v1/linkgroups    []LinkGroup
//	GET  /v1/links         []Link (every link of every group)
//	GET  /v1/conns         []Conn
//	GET  /v1/peers         []Peer
//	POST /v1/peers/forget  ForgetPeersRequest → ForgetPeersResult
//	GET  /v1/devices       []Device
//
// Errors are a status code with an Error body: 400 for a request smcrd refuses
// (a bad attribute value), 403 for a caller that is neither root nor in the control
// group, 404 for an unknown path, 500 for a failure inside smcrd.
//
// Access: the socket is created mode 0660, owned by root and the control group (or
// 0600 without one), and every connection's peer credentials (SO_PEERCRED) are
// checked again, so a socket file copied or re-permissioned by mistake still admits
// only root, smcrd's own user and members of the group.
//
// smcrd implements Backend; NewServer serves it; Client is the typed client.
package control
