package tsharktest

import "testing"

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
