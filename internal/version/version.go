// Package version is what smcrd and smcrctl say they are: the release and the
// commit, stamped by the Makefile at build time (-ldflags -X), else what the Go
// toolchain recorded of the module and of the checkout it built from.
package version

import "runtime/debug"

// Set at build time:
//
//	-ldflags "-X github.com/smcr-io/smcr/internal/version.Version=0.1.0
//	          -X github.com/smcr-io/smcr/internal/version.Commit=0123456789ab"
var (
	Version string
	Commit  string
)

// String is the version and, when known, the commit: "0.1.0 (commit
// 0123456789ab)", with "-dirty" after a commit built with changes.
func String() string {
	bi, _ := debug.ReadBuildInfo()
	return format(Version, Commit, bi)
}

// format is String's logic on what the build stamped and recorded.
func format(v, commit string, bi *debug.BuildInfo) string {
	if bi != nil {
		if v == "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		if commit == "" {
			commit = vcsCommit(bi.Settings)
		}
	}
	if v == "" {
		v = "dev"
	}
	if commit == "" {
		return v
	}
	return v + " (commit " + commit + ")"
}

// vcsCommit is the commit go build recorded (-buildvcs), "" when none.
func vcsCommit(settings []debug.BuildSetting) string {
	var rev, dirty string
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev == "" {
		return ""
	}
	return rev[:min(12, len(rev))] + dirty
}
