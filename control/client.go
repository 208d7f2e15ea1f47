// The typed client of the control API, one method per call; smcrctl's only way to
// smcrd. Not part of RFC 7609 (see the package doc).

package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// maxResponse bounds what the client reads: a host with thousands of connections
// answers a few MB.
const maxResponse = 64 << 20

// Client talks to one smcrd through its control socket.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient returns a client for the socket at path. Nothing is dialled until the
// first call.
func NewClient(path string) *Client {
	d := net.Dialer{Timeout: 5 * time.Second}
	return &Client{
		socket: path,
		hc: &http.Client{
			Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					return d.DialContext(ctx, "unix", path)
				},
				DisableCompression: true,
			},
		},
	}
}

// Socket returns the path the client dials.
func (c *Client) Socket() string { return c.socket }

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Status returns smcrd's overall state.
func (c *Client) Status(ctx context.Context) (st Status, err error) {
	return st, c.do(ctx, "GET", "/v1/status", nil, &st)
}

// Config returns every attribute with its value, default and description.
func (c *Client) Config(ctx context.Context) (a []Attribute, err error) {
	return a, c.do(ctx, "GET", "/v1/config", nil, &a)
}

// SetConfig applies attribute=value assignments, all or none.
func (c *Client) SetConfig(ctx context.Context, req SetConfigRequest) (r SetConfigResult, err error) {
	return r, c.do(ctx, "POST", "/v1/config", req, &r)
}

// Enable turns redirection of matching connections on.
func (c *Client) Enable(ctx context.Context, persist bool) error {
	return c.do(ctx, "POST", "/v1/enable", EnableRequest{Persist: persist}, nil)
}

// Disable turns redirection off: new connections are plain TCP.
func (c *Client) Disable(ctx context.Context, persist bool) error {
	return c.do(ctx, "POST", "/v1/disable", EnableRequest{Persist: persist}, nil)
}

// Stats returns the counters.
func (c *Client) Stats(ctx context.Context) (st Stats, err error) {
	return st, c.do(ctx, "GET", "/v1/stats", nil, &st)
}

// ResetStats zeroes the counters and returns their values just before.
func (c *Client) ResetStats(ctx context.Context) (st Stats, err error) {
	return st, c.do(ctx, "POST", "/v1/stats/reset", nil, &st)
}

// LinkGroups returns the link groups with their links.
func (c *Client) LinkGroups(ctx context.Context) (l []LinkGroup, err error) {
	return l, c.do(ctx, "GET", "/v1/linkgroups", nil, &l)
}

// Links returns every link of every link group.
func (c *Client) Links(ctx context.Context) (l []Link, err error) {
	return l, c.do(ctx, "GET", "/v1/links", nil, &l)
}

// Conns returns the connections smcrd handles.
func (c *Client) Conns(ctx context.Context) (l []Conn, err error) {
	return l, c.do(ctx, "GET", "/v1/conns", nil, &l)
}

// ForgetPeers takes addrs out of the peer cache (IP addresses, every port of
// them, or addresses and ports, as ParsePeer reads them; all entries when none
// is given) and returns how many entries went.
func (c *Client) ForgetPeers(ctx context.Context, addrs ...string) (int, error) {
	var r ForgetPeersResult
	return r.Forgotten, c.do(ctx, "POST", "/v1/peers/forget", ForgetPeersRequest{Addrs: addrs}, &r)
}

// Peers returns the peer capability cache.
func (c *Client) Peers(ctx context.Context) (l []Peer, err error) {
	return l, c.do(ctx, "GET", "/v1/peers", nil, &l)
}

// Devices returns the RDMA devices.
func (c *Client) Devices(ctx context.Context) (l []Device, err error) {
	return l, c.do(ctx, "GET", "/v1/devices", nil, &l)
}

// Listeners returns the TCP listeners and whether smcrd steers their connections.
func (c *Client) Listeners(ctx context.Context) (l []Listener, err error) {
	return l, c.do(ctx, "GET", "/v1/listeners", nil, &l)
}

// History returns the last connections that ended, newest first.
func (c *Client) History(ctx context.Context) (l []ClosedConn, err error) {
	return l, c.do(ctx, "GET", "/v1/history", nil, &l)
}

// Probe asks whether a connection to dst (address:port) would be tried over
// SMC-R now, and why not.
func (c *Client) Probe(ctx context.Context, dst string) (p Probe, err error) {
	return p, c.do(ctx, "GET", "/v1/probe?dst="+url.QueryEscape(dst), nil, &p)
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("control: %s: %w", path, err)
		}
		body = bytes.NewReader(b)
	}
	// The host part is ignored by the Unix dialer; "smcrd" reads well in logs.
	req, err := http.NewRequestWithContext(ctx, method, "http://smcrd"+path, body)
	if err != nil {
		return fmt.Errorf("control: %s: %w", path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return c.dialError(path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return fmt.Errorf("control: %s: read answer: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e Error
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		if resp.StatusCode == http.StatusNotFound {
			msg += " (is smcrd older than smcrctl?)"
		}
		return &APIError{StatusCode: resp.StatusCode, Message: msg}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("control: %s: decode answer: %w", path, err)
	}
	return nil
}

// dialError turns the usual ways of finding no daemon into a NotRunningError, and a
// refused connect into ErrPermission with a hint.
func (c *Client) dialError(path string, err error) error {
	switch {
	case errors.Is(err, syscall.ENOENT):
		return &NotRunningError{Socket: c.socket}
	case errors.Is(err, syscall.ECONNREFUSED):
		return &NotRunningError{Socket: c.socket, Stale: true}
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return fmt.Errorf("%w on %s: run as root or as a member of smcrd's control_group", ErrPermission, c.socket)
	}
	return fmt.Errorf("control: %s: %w", path, err)
}
