// Providers: opens the RDMA devices the configuration names, in its order of
// preference, for the engine's links (RFC 7609 §2.1: an RNIC per link; here also
// the shm and soft stand-ins).

package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"

	"github.com/smcr-io/smcr/config"
	"github.com/smcr-io/smcr/smcr/verbs"
	"github.com/smcr-io/smcr/smcr/verbs/ibv"
	"github.com/smcr-io/smcr/smcr/verbs/shm"
	"github.com/smcr-io/smcr/smcr/verbs/soft"
)

// maxDevices is the engine's limit: one device per link, two links per group.
const maxDevices = 2

// openDevices opens up to maxDevices devices, trying the providers in the order
// given. A provider that cannot run here (rdma without the ibv build tag or without
// hardware) is skipped with a log line; none at all is not an error: every
// connection then falls back to TCP, which the operator sees in smcrctl stats.
// own tags the soft provider's sockets as smcrd's, so the connect hooks leave them
// alone.
// rdma maps interfaces to their devices where the GID tables cannot tell
// (rdma_devices).
func openDevices(providers []string, ifaces []config.Interface, rdma []config.RDMADevice, shmDir string,
	own func(network, address string, c syscall.RawConn) error, log *slog.Logger) []verbs.Device {
	var devs []verbs.Device
	for _, m := range rdma {
		if !slices.ContainsFunc(ifaces, func(i config.Interface) bool { return i.Name == m.Interface }) {
			log.Warn("rdma_devices names an interface smcrd does not use: ignored", "entry", m.String(), "interfaces", ifaceNames(ifaces))
		}
	}
	for _, p := range providers {
		if len(devs) >= maxDevices {
			break
		}
		switch p {
		case "rdma":
			for _, i := range ifaces {
				if len(devs) >= maxDevices {
					break
				}
				d, err := ibv.Open(ibvConfig(i.Name, rdma, log))
				if err != nil {
					lvl := slog.LevelWarn
					if errors.Is(err, verbs.ErrUnsupported) {
						lvl = slog.LevelInfo
					}
					log.Log(context.Background(), lvl, "provider rdma not available", "interface", i.Name, "err", err)
					continue
				}
				devs = append(devs, d)
			}
		case "shm":
			d, err := shm.Open(shm.Config{Dir: shmDir, Logger: log})
			if err != nil {
				log.Warn("provider shm not available", "err", err)
				continue
			}
			devs = append(devs, d)
		case "soft":
			// One emulated RNIC per interface, as rdma has one per port: two
			// interfaces give a link group its two links.
			opened := false
			for _, i := range ifaces {
				if len(devs) >= maxDevices {
					break
				}
				ip, ok := listenAddr(i)
				if !ok {
					continue
				}
				d, err := soft.Open(soft.Config{
					ListenAddr: netip.AddrPortFrom(ip, 0).String(),
					Netdev:     i.Name,
					Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
						var dl net.Dialer
						dl.SetMultipathTCP(false)
						dl.Control = sharedPort(own) // redirect.go
						return dl.DialContext(ctx, network, addr)
					},
					Logger: log,
				})
				if err != nil {
					log.Warn("provider soft not available", "interface", i.Name, "err", err)
					continue
				}
				devs = append(devs, d)
				opened = true
			}
			if !opened && len(devs) < maxDevices {
				log.Warn("provider soft not available: no interface address to listen on")
			}
		default:
			log.Warn("unknown provider ignored", "provider", p)
		}
	}
	for _, d := range devs {
		log.Info("device open", "provider", d.Kind(), "name", d.Name(), "netdev", d.Port().Netdev)
	}
	if len(devs) == 0 {
		// smcrd still runs (its configuration may be changed and it
		// restarted), and leaves every connection to go direct (Run).
		log.Warn("no provider opened a device: no connection can use SMC-R; see the warnings above, or set providers and restart smcrd",
			"providers", strings.Join(providers, ","))
	}
	return devs
}

// ibvConfig selects the RDMA device port of an interface: the one rdma_devices
// names, else the one whose GID table holds the interface's addresses.
func ibvConfig(iface string, rdma []config.RDMADevice, log *slog.Logger) ibv.Config {
	cfg := ibv.Config{Interface: iface, GIDIndex: -1, Logger: log}
	if k := slices.IndexFunc(rdma, func(m config.RDMADevice) bool { return m.Interface == iface }); k >= 0 {
		cfg.Device, cfg.Port = rdma[k].Device, rdma[k].Port
	}
	return cfg
}

// listenAddr is the interface's first IPv4 address (else its first global IPv6
// one): where the soft provider listens for its peers.
func listenAddr(i config.Interface) (netip.Addr, bool) {
	for _, want4 := range []bool{true, false} {
		for _, p := range i.Addrs {
			a := p.Addr()
			if a.Is4() == want4 && (a.Is4() || a.IsGlobalUnicast()) {
				return a, true
			}
		}
	}
	return netip.Addr{}, false
}

func closeDevices(devs []verbs.Device) error {
	var errs []error
	for _, d := range devs {
		if err := d.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", d.Name(), err))
		}
	}
	return errors.Join(errs...)
}
