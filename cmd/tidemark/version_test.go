package main

import (
	"runtime/debug"
	"testing"
)

// TestVersionLine: what `tidemark version` prints for the build
// information of each way of building it.
func TestVersionLine(t *testing.T) {
	tests := []struct {
		name string
		info debug.BuildInfo
		want string
	}{
		{"go run, or -buildvcs=false", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			"tidemark (devel) go1.26.8"},
		{"go install @v1.2.3", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"}},
			"tidemark v1.2.3 go1.26.8"},
		{"go build in a git checkout", debug.BuildInfo{
			GoVersion: "go1.26.8",
			Main:      debug.Module{Version: "v0.0.0-20261201214628-2bea383e664c+dirty"},
			Settings: []debug.BuildSetting{
				{Key: "vcs", Value: "git"},
				{Key: "vcs.revision", Value: "2bea383e664ca457bef1ae357571cfa51ee41a8b"},
				{Key: "vcs.time", Value: "2026-12-01T21:46:28Z"},
				{Key: "vcs.modified", Value: "true"},
			}},
			"tidemark v0.0.0-20261201214628-2bea383e664c+dirty (revision 2bea383e664ca457bef1ae357571cfa51ee41a8b, 2026-12-01T21:46:28Z, modified) go1.26.8"},
		{"clean checkout", debug.BuildInfo{
			GoVersion: "go1.26.8",
			Main:      debug.Module{Version: "v0.0.0-20261201214628-2bea383e664c"},
			Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "2bea383e664ca457bef1ae357571cfa51ee41a8b"},
				{Key: "vcs.modified", Value: "false"},
			}},
			"tidemark v0.0.0-20261201214628-2bea383e664c (revision 2bea383e664ca457bef1ae357571cfa51ee41a8b) go1.26.8"},
		{"no version at all", debug.BuildInfo{GoVersion: "go1.26.8"}, "tidemark (devel) go1.26.8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := versionLine(&tt.info); got != tt.want {
				t.Errorf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}
