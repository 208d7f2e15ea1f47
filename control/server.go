// The control server: HTTP/1.1 + JSON over a Unix socket, serving a Backend.
// Not part of RFC 7609 (see the package doc for the paths).

package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/smcr-io/smcr/config"
)

// maxRequest bounds a request body: the largest is a list of assignments.
const maxRequest = 64 << 10

// Server serves a Backend on a Unix socket.
type Server struct {
	path string
	ln   *net.UnixListener
	hs   *http.Server
	b    Backend
	log  *slog.Logger
	acc  access
}

type credKey struct{}

type credResult struct {
	cred syscall.Ucred
	err  error
}

// NewServer creates the socket at path, usable by root and group (a name or a
// numeric gid; "" for root only), and for reading only by monitor (the same;
// "" for none), and returns a server ready to Serve. A stale socket left by a
// crashed smcrd is replaced; a live one is an error.
func NewServer(path, group, monitor string, b Backend, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	acc, err := newAccess(group, monitor)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("control: socket directory: %w", err)
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control: listen: %w", err)
	}
	mode := os.FileMode(0o600)
	switch {
	case acc.monitorGid >= 0:
		// A file has one group: two groups connect through the mode, and
		// the credentials' check does the rest.
		mode = 0o666
	case acc.gid >= 0:
		mode = 0o660
		if err := os.Chown(path, -1, acc.gid); err != nil {
			ln.Close()
			return nil, fmt.Errorf("control: socket group: %w", err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("control: socket mode: %w", err)
	}
	s := &Server{path: path, ln: ln, b: b, log: log, acc: acc}
	s.hs = &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			cred, err := peerCred(c)
			return context.WithValue(ctx, credKey{}, credResult{cred, err})
		},
	}
	return s, nil
}

// removeStale removes a socket nobody accepts on; it refuses to touch anything else.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("control: %w", err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("control: %s exists and is not a socket", path)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("control: another smcrd already serves %s", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("control: remove stale socket: %w", err)
	}
	return nil
}

// Path returns the socket's path.
func (s *Server) Path() string { return s.path }

// Serve answers requests until Close; it returns nil after Close.
func (s *Server) Serve() error {
	s.log.Info("control socket listening", "path", s.path)
	if err := s.hs.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("control: serve: %w", err)
	}
	return nil
}

// Close stops the server, waiting up to ctx for requests in flight, and removes the
// socket.
func (s *Server) Close(ctx context.Context) error {
	err := s.hs.Shutdown(ctx)
	if err != nil {
		s.hs.Close()
	}
	s.ln.Close()
	return err
}

// Handler returns the API's HTTP handler with the peer-credential check. Requests
// that did not come through a Server's socket (no credentials) are refused.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	get := func(path string, f func(ctx context.Context) (any, error)) {
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) {
			v, err := f(r.Context())
			s.reply(w, r, v, err)
		})
	}
	get("/v1/status", func(ctx context.Context) (any, error) { return s.b.Status(ctx) })
	get("/v1/config", func(ctx context.Context) (any, error) { return nonNil(s.b.Config(ctx)) })
	get("/v1/stats", func(ctx context.Context) (any, error) {
		st, err := s.b.Stats(ctx)
		return fixStats(st), err
	})
	get("/v1/linkgroups", func(ctx context.Context) (any, error) { return nonNil(s.b.LinkGroups(ctx)) })
	get("/v1/links", func(ctx context.Context) (any, error) {
		lgs, err := s.b.LinkGroups(ctx)
		return Links(lgs), err
	})
	get("/v1/conns", func(ctx context.Context) (any, error) { return nonNil(s.b.Conns(ctx)) })
	get("/v1/peers", func(ctx context.Context) (any, error) { return nonNil(s.b.Peers(ctx)) })
	get("/v1/devices", func(ctx context.Context) (any, error) { return nonNil(s.b.Devices(ctx)) })
	get("/v1/listeners", func(ctx context.Context) (any, error) { return nonNil(s.b.Listeners(ctx)) })
	get("/v1/history", func(ctx context.Context) (any, error) { return nonNil(s.b.History(ctx)) })
	mux.HandleFunc("GET /v1/probe", func(w http.ResponseWriter, r *http.Request) {
		dst, err := ParsePeer(r.URL.Query().Get("dst"))
		if err == nil && dst.Port() == 0 {
			err = fmt.Errorf("%q: a destination is an address and a port", r.URL.Query().Get("dst"))
		}
		if err != nil {
			s.reply(w, r, nil, fmt.Errorf("%w: %w", ErrInvalid, err))
			return
		}
		p, err := s.b.Probe(r.Context(), dst)
		s.reply(w, r, p, err)
	})

	mux.HandleFunc("POST /v1/config", func(w http.ResponseWriter, r *http.Request) {
		var req SetConfigRequest
		if err := decode(w, r, &req); err != nil {
			s.reply(w, r, nil, err)
			return
		}
		if len(req.Assignments) == 0 {
			s.reply(w, r, nil, fmt.Errorf("%w: no attribute=value given", ErrInvalid))
			return
		}
		res, err := s.b.SetConfig(r.Context(), req)
		if res.Changed == nil {
			res.Changed = []Attribute{}
		}
		s.log.Info("configuration changed", "assignments", req.Assignments, "persist", req.Persist, "uid", uidOf(r), "err", err)
		s.reply(w, r, res, err)
	})
	for path, on := range map[string]bool{"/v1/enable": true, "/v1/disable": false} {
		mux.HandleFunc("POST "+path, func(w http.ResponseWriter, r *http.Request) {
			var req EnableRequest
			if err := decode(w, r, &req); err != nil {
				s.reply(w, r, nil, err)
				return
			}
			err := s.b.SetEnabled(r.Context(), on, req.Persist)
			s.log.Info("redirection switched", "enabled", on, "persist", req.Persist, "uid", uidOf(r), "err", err)
			s.reply(w, r, struct{}{}, err)
		})
	}
	mux.HandleFunc("POST /v1/peers/forget", func(w http.ResponseWriter, r *http.Request) {
		var req ForgetPeersRequest
		if err := decode(w, r, &req); err != nil {
			s.reply(w, r, nil, err)
			return
		}
		peers := make([]netip.AddrPort, 0, len(req.Addrs))
		for _, a := range req.Addrs {
			p, err := ParsePeer(a)
			if err != nil {
				s.reply(w, r, nil, fmt.Errorf("%w: %w", ErrInvalid, err))
				return
			}
			peers = append(peers, p)
		}
		n, err := s.b.ForgetPeers(r.Context(), peers)
		s.log.Info("peer cache entries forgotten", "peers", req.Addrs, "forgotten", n, "uid", uidOf(r), "err", err)
		s.reply(w, r, ForgetPeersResult{Forgotten: n}, err)
	})
	mux.HandleFunc("POST /v1/stats/reset", func(w http.ResponseWriter, r *http.Request) {
		st, err := s.b.ResetStats(r.Context())
		s.log.Info("statistics reset", "uid", uidOf(r), "err", err)
		s.reply(w, r, fixStats(st), err)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, Error{Error: fmt.Sprintf("no such call: %s %s (this smcrd speaks API v1)", r.Method, r.URL.Path)})
	})

	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cr, ok := r.Context().Value(credKey{}).(credResult)
		var err error
		switch {
		case !ok:
			err = fmt.Errorf("%w: no peer credentials", ErrPermission)
		case cr.err != nil:
			err = fmt.Errorf("%w: %v", ErrPermission, cr.err)
		default:
			err = s.acc.check(cr.cred, r.Method != http.MethodGet)
		}
		if err != nil {
			s.log.Warn("control request refused", "path", r.URL.Path, "pid", cr.cred.Pid, "uid", cr.cred.Uid, "err", err)
			writeJSON(w, http.StatusForbidden, Error{Error: err.Error()})
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func uidOf(r *http.Request) uint32 {
	cr, _ := r.Context().Value(credKey{}).(credResult)
	return cr.cred.Uid
}

// nonNil makes empty lists encode as [] rather than null, for scripts.
func nonNil[T any](v []T, err error) ([]T, error) {
	if v == nil {
		v = []T{}
	}
	return v, err
}

// fixStats makes empty lists encode as [] rather than null, for scripts.
func fixStats(st Stats) Stats {
	st.Fallbacks, _ = nonNil(st.Fallbacks, nil)
	for _, d := range []*Direction{&st.RX, &st.TX} {
		d.BufferSizes, _ = nonNil(d.BufferSizes, nil)
		d.RequestSizes, _ = nonNil(d.RequestSizes, nil)
	}
	return st
}

// Links flattens link groups into their links, each carrying its group's ID, role
// and peer.
func Links(lgs []LinkGroup) []Link {
	out := []Link{}
	for _, lg := range lgs {
		for _, l := range lg.Links {
			l.LinkGroup, l.Role, l.Peer = lg.ID, lg.Role, lg.Peer
			out = append(out, l)
		}
	}
	return out
}

func decode(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequest))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: request body: %v", ErrInvalid, err)
	}
	return nil
}

func (s *Server) reply(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err == nil {
		writeJSON(w, http.StatusOK, v)
		return
	}
	code := http.StatusInternalServerError
	msg := err.Error()
	var cfgErr *config.Error
	switch {
	case errors.Is(err, ErrInvalid), errors.As(err, &cfgErr):
		code = http.StatusBadRequest
		// The status already says "invalid"; the operator wants what and why.
		msg = strings.TrimPrefix(msg, ErrInvalid.Error()+": ")
	case errors.Is(err, ErrPermission):
		code = http.StatusForbidden
	default:
		s.log.Error("control call failed", "path", r.URL.Path, "err", err)
	}
	writeJSON(w, code, Error{Error: msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v) // a failed write means the caller went away: nothing to do
}
