// The attribute table: every configurable attribute with its default, description,
// parser and formatter. `smcrctl show config` prints it like AIX's `lsattr -E`.

package config

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/smcr-io/smcr/internal/ueid"
)

type attribute struct {
	name string
	def  string
	desc string
	set  func(c *Config, v string) error
	get  func(c *Config) string
}

// Attribute describes one attribute for display.
type Attribute struct {
	Name        string `json:"name"`
	Value       string `json:"value"`
	Default     string `json:"default"`
	Description string `json:"description"`
	// Pending is a value set since smcrd started that applies only when it
	// restarts (AtRestart); Value is then the one in effect. Empty otherwise.
	Pending string `json:"pending,omitempty"`
}

// Attributes lists every attribute of c with its value, default and description.
func (c Config) Attributes() []Attribute {
	out := make([]Attribute, 0, len(attributes))
	for _, a := range attributes {
		out = append(out, Attribute{Name: a.name, Value: a.get(&c), Default: a.def, Description: a.desc})
	}
	return out
}

// AttributesSince lists every attribute of c as Attributes does, for an smcrd
// that started with started: an attribute read only at start whose value
// changed since has the value in effect, started's, and c's as Pending.
func (c Config) AttributesSince(started Config) []Attribute {
	out := c.Attributes()
	then := started.Attributes()
	for i := range out {
		if out[i].Value != then[i].Value && AtRestart(out[i].Name) != "" {
			out[i].Pending = out[i].Value
			out[i].Value = then[i].Value
		}
	}
	return out
}

// durationAttr is an attribute held in a time.Duration of Config, between lo
// and hi.
func durationAttr(name, def, desc string, field func(*Config) *time.Duration, lo, hi time.Duration) attribute {
	return attribute{
		name: name, def: def, desc: desc,
		set: func(c *Config, v string) (err error) {
			*field(c), err = parseDuration(v, lo, hi)
			return
		},
		get: func(c *Config) string { return formatDuration(*field(c)) },
	}
}

// offDurationAttr is a durationAttr whose 0 turns what it times off; any other
// value is between lo and hi.
func offDurationAttr(name, def, desc string, field func(*Config) *time.Duration, lo, hi time.Duration) attribute {
	a := durationAttr(name, def, desc, field, lo, hi)
	a.set = func(c *Config, v string) error {
		if d, err := time.ParseDuration(v); err == nil && d == 0 {
			*field(c) = 0
			return nil
		}
		d, err := parseDuration(v, lo, hi)
		if err != nil {
			return fmt.Errorf("%w (or 0: never)", err)
		}
		*field(c) = d
		return nil
	}
	return a
}

// testLinkTimeMin is the shortest test_link_time but 0. Below it an idle link
// group would do little but test its links (at 1us, ~36k TEST_LINKs a second
// here); Linux's smcr_testlink_time is in whole seconds.
const testLinkTimeMin = 100 * time.Millisecond

// atRestart are the attributes smcrd reads only when it starts, with why: a
// change applies at the next start.
var atRestart = map[string]string{
	"providers":       "the RDMA devices are opened at start",
	"rdma_devices":    "the RDMA devices are opened at start",
	"cgroup":          "the programs are attached to the cgroup at start",
	"control_socket":  "the control socket is opened at start",
	"control_group":   "the control socket is opened at start",
	"direct_mode":     "the direct socket is opened at start",
	"monitor_group":   "the control socket is opened at start",
	"metrics_address": "the metrics listener is opened at start",
	"log_level":       "the logger is made at start",
	"log_format":      "the logger is made at start",
}

// AtRestart returns why smcrd reads the attribute only when it starts, so that a
// change applies at the next start; "" for one whose change applies at once.
func AtRestart(name string) string { return atRestart[name] }

// RestartOnly lists, in display order, the attributes smcrd reads only when it
// starts.
func RestartOnly() []string {
	var out []string
	for _, a := range attributes {
		if atRestart[a.name] != "" {
			out = append(out, a.name)
		}
	}
	return out
}

// Names returns the attribute names in display order.
func Names() []string {
	out := make([]string, len(attributes))
	for i, a := range attributes {
		out[i] = a.name
	}
	return out
}

var attributes = []attribute{
	{
		name: "enabled", def: "yes",
		desc: "accelerate matching connections (no: every connection is plain TCP)",
		set:  func(c *Config, v string) (err error) { c.Enabled, err = parseBool(v); return },
		get:  func(c *Config) string { return formatBool(c.Enabled) },
	},
	{
		name: "port_range_list", def: "1024-65535",
		desc: "TCP ports SMC-R is tried for, as 1-20,23,50 (empty: none)",
		set:  func(c *Config, v string) (err error) { c.PortRanges, err = ParsePortRanges(v); return },
		get:  func(c *Config) string { return c.PortRanges.String() },
	},
	{
		name: "ip_addr_list", def: "",
		desc: "interfaces (names or IP addresses, at most 2) whose traffic is accelerated; empty: the first 2 that are up, not loopback and have an address",
		set:  func(c *Config, v string) (err error) { c.Interfaces, err = parseInterfaces(v); return },
		get:  func(c *Config) string { return strings.Join(c.Interfaces, ",") },
	},
	{
		name: "max_memory", def: "256",
		desc: "MB of buffer memory for all connections together; a connection beyond it gets a smaller RMB, down to 16K, then falls back to TCP",
		set:  func(c *Config, v string) (err error) { c.MaxMemory, err = parseMB(v, 1, 1<<20); return },
		get:  func(c *Config) string { return strconv.FormatInt(c.MaxMemory>>20, 10) },
	},
	{
		name: "rmb_size", def: "256K",
		desc: "receive buffer per connection (16K to 512K, rounded up to a power of two)",
		set:  func(c *Config, v string) (err error) { c.RMBSize, err = parseSize(v, 16<<10, 512<<10); return },
		get:  func(c *Config) string { return formatSize(c.RMBSize) },
	},
	{
		name: "sndbuf_size", def: "256K",
		desc: "accepted for AIX compatibility, no effect: a send buffer mirrors the peer's RMB, so its size is the peer's rmb_size",
		set:  func(c *Config, v string) (err error) { c.SendBufSize, err = parseSize(v, 16<<10, 512<<10); return },
		get:  func(c *Config) string { return formatSize(c.SendBufSize) },
	},
	{
		name: "providers", def: "rdma,shm,soft",
		desc: "RDMA providers in order of preference: rdma (verbs hardware), shm (same host), soft (emulated over TCP)",
		set:  func(c *Config, v string) (err error) { c.Providers, err = parseProviders(v); return },
		get:  func(c *Config) string { return strings.Join(c.Providers, ",") },
	},
	{
		name: "rdma_devices", def: "",
		desc: "RDMA device of an interface, as eth0=mlx5_0/1,eth1=mlx5_1 (port 1 when not given), where the device's GID table does not name the interface (empty: found from the GID tables)",
		set:  func(c *Config, v string) (err error) { c.RDMADevices, err = parseRDMADevices(v); return },
		get: func(c *Config) string {
			s := make([]string, len(c.RDMADevices))
			for i, d := range c.RDMADevices {
				s[i] = d.String()
			}
			return strings.Join(s, ",")
		},
	},
	{
		name: "ueid_list", def: "",
		desc: "User EIDs for SMC-R version 2, at most 8, each 1 to 32 of A-Z 0-9 . - and starting with a letter or digit; a version-2 peer must have one of them (empty: none)",
		set:  func(c *Config, v string) (err error) { c.UserEIDs, err = parseUserEIDs(v); return },
		get:  func(c *Config) string { return strings.Join(c.UserEIDs, ",") },
	},
	durationAttr("peer_cache_ttl", "10m",
		"how long a destination (address and port) without SMC-R is connected to directly, without trying again (one that had SMC-R lately, its smcrd restarting say: 5s, doubling while it stays without)",
		func(c *Config) *time.Duration { return &c.PeerCacheTTL }, time.Second, 7*24*time.Hour),
	durationAttr("clc_timeout", "6s",
		"wait for each CLC handshake message before falling back to TCP (Linux: 6s)",
		func(c *Config) *time.Duration { return &c.CLCTimeout }, 10*time.Millisecond, time.Minute),
	offDurationAttr("test_link_time", "30s",
		"how long a link may receive nothing before a TEST_LINK checks that its peer answers, which fails the link if not (Linux: smcr_testlink_time 30s; 0: never)",
		func(c *Config) *time.Duration { return &c.TestLinkTime }, testLinkTimeMin, time.Hour),
	durationAttr("read_spin", "20us",
		"how long a read waiting for bytes polls its link before sleeping, at most (adaptive below it; 0: never, always sleep, and the handshake sleeps too rather than poll its socket for the peer's CLC answer)",
		func(c *Config) *time.Duration { return &c.ReadSpin }, 0, time.Millisecond),
	{
		name: "cgroup", def: "",
		desc: "cgroup v2 path (relative to its mount) whose programs are accelerated; empty: all",
		set: func(c *Config, v string) error {
			// Only a whole element climbs out of the mount: app..slice is a name.
			if slices.Contains(strings.Split(v, "/"), "..") {
				return fmt.Errorf("%q must not contain a .. element", v)
			}
			c.Cgroup = strings.Trim(v, "/")
			return nil
		},
		get: func(c *Config) string { return c.Cgroup },
	},
	{
		name: "control_socket", def: "/run/smcr/smcrd.sock",
		desc: "Unix socket smcrctl talks to smcrd through",
		set: func(c *Config, v string) error {
			if err := unixSocketPath(v); err != nil {
				return err
			}
			c.ControlSocket = v
			return nil
		},
		get: func(c *Config) string { return c.ControlSocket },
	},
	{
		name: "direct_mode", def: "yes",
		desc: "serve the direct mode's library (smcrctl run) on direct.sock beside control_socket, open to every local program (no: programs with the library run as plain TCP)",
		set: func(c *Config, v string) (err error) {
			c.DirectMode, err = parseBool(v)
			return err
		},
		get: func(c *Config) string { return formatBool(c.DirectMode) },
	},
	{
		name: "control_group", def: "",
		desc: "Unix group allowed to use smcrctl besides root (empty: root only)",
		set:  func(c *Config, v string) error { c.ControlGroup = v; return nil },
		get:  func(c *Config) string { return c.ControlGroup },
	},
	{
		name: "monitor_group", def: "",
		desc: "Unix group allowed to read smcrd's state with smcrctl (status, show, stats, tables) but not to change it (empty: none)",
		set:  func(c *Config, v string) error { c.MonitorGroup = v; return nil },
		get:  func(c *Config) string { return c.MonitorGroup },
	},
	{
		name: "metrics_address", def: "127.0.0.1:9464",
		desc: "address of the Prometheus metrics listener (empty: off)",
		set: func(c *Config, v string) error {
			if v != "" {
				if _, err := netip.ParseAddrPort(v); err != nil {
					return fmt.Errorf("%q is not an address:port such as 127.0.0.1:9464", v)
				}
			}
			c.MetricsAddress = v
			return nil
		},
		get: func(c *Config) string { return c.MetricsAddress },
	},
	{
		name: "log_level", def: "info",
		desc: "debug, info, warn or error",
		set: func(c *Config, v string) (err error) {
			c.LogLevel, err = oneOf(v, "debug", "info", "warn", "error")
			return
		},
		get: func(c *Config) string { return c.LogLevel },
	},
	{
		name: "log_format", def: "text",
		desc: "text or json",
		set:  func(c *Config, v string) (err error) { c.LogFormat, err = oneOf(v, "text", "json"); return },
		get:  func(c *Config) string { return c.LogFormat },
	},
}

func attrByName(name string) (*attribute, bool) {
	for i := range attributes {
		if attributes[i].name == name {
			return &attributes[i], true
		}
	}
	return nil, false
}

func builtin() Config {
	var c Config
	for _, a := range attributes {
		if err := a.set(&c, a.def); err != nil {
			panic(fmt.Sprintf("config: default of %s: %v", a.name, err))
		}
	}
	return c
}

func parseBool(v string) (bool, error) {
	switch strings.ToLower(v) {
	case "yes", "true", "on", "1":
		return true, nil
	case "no", "false", "off", "0":
		return false, nil
	}
	return false, fmt.Errorf("%q is not yes or no", v)
}

func formatBool(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// parseMB reads a number of MB, between lo and hi, as bytes. A size written as
// rmb_size takes one (512M) is refused with the number to write instead.
func parseMB(v string, lo, hi uint64) (int64, error) {
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		if size, err := parseSize(v, 1<<20, math.MaxInt); err == nil && size%(1<<20) == 0 {
			return 0, fmt.Errorf("%q is not a number of MB (write %d)", v, size>>20)
		}
		return 0, fmt.Errorf("%q is not a number of MB", v)
	}
	if n < lo || n > hi {
		return 0, fmt.Errorf("%d is out of range %d-%d", n, lo, hi)
	}
	return int64(n) << 20, nil
}

// parseSize reads a byte count with an optional K or M suffix (binary units).
func parseSize(v string, lo, hi int) (int, error) {
	num, mult := v, 1
	switch {
	case strings.HasSuffix(strings.ToUpper(v), "K"):
		num, mult = v[:len(v)-1], 1<<10
	case strings.HasSuffix(strings.ToUpper(v), "M"):
		num, mult = v[:len(v)-1], 1<<20
	}
	n, err := strconv.ParseUint(num, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%q is not a size such as 64K or 1M", v)
	}
	size := int(n) * mult
	if size < lo || size > hi {
		return 0, fmt.Errorf("%s is out of range %s-%s", v, formatSize(lo), formatSize(hi))
	}
	return size, nil
}

func formatSize(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.Itoa(n>>20) + "M"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.Itoa(n>>10) + "K"
	}
	return strconv.Itoa(n)
}

func parseDuration(v string, lo, hi time.Duration) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration such as 30s or 10m", v)
	}
	if d < lo || d > hi {
		return 0, fmt.Errorf("%s is out of range %s-%s", v, formatDuration(lo), formatDuration(hi))
	}
	return d, nil
}

func formatDuration(d time.Duration) string {
	s := d.String() // "10m0s", "1h0m0s": drop the zero tails people don't write
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return strings.Replace(s, "µs", "us", 1) // ASCII in files, as people type it
}

func oneOf(v string, allowed ...string) (string, error) {
	if slices.Contains(allowed, v) {
		return v, nil
	}
	return "", fmt.Errorf("%q is not one of %s", v, strings.Join(allowed, ", "))
}

func parseProviders(v string) ([]string, error) {
	var out []string
	for _, p := range splitList(v) {
		if _, err := oneOf(p, "rdma", "shm", "soft"); err != nil {
			return nil, fmt.Errorf("provider %w", err)
		}
		if slices.Contains(out, p) {
			return nil, fmt.Errorf("provider %q listed twice", p)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no provider given: name at least one of rdma, shm, soft")
	}
	return out, nil
}

func parseInterfaces(v string) ([]string, error) {
	list := splitList(v)
	if len(list) > MaxInterfaces {
		return nil, fmt.Errorf("%d interfaces given, at most %d (one per link of a link group)", len(list), MaxInterfaces)
	}
	for i, s := range list {
		if _, err := netip.ParseAddr(s); err == nil {
			continue
		}
		if strings.ContainsAny(s, fileSyntax) {
			return nil, fmt.Errorf("%q: an interface whose name has %q cannot be listed (the file format uses them); name it by its address", s, fileSyntax)
		}
		if !validIfName(s) {
			return nil, fmt.Errorf("%q is neither an IP address nor an interface name", s)
		}
		if slices.Contains(list[:i], s) {
			return nil, fmt.Errorf("%q listed twice", s)
		}
	}
	return list, nil
}

func parseUserEIDs(v string) ([]string, error) {
	list := splitList(v)
	if len(list) > ueid.Max {
		return nil, fmt.Errorf("%d user EIDs given, at most %d", len(list), ueid.Max)
	}
	for i, s := range list {
		t, err := ueid.Check(s)
		if err != nil {
			return nil, err
		}
		if slices.Contains(list[:i], t) {
			return nil, fmt.Errorf("%q listed twice", t)
		}
		list[i] = t
	}
	return list, nil
}

func parseRDMADevices(v string) ([]RDMADevice, error) {
	var out []RDMADevice
	for _, e := range splitList(v) {
		ifc, dev, ok := strings.Cut(e, "=")
		if !ok {
			return nil, fmt.Errorf("%q is not of the form interface=device[/port]", e)
		}
		ifc, dev = strings.TrimSpace(ifc), strings.TrimSpace(dev)
		d := RDMADevice{Interface: ifc, Port: 1}
		if name, port, ok := strings.Cut(dev, "/"); ok {
			n, err := strconv.Atoi(port)
			if err != nil || n < 1 || n > 255 {
				return nil, fmt.Errorf("%q: port %q is not a number from 1 to 255", e, port)
			}
			dev, d.Port = name, n
		}
		d.Device = dev
		if !validIfName(ifc) || strings.ContainsAny(ifc, fileSyntax) {
			return nil, fmt.Errorf("%q: %q is not an interface name this file can hold", e, ifc)
		}
		if !validDeviceName(dev) {
			return nil, fmt.Errorf("%q: %q is not an RDMA device name", e, dev)
		}
		if slices.ContainsFunc(out, func(o RDMADevice) bool { return o.Interface == ifc }) {
			return nil, fmt.Errorf("interface %s mapped twice", ifc)
		}
		out = append(out, d)
	}
	return out, nil
}

// validDeviceName accepts what RDMA drivers name devices (mlx5_0, rxe0, irdma-x.1):
// letters, digits, '_', '-' and '.', at most 63 bytes (IB_DEVICE_NAME_MAX).
func validDeviceName(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return false
		}
	}
	return true
}

// fileSyntax are the characters the kernel allows in an interface name that the
// configuration file reads as syntax (comment, list and pair separators): a name
// holding one would not read back as written.
const fileSyntax = "#,="

// validIfName follows the kernel's dev_valid_name: 1-15 bytes, no '/', ':' or
// white space (isspace: a line break too, which no file line could hold), and
// no NUL, which ends a name in the kernel's C strings.
func validIfName(s string) bool {
	if s == "" || len(s) > 15 || s == "." || s == ".." {
		return false
	}
	return !strings.ContainsAny(s, "/: \t\n\v\f\r\x00")
}

func splitList(v string) []string {
	var out []string
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// unixSocketPath checks a path smcrd binds a Unix socket to.
func unixSocketPath(v string) error {
	if !strings.HasPrefix(v, "/") {
		return fmt.Errorf("%q is not an absolute path", v)
	}
	// bind would fail at start ("invalid argument"): sun_path holds the path
	// and its terminating NUL. (The direct socket's policy page is a file.)
	if most := len(syscall.RawSockaddrUnix{}.Path) - 1; len(v) > most {
		return fmt.Errorf("%q is %d bytes long, longer than a Unix socket's path may be (%d)", v, len(v), most)
	}
	return nil
}
