// tc ingress on kernels without tcx (before Linux 6.6, such as Debian 12's 6.1):
// the same program as a cls_bpf filter on the interface's clsact qdisc. A filter
// needs no pin to outlive smcrd, and a restarted smcrd takes it over by replacing
// it in place: one priority and handle are smcr's, so exactly its own filter is
// found, swapped and removed.

package bpf

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const (
	tcPriority   = 0x534d // "SM"
	tcHandle     = 0x5243 // "RC"
	tcFilterName = "smcr_tc_ingress"
)

// openNetlink opens a netlink handle in the network namespace of nsFile, so filters
// are found where the programs serve whichever thread calls.
func openNetlink(nsFile *os.File) (*netlink.Handle, error) {
	h, err := netlink.NewHandleAt(netns.NsHandle(nsFile.Fd()))
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", nsFile.Name(), err)
	}
	return h, nil
}

// attachClsBPF puts prog on ifindex's ingress as smcr's cls_bpf filter, adding the
// clsact qdisc when the interface has none, and replacing the filter of an earlier
// smcrd atomically.
func attachClsBPF(nl *netlink.Handle, ifindex int, prog *ebpf.Program) error {
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := nl.QdiscReplace(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add clsact qdisc: %w", err)
	}
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: ifindex, Parent: netlink.HANDLE_MIN_INGRESS,
			Handle: tcHandle, Priority: tcPriority, Protocol: unix.ETH_P_ALL},
		Fd: prog.FD(), Name: tcFilterName, DirectAction: true,
	}
	if err := nl.FilterReplace(f); err != nil {
		return fmt.Errorf("replace cls_bpf filter: %w", err)
	}
	return nil
}

// clsBPFFilters returns smcr's ingress filters, by interface index.
func clsBPFFilters(nl *netlink.Handle) (map[int]netlink.Filter, error) {
	links, err := retryDump(nl.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	out := map[int]netlink.Filter{}
	for _, lk := range links {
		fs, err := retryDump(func() ([]netlink.Filter, error) { return nl.FilterList(lk, netlink.HANDLE_MIN_INGRESS) })
		if err != nil {
			continue // no clsact qdisc, or the interface went away
		}
		for _, f := range fs {
			a := f.Attrs()
			if bf, ok := f.(*netlink.BpfFilter); ok && a.Priority == tcPriority && a.Handle == tcHandle && bf.Name == tcFilterName {
				out[a.LinkIndex] = f
			}
		}
	}
	return out, nil
}

// detachClsBPF removes smcr's filters from every interface not in keep; the
// clsact qdisc stays, since other programs may use it.
func detachClsBPF(nl *netlink.Handle, keep map[int]bool) (removed []string, err error) {
	fs, err := clsBPFFilters(nl)
	if err != nil {
		return nil, err
	}
	var errs []error
	for idx, f := range fs {
		if keep[idx] {
			continue
		}
		name := fmt.Sprint(idx)
		if lk, err := nl.LinkByIndex(idx); err == nil {
			name = lk.Attrs().Name
		}
		if err := nl.FilterDel(f); err != nil {
			errs = append(errs, fmt.Errorf("remove cls_bpf filter from %s: %w", name, err))
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}
