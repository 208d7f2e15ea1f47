package rmb

import (
	"bytes"
	"encoding/hex"
	"testing"
)

func TestMsgGolden(t *testing.T) {
	for _, c := range []struct {
		m    Msg
		p    []byte
		want string
	}{
		{Msg{Type: MsgClient}, nil, "534d4344" + "0500" + "0100" + "00000000" + "00000000" + "00000000" + "00000000"},
		{Msg{Type: MsgReply, Status: -95}, nil, "534d4344" + "0500" + "1000" + "a1ffffff" + "00000000" + "00000000" + "00000000"},
		{Msg{Type: MsgDecided, Mode: ModeTCP}, []byte("hi"), "534d4344" + "0500" + "1100" + "00000000" + "02000000" + "02000000" + "00000000" + "6869"},
	} {
		b := c.m.Append(nil, c.p)
		if got := hex.EncodeToString(b); got != c.want {
			t.Errorf("%+v: %s, want %s", c.m, got, c.want)
		}
		m, p, err := ParseMsg(b)
		if err != nil || m != c.m || !bytes.Equal(p, c.p) {
			t.Errorf("round trip of %+v: %+v %q %v", c.m, m, p, err)
		}
	}
}

func TestMsgRejects(t *testing.T) {
	good := Msg{Type: MsgDecided, Mode: ModeSMCR}.Append(nil, nil)
	for name, mut := range map[string]func([]byte) []byte{
		"short":       func(b []byte) []byte { return b[:10] },
		"magic":       func(b []byte) []byte { b[0] ^= 1; return b },
		"version":     func(b []byte) []byte { b[4] = ABIVersion + 1; return b },
		"type":        func(b []byte) []byte { b[6] = 99; return b },
		"mode":        func(b []byte) []byte { b[12] = 9; return b },
		"length lies": func(b []byte) []byte { b[16] = 5; return b },
		"extra bytes": func(b []byte) []byte { return append(b, 1) },
	} {
		b := mut(append([]byte(nil), good...))
		if _, _, err := ParseMsg(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzParseMsg(f *testing.F) {
	f.Add(Msg{Type: MsgClient}.Append(nil, nil))
	f.Add(Msg{Type: MsgDecided, Mode: ModeTCP}.Append(nil, []byte("abc")))
	f.Add(Msg{Type: MsgReply, Status: -1}.Append(nil, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, p, err := ParseMsg(b)
		if err != nil {
			return
		}
		if again := m.Append(nil, p); !bytes.Equal(again, b) {
			t.Fatalf("re-encodes to %x, was %x", again, b)
		}
	})
}
