package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeFile(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "smcrd.conf")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestFileSetKeepsLayout pins that set -P edits the file as a person would: the
// changed lines in place with their comments, an attribute the file lacked at
// its end, and every other byte as the operator wrote it.
func TestFileSetKeepsLayout(t *testing.T) {
	in := "# our site: SMC-R for the storage network only\n" +
		"port_range_list = 2049   # NFS\n" +
		"\n" +
		"   rmb_size=64K\n" +
		"ip_addr_list =\n" +
		"rdma_devices = # none yet\r\n" +
		"max_memory = 128 # ticket 4711\n"
	f, err := LoadFile(writeFile(t, in))
	if err != nil {
		t.Fatal(err)
	}
	n, err := f.Set("port_range_list=2049,3260", "rmb_size=128K", "ip_addr_list=eth1", "rdma_devices=eth1=mlx5_0", "enabled=no")
	if err != nil {
		t.Fatal(err)
	}
	want := "# our site: SMC-R for the storage network only\n" +
		"port_range_list = 2049,3260   # NFS\n" +
		"\n" +
		"   rmb_size= 128K\n" +
		"ip_addr_list = eth1\n" +
		"rdma_devices = eth1=mlx5_0 # none yet\r\n" +
		"max_memory = 128 # ticket 4711\n" +
		"\n# accelerate matching connections (no: every connection is plain TCP)\nenabled = no\n"
	if got := string(n.Text()); got != want {
		t.Errorf("edited file:\n%s\nwant:\n%s", got, want)
	}
	if n.Config.Enabled || n.Config.RMBSize != 128<<10 || n.Config.MaxMemory != 128<<20 || n.Config.PortRanges.String() != "2049,3260" {
		t.Errorf("edited configuration %+v", n.Config)
	}
	if string(f.Text()) != in {
		t.Error("Set changed the file it was called on")
	}
}

// TestFileSetAppendsAfterLastLine: a file whose last line has no newline gets
// one before what is added.
func TestFileSetAppendsAfterLastLine(t *testing.T) {
	f, err := LoadFile(writeFile(t, "enabled = no"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := f.Set("max_memory=64")
	if err != nil {
		t.Fatal(err)
	}
	if got := string(n.Text()); !strings.HasPrefix(got, "enabled = no\n\n# ") || !strings.HasSuffix(got, "\nmax_memory = 64\n") {
		t.Errorf("edited file:\n%q", got)
	}
}

// TestFileSetAllOrNone: one bad assignment changes nothing.
func TestFileSetAllOrNone(t *testing.T) {
	f, err := LoadFile(writeFile(t, "rmb_size = 64K\n"))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := f.Set("rmb_size=128K", "max_memory=lots"); err == nil {
		t.Fatalf("a bad assignment was accepted:\n%s", n.Text())
	}
	if f.Config.RMBSize != 64<<10 || string(f.Text()) != "rmb_size = 64K\n" {
		t.Errorf("after a refused Set: %d, %q", f.Config.RMBSize, f.Text())
	}
}

// TestFileSaveReadsBack: what Save writes, Load reads as the edited configuration.
func TestFileSaveReadsBack(t *testing.T) {
	path := writeFile(t, "# hand-written\nmax_memory = 32\n")
	f, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := f.Set("max_memory=48", "peer_cache_ttl=1h")
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Save(path); err != nil {
		t.Fatal(err)
	}
	back, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(back.Format()) != string(n.Config.Format()) {
		t.Errorf("read back:\n%s\nwant:\n%s", back.Format(), n.Config.Format())
	}
	if b, _ := os.ReadFile(path); !strings.HasPrefix(string(b), "# hand-written\nmax_memory = 48\n") {
		t.Errorf("saved file:\n%s", b)
	}
}

func TestLoadFileErrors(t *testing.T) {
	if _, err := LoadFile(filepath.Join(t.TempDir(), "missing.conf")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	path := writeFile(t, "rmb_size = huge\n")
	if _, err := LoadFile(path); err == nil || !strings.Contains(err.Error(), path+":1: rmb_size") {
		t.Errorf("bad file: %v", err)
	}
}

// FuzzFileSet: whatever the file and the assignment, an edit Set accepts reads
// back as the configuration it reports, and lines that do not set the attribute
// stay as they were.
func FuzzFileSet(f *testing.F) {
	f.Add("port_range_list = 2049   # NFS\n\n   rmb_size=64K\n", "rmb_size=128K")
	f.Add("ip_addr_list =\nrdma_devices = # x\r\n", "rdma_devices=eth1=mlx5_0")
	f.Add("enabled = no", "max_memory=64")
	f.Fuzz(func(t *testing.T, text, assignment string) {
		c, err := Parse(strings.NewReader(text))
		if err != nil {
			return
		}
		file := &File{Config: c, text: []byte(text)}
		n, err := file.Set(assignment)
		if err != nil {
			if strings.Contains(err.Error(), "would not read back") {
				t.Fatalf("edit of %q with %q: %v", text, assignment, err)
			}
			return
		}
		back, err := Parse(strings.NewReader(string(n.Text())))
		if err != nil || string(back.Format()) != string(n.Config.Format()) {
			t.Fatalf("edited file does not read back: %v\n%s", err, n.Text())
		}
		name, _, _ := strings.Cut(assignment, "=")
		name = strings.TrimSpace(name)
		kept := strings.SplitAfter(text, "\n")
		got := strings.SplitAfter(string(n.Text()), "\n")
		for i, l := range kept {
			if settingLine([]string{l}, name) == 0 {
				continue
			}
			if i >= len(got) || (got[i] != l && !(i == len(kept)-1 && got[i] == l+"\n")) {
				t.Fatalf("line %d %q changed by setting %s:\n%s", i+1, l, name, n.Text())
			}
		}
	})
}
