// Package config is smcrd's configuration: the attributes an operator sets, their
// defaults, their validation, and the file format.
//
// The format is the one operators of SMC-R already know from AIX attributes
// (`chdev -l smcrr0 -a port_range_list=1-20,23,50`): one `attribute = value` per line,
// `#` starts a comment, lists are comma-separated. The same `attribute=value` syntax
// is what `smcrctl set` takes, so a line of the file and a command line read alike:
//
//	# accelerate redis and iperf3 over the two RoCE ports
//	enabled         = yes
//	port_range_list = 5201,6379
//	ip_addr_list    = eth0,192.0.2.7
//	max_memory      = 512
//
// Every error names the line, the attribute and what is wrong; a file with any error
// is rejected whole, so nothing is ever half-applied.
package config

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"
)

// Config is the whole configuration of one smcrd.
type Config struct {
	Enabled        bool          // redirect and steer matching connections at all
	PortRanges     PortRanges    // destination/listening ports that SMC-R is tried for
	Interfaces     []string      // ip_addr_list: interface names or IP addresses, at most 2; empty = auto
	MaxMemory      int64         // bytes of RMB and send-buffer memory, all connections together
	RMBSize        int           // receive buffer (RMBE) per connection, bytes
	SendBufSize    int           // send buffer per connection, bytes
	Providers      []string      // RDMA providers in order of preference: rdma, shm, soft
	RDMADevices    []RDMADevice  // interface → RDMA device port, where the GID table cannot tell
	UserEIDs       []string      // ueid_list: SMC-R version 2's User EIDs, unpadded, at most 8
	PeerCacheTTL   time.Duration // how long a peer without SMC-R is connected to directly
	CLCTimeout     time.Duration // wait for each CLC message before falling back
	ReadSpin       time.Duration // a reader's busy poll of its link, at most; 0: none
	TestLinkTime   time.Duration // a link receiving nothing this long is tested; 0: never
	Cgroup         string        // cgroup v2 whose sockets are accelerated; empty = the root
	ControlSocket  string        // smcrctl talks to smcrd here
	ControlGroup   string        // Unix group allowed on the control socket besides root
	DirectMode     bool          // serve the direct mode's libraries on DirectSocket()
	MonitorGroup   string        // Unix group allowed to read, not change, on the control socket
	MetricsAddress string        // Prometheus metrics listener; empty = off
	LogLevel       string        // debug, info, warn, error
	LogFormat      string        // text or json
}

// RDMADevice maps an interface to the RDMA device port that carries its links (the
// PNET table of smc-tools' smc_pnet). Without an entry the device is the one whose
// GID table holds the interface's addresses.
type RDMADevice struct {
	Interface string
	Device    string
	Port      int // 1 when not given
}

func (d RDMADevice) String() string {
	if d.Port == 1 {
		return d.Interface + "=" + d.Device
	}
	return fmt.Sprintf("%s=%s/%d", d.Interface, d.Device, d.Port)
}

// MaxInterfaces is the number of links of a link group (docs/protocol.md, section 3).
const MaxInterfaces = 2

// Default returns the built-in default configuration: every attribute at the default
// of the attribute table. It works out of the box on one machine.
func Default() Config { return builtin() }

// Error is one problem in a configuration: where it is, which attribute, what is wrong.
type Error struct {
	Source string // file name, "set" for smcrctl, or "" when unknown
	Line   int    // 1-based; 0 when not from a file
	Attr   string
	Msg    string
}

// AttrError is an error in the value of attribute name, found after the file at
// path loaded (path "" for the embedded defaults): it names the line that sets
// it, if the file does.
func AttrError(path, name, msg string) *Error {
	e := &Error{Source: path, Attr: name, Msg: msg}
	if text, err := os.ReadFile(path); err == nil {
		e.Line = settingLine(strings.SplitAfter(string(text), "\n"), name) + 1
	}
	return e
}

// printable is s, quoted as Go would if it holds anything that a terminal would
// not show as it is: an error must not echo control characters.
func printable(s string) string {
	if !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Source != "" {
		b.WriteString(e.Source)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Attr != "" {
		b.WriteString(printable(e.Attr))
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// maxLine is the longest line a configuration may have, its end included.
const maxLine = 64 << 10

// Load reads and validates a configuration file. An empty path means the embedded
// default.
func Load(path string) (Config, error) {
	if path == "" {
		return Default(), nil
	}
	f, err := LoadFile(path)
	if err != nil {
		return Config{}, err
	}
	return f.Config, nil
}

// Parse reads a configuration in the attribute = value format. Attributes the file
// does not name keep their defaults.
func Parse(r io.Reader) (Config, error) { return parse(r, "") }

func parse(r io.Reader, source string) (Config, error) {
	c := builtin()
	seen := map[string]int{}
	var errs []error
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, maxLine)
	line := 0
	for sc.Scan() {
		line++
		if bytes.IndexByte(sc.Bytes(), 0) >= 0 {
			// Not a configuration at all: one error, not one per line.
			return Config{}, &Error{Source: source, Line: line, Msg: "not text (a binary file?)"}
		}
		text := strings.TrimSpace(stripComment(sc.Text()))
		if text == "" {
			continue
		}
		name, value, ok := strings.Cut(text, "=")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok || name == "" {
			errs = append(errs, &Error{Source: source, Line: line, Msg: fmt.Sprintf("%q is not of the form attribute = value", text)})
			continue
		}
		if prev, dup := seen[name]; dup {
			errs = append(errs, &Error{Source: source, Line: line, Attr: name, Msg: fmt.Sprintf("set twice (first on line %d)", prev)})
			continue
		}
		seen[name] = line
		if err := c.set(name, value); err != nil {
			err.Source, err.Line = source, line
			errs = append(errs, err)
		}
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return Config{}, &Error{Source: source, Line: line + 1, Msg: fmt.Sprintf("line longer than %d KiB", maxLine>>10)}
	} else if err != nil {
		return Config{}, fmt.Errorf("config: read %s: %w", source, err)
	}
	if len(errs) > 0 {
		return Config{}, errors.Join(errs...)
	}
	return c, nil
}

// Set applies attribute=value assignments (smcrctl set) to a copy of c and returns it
// only if every assignment and the result are valid: nothing is half-applied.
func (c Config) Set(assignments ...string) (Config, error) {
	n := c.clone()
	var errs []error
	seen := map[string]string{}
	for _, a := range assignments {
		name, value, ok := strings.Cut(a, "=")
		if !ok {
			errs = append(errs, &Error{Source: "set", Msg: fmt.Sprintf("%q is not of the form attribute=value", a)})
			continue
		}
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		// As in a file: which of two values was meant is not for Set to guess.
		if prev, dup := seen[name]; dup {
			errs = append(errs, &Error{Source: "set", Attr: name, Msg: fmt.Sprintf("set twice (first as %q)", prev)})
			continue
		}
		seen[name] = value
		if err := n.set(name, value); err != nil {
			err.Source = "set"
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return c, errors.Join(errs...)
	}
	// smcrd saves what was set: refuse what the file would read back otherwise
	// (a '#' in a path starts a comment there).
	if !readsBack(n.Format()) {
		return c, &Error{Source: "set", Msg: "a value would not read back from the configuration file as given ('#' starts a comment there)"}
	}
	return n, nil
}

// readsBack reports whether a formatted configuration parses back to itself.
func readsBack(file []byte) bool {
	back, err := Parse(bytes.NewReader(file))
	return err == nil && bytes.Equal(back.Format(), file)
}

// Get returns the value of one attribute in the file syntax.
func (c Config) Get(name string) (string, bool) {
	a, ok := attrByName(name)
	if !ok {
		return "", false
	}
	return a.get(&c), true
}

// Format writes the configuration as a file that Parse reads back to the same Config,
// each attribute preceded by its description.
func (c Config) Format() []byte {
	var b bytes.Buffer
	b.WriteString("# smcrd configuration (written by smcrd; see `smcrctl show config`)\n")
	for _, a := range attributes {
		fmt.Fprintf(&b, "\n# %s\n%s = %s\n", a.desc, a.name, a.get(&c))
	}
	return b.Bytes()
}

// Save writes the configuration to path atomically (write, fsync, rename, fsync the
// directory). A symlink at path is followed, so the file it points to is replaced
// and the link stays; the file keeps its mode, and its owner when smcrd runs as root.
func (c Config) Save(path string) error {
	if err := save(path, c.Format()); err != nil {
		return fmt.Errorf("config: save: %w", err)
	}
	return nil
}

func save(path string, data []byte) error {
	// A link managed by a tool (a package, a configuration manager) is kept.
	if target, err := filepath.EvalSymlinks(path); err == nil {
		path = target
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	mode, owner := fs.FileMode(0o644), (*syscall.Stat_t)(nil)
	if fi, err := os.Stat(path); err == nil {
		mode = fi.Mode().Perm()
		owner, _ = fi.Sys().(*syscall.Stat_t)
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	err = f.Chmod(mode) // OpenFile's mode went through the umask
	if err == nil && owner != nil && os.Geteuid() == 0 {
		err = f.Chown(int(owner.Uid), int(owner.Gid))
	}
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	// The rename is durable only once the directory is on disk.
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

func (c *Config) set(name, value string) *Error {
	a, ok := attrByName(name)
	if !ok {
		return &Error{Attr: name, Msg: "unknown attribute (smcrctl show config lists them)"}
	}
	if err := a.set(c, value); err != nil {
		return &Error{Attr: name, Msg: err.Error()}
	}
	return nil
}

func (c Config) clone() Config {
	c.PortRanges = slices.Clone(c.PortRanges)
	c.Interfaces = slices.Clone(c.Interfaces)
	c.Providers = slices.Clone(c.Providers)
	return c
}

func stripComment(s string) string {
	if i := strings.IndexByte(s, '#'); i >= 0 {
		return s[:i]
	}
	return s
}

// DirectSocket is where the direct mode's libraries reach smcrd: direct.sock
// beside the control socket (the library's default, /run/smcr/direct.sock,
// is beside the default control socket).
func (c *Config) DirectSocket() string {
	return filepath.Join(filepath.Dir(c.ControlSocket), "direct.sock")
}
