package cli

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionOf(t *testing.T) {
	t.Parallel()
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	const rev = "0123456789abcdef0123"
	tests := []struct {
		name    string
		stamped string
		bi      *debug.BuildInfo
		want    string
	}{
		{"stamped", "v1.2.0", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "v1.2.0"},
		{"stamped with commit", "v1.2.0", &debug.BuildInfo{Settings: vcs(rev, "false")}, "v1.2.0 commit 0123456789ab"},
		{"go install", "", &debug.BuildInfo{Main: debug.Module{Version: "v1.3.0"}}, "v1.3.0"},
		{"pseudo-version names its commit", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20260101000000-0123456789ab"}, Settings: vcs(rev, "false")}, "v0.0.0-20260101000000-0123456789ab"},
		{"checkout", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "false")}, "devel (commit 0123456789ab)"},
		{"dirty checkout", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "true")}, "devel (commit 0123456789ab, with uncommitted changes)"},
		{"nothing known", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, sourceVersion + " (no commit recorded: built without a version stamp or VCS information, as with -buildvcs=false; make build"},
		{"no build info", "", nil, sourceVersion + " (no commit recorded"},
	}
	for _, tt := range tests {
		got := versionOf(tt.stamped, tt.bi)
		if !strings.HasPrefix(got, tt.want) {
			t.Errorf("%s: versionOf = %q, want %q", tt.name, got, tt.want)
		}
		if got == "(devel)" {
			t.Errorf("%s: a bare (devel)", tt.name)
		}
	}
}
