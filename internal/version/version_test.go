package version

import (
	"runtime/debug"
	"testing"
)

func TestFormat(t *testing.T) {
	vcs := []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}}
	for _, c := range []struct {
		v, commit string
		bi        *debug.BuildInfo
		want      string
	}{
		{"0.1.0", "abc", nil, "0.1.0 (commit abc)"},
		{"", "", nil, "dev"},
		{"", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "dev"},
		{"", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs}, "dev (commit 0123456789ab-dirty)"},
		{"", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.2.0"}, Settings: vcs[:1]}, "v0.2.0 (commit 0123456789ab)"},
		{"0.1.0", "fedcba", &debug.BuildInfo{Main: debug.Module{Version: "v0.2.0"}, Settings: vcs}, "0.1.0 (commit fedcba)"},
	} {
		if got := format(c.v, c.commit, c.bi); got != c.want {
			t.Errorf("format(%q, %q, %+v) = %q, want %q", c.v, c.commit, c.bi, got, c.want)
		}
	}
}
