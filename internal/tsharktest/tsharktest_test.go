package tsharktest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestSameValue(t *testing.T) {
	for _, c := range []struct {
		got, want string
		same      bool
	}{
		{"0x10", "16", true}, {"16", "17", false}, {"1,2", "1,0x2", true}, {"1,2", "1", false},
		{"fe80::1", "fe80::1", true}, {"abc", "abd", false},
	} {
		if SameValue(c.got, c.want) != c.same {
			t.Errorf("SameValue(%q, %q) = %v", c.got, c.want, !c.same)
		}
	}
}

// A TCP segment whose ports tshark must decode proves the framing is right.
func TestFramingDecodes(t *testing.T) {
	frames := TCPSegments([][]byte{[]byte("hello")}, 12345)
	Check(t, []string{"segment"}, frames, []map[string]string{{
		"tcp.dstport": "12345", "tcp.srcport": "40000", "ip.src": "192.0.2.2", "tcp.len": "5",
	}})
	frames = RoCESends([][]byte{make([]byte, 44)})
	Check(t, []string{"send"}, frames, []map[string]string{{"udp.dstport": "4791", "infiniband.bth.opcode": "4"}})
}

// TestMissingTsharkFails: scripts/deps.sh installs tshark, so a machine without it
// is set up wrong, and the wire-format checks must fail there, not skip.
func TestMissingTsharkFails(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestFramingDecodes$", "-test.v")
	cmd.Env = append(os.Environ(), "PATH="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "scripts/deps.sh") {
		t.Fatalf("without tshark: err %v, want a failure naming scripts/deps.sh:\n%s", err, out)
	}
}
