// ip_addr_list resolved against the host: which interfaces carry SMC-R links.

package config

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
)

// Interface is a host network interface as ip_addr_list resolution sees it.
type Interface struct {
	Name  string
	Up    bool
	Loop  bool
	Addrs []netip.Prefix
}

// HostInterfaces lists this network namespace's interfaces.
func HostInterfaces() ([]Interface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("config: list interfaces: %w", err)
	}
	out := make([]Interface, 0, len(ifs))
	for _, i := range ifs {
		addrs, err := i.Addrs()
		if err != nil {
			return nil, fmt.Errorf("config: addresses of %s: %w", i.Name, err)
		}
		in := Interface{Name: i.Name, Up: i.Flags&net.FlagUp != 0, Loop: i.Flags&net.FlagLoopback != 0}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				ip, _ := netip.AddrFromSlice(n.IP)
				ones, _ := n.Mask.Size()
				in.Addrs = append(in.Addrs, netip.PrefixFrom(ip.Unmap(), ones))
			}
		}
		out = append(out, in)
	}
	return out, nil
}

// ResolveInterfaces maps ip_addr_list to interfaces of the host: a name must exist, an
// address must belong to some interface. An empty list means the first MaxInterfaces
// interfaces that are up, not loopback and have an address; none is an error.
func ResolveInterfaces(list []string, host []Interface) ([]Interface, error) {
	if len(list) == 0 {
		var out []Interface
		for _, i := range host {
			if i.Up && !i.Loop && len(i.Addrs) > 0 && len(out) < MaxInterfaces {
				out = append(out, i)
			}
		}
		if len(out) == 0 {
			return nil, &Error{Attr: "ip_addr_list", Msg: "empty and no interface is up, not loopback and with an address: name the interfaces to use"}
		}
		return out, nil
	}
	var out []Interface
	for _, entry := range list {
		i, err := findInterface(entry, host)
		if err != nil {
			return nil, &Error{Attr: "ip_addr_list", Msg: err.Error()}
		}
		if slices.ContainsFunc(out, func(o Interface) bool { return o.Name == i.Name }) {
			return nil, &Error{Attr: "ip_addr_list", Msg: fmt.Sprintf("%q names interface %s a second time", entry, i.Name)}
		}
		out = append(out, i)
	}
	return out, nil
}

func findInterface(entry string, host []Interface) (Interface, error) {
	addr, err := netip.ParseAddr(entry)
	for _, i := range host {
		if err != nil && i.Name == entry {
			return i, nil
		}
		if err == nil && slices.ContainsFunc(i.Addrs, func(p netip.Prefix) bool { return p.Addr() == addr.Unmap() }) {
			return i, nil
		}
	}
	if err == nil {
		return Interface{}, fmt.Errorf("no interface has address %s", addr)
	}
	return Interface{}, fmt.Errorf("no interface named %q", entry)
}
