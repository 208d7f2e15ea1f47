package vm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// aptStubs are stand-ins for the tools kernel.sh calls, over lists that name
// linux-image-6.1.0-98-amd64 until "apt-get update" makes them name -99, and
// an archive that serves only -99: a machine whose lists predate a Debian
// kernel update, as on one kept from an earlier session.
var aptStubs = map[string]string{
	"apt-cache": `#!/bin/sh
[ "$1" = depends ] || exit 1
echo linux-image-amd64
if [ -e "$STUB_STATE/updated" ]; then echo "  Depends: linux-image-6.1.0-99-amd64"
else echo "  Depends: linux-image-6.1.0-98-amd64"; fi
`,
	"apt-get": `#!/bin/sh
case $1 in
update) touch "$STUB_STATE/updated" ;;
download)
	echo "$2" >>"$STUB_STATE/downloads"
	[ "$2" = linux-image-6.1.0-99-amd64 ] || { echo "E: Failed to fetch $2: 404  Not Found" >&2; exit 100; }
	touch "$2_6.1.999-1_amd64.deb" ;;
*) exit 1 ;;
esac
`,
	"dpkg-deb": `#!/bin/sh
[ "$1" = -x ] && mkdir -p "$3/boot"
`,
	"depmod": "#!/bin/sh\n",
}

// TestKernelAfterDebianUpdate: when the lists name a kernel package the archive no
// longer serves, kernel.sh refreshes them and fetches the kernel they then name,
// instead of failing every VM test until someone runs apt-get update by hand.
func TestKernelAfterDebianUpdate(t *testing.T) {
	stubs, state, cache := t.TempDir(), t.TempDir(), t.TempDir()
	for name, body := range aptStubs {
		if err := os.WriteFile(filepath.Join(stubs, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run := func() string {
		t.Helper()
		cmd := exec.Command(filepath.Join(Dir(), "kernel.sh"))
		cmd.Env = append(os.Environ(), "PATH="+stubs+":"+os.Getenv("PATH"), "STUB_STATE="+state, "SMCR_VM_CACHE="+cache)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("kernel.sh: %v\n%s", err, stderr.String())
		}
		return strings.TrimSpace(string(out))
	}
	if got := run(); got != "6.1.0-99-amd64" {
		t.Fatalf("kernel.sh printed %q, want 6.1.0-99-amd64", got)
	}
	if _, err := os.Stat(filepath.Join(cache, "kernel-6.1.0-99-amd64", ".done")); err != nil {
		t.Fatalf("kernel not unpacked: %v", err)
	}
	// A second run finds it in the cache and downloads nothing.
	before, _ := os.ReadFile(filepath.Join(state, "downloads"))
	if got := run(); got != "6.1.0-99-amd64" {
		t.Fatalf("second run printed %q", got)
	}
	if after, _ := os.ReadFile(filepath.Join(state, "downloads")); string(after) != string(before) {
		t.Fatalf("second run downloaded again: %q", after)
	}
}

// TestRunWithoutKernel: when run.sh cannot prepare the VM (here no kernel
// package can be resolved), Run says the guest did not run the command, rather
// than passing on the harness's own exit status as the guest's.
func TestRunWithoutKernel(t *testing.T) {
	requireVM(t)
	stubs := t.TempDir()
	for name, body := range map[string]string{
		"apt-cache": "#!/bin/sh\n",
		"apt-get":   "#!/bin/sh\nexit 100\n",
	} {
		if err := os.WriteFile(filepath.Join(stubs, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", stubs+":"+os.Getenv("PATH"))
	t.Setenv("SMCR_VM_CACHE", t.TempDir())
	res, err := Run(context.Background(), Options{Args: []string{"true"}})
	if err == nil || !strings.Contains(err.Error(), "did not run the command") {
		t.Fatalf("Run: exit %d, err %v, want an error saying the guest did not run the command\n%s", res.ExitCode, err, res.Output)
	}
}

// TestRunWithDynamicBusybox: a dynamically linked busybox, which the guest's
// initramfs (no libraries) cannot run, is refused before the VM starts, with
// what to install, not reported as the guest's failure.
func TestRunWithDynamicBusybox(t *testing.T) {
	requireVM(t)
	t.Setenv("SMCR_VM_BUSYBOX", "/bin/bash") // any dynamic executable
	res, err := Run(context.Background(), Options{Args: []string{"true"}})
	if err == nil || !strings.Contains(err.Error(), "did not run the command") || !strings.Contains(string(res.Output), "install busybox-static") {
		t.Fatalf("Run: exit %d, err %v, want a refusal naming busybox-static\n%s", res.ExitCode, err, res.Output)
	}
}

// TestRunAccel: SMCR_VM_ACCEL picks qemu's accelerator. Anything but tcg or
// kvm is refused before the VM starts, and so is kvm on a host without a
// /dev/kvm we may use (these machines); where there is one, the guest runs
// under KVM.
func TestRunAccel(t *testing.T) {
	requireVM(t)
	t.Run("unknown", func(t *testing.T) {
		t.Setenv("SMCR_VM_ACCEL", "hvf")
		res, err := Run(context.Background(), Options{Args: []string{"true"}})
		if err == nil || !strings.Contains(string(res.Output), "want tcg or kvm") {
			t.Fatalf("Run: exit %d, err %v, want a refusal naming tcg and kvm\n%s", res.ExitCode, err, res.Output)
		}
	})
	t.Run("kvm", func(t *testing.T) {
		t.Setenv("SMCR_VM_ACCEL", "kvm")
		usable := unix.Access("/dev/kvm", unix.R_OK|unix.W_OK) == nil
		if usable {
			if why := kvmUnusable(); why != "" {
				t.Skipf("this host's /dev/kvm makes no VM: %s", why)
			}
		}
		// Under KVM that works, true takes seconds; a KVM that hangs the
		// guest in early boot costs this much of every run.
		res, err := Run(context.Background(), Options{Args: []string{"true"}, Timeout: 30 * time.Second})
		if usable {
			if err != nil || res.ExitCode != 0 {
				// Some of these machines have a /dev/kvm whose (nested)
				// KVM boots no guest: qemu aborts setting MSR 0x10a, or
				// the guest hangs in early boot (MACHINE.md: "KVM does
				// not work here"). run.sh's own refusals still fail.
				if out := string(res.Output); !strings.Contains(out, "SMCR_VM_ACCEL") &&
					(strings.Contains(out, "the guest did not run the command (qemu exit") || strings.Contains(out, "vm: timed out")) {
					t.Skipf("this host's KVM boots no guest (exit %d):\n%s", res.ExitCode, lastLines(res.Output, 3))
				}
				t.Fatalf("under KVM: exit %d, err %v\n%s", res.ExitCode, err, res.Output)
			}
			return
		}
		if err == nil || !strings.Contains(string(res.Output), "/dev/kvm") {
			t.Fatalf("Run without /dev/kvm: exit %d, err %v, want a refusal naming /dev/kvm\n%s", res.ExitCode, err, res.Output)
		}
	})
}

// kvmUnusable asks /dev/kvm for its API version and a VM, as qemu does first;
// "" when both come. (A nested KVM may still hang the guest later: the
// test's timeout bounds that.)
func kvmUnusable() string {
	fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err.Error()
	}
	defer unix.Close(fd)
	const kvmGetAPIVersion, kvmCreateVM = 0xae00, 0xae01
	v, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), kvmGetAPIVersion, 0)
	if errno != 0 || v != 12 {
		return fmt.Sprintf("KVM_GET_API_VERSION: %d, %v", v, errno)
	}
	vm, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), kvmCreateVM, 0)
	if errno != 0 {
		return "KVM_CREATE_VM: " + errno.Error()
	}
	unix.Close(int(vm))
	return ""
}
