package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// cmdVersion prints the module version and the VCS facts the build
// recorded (go install ...@v1.2.3 gives the version; a build from a
// checkout gives the commit, its time and whether the tree was modified).
func cmdVersion(args []string, stdout, stderr io.Writer) error {
	fs, _ := newFlags("version", "version", "", stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprintln(stdout, versionString())
	return nil
}

func versionString() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "pgleader (no build information) " + runtime.Version()
	}
	s := "pgleader " + bi.Main.Version
	var rev, at, dirty string
	for _, kv := range bi.Settings {
		switch kv.Key {
		case "vcs.revision":
			rev = kv.Value
		case "vcs.time":
			at = kv.Value
		case "vcs.modified":
			if kv.Value == "true" {
				dirty = " (modified)"
			}
		}
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		s += fmt.Sprintf(" commit %s%s %s", rev, dirty, at)
	}
	return s + " " + bi.GoVersion + " " + runtime.GOOS + "/" + runtime.GOARCH
}
