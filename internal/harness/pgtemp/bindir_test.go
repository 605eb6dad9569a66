package pgtemp

import "testing"

// The binary directories of Debian, Homebrew and Postgres.app sort by
// their major version.
func TestVersionOf(t *testing.T) {
	for dir, want := range map[string]float64{
		"/usr/lib/postgresql/16/bin":                          16,
		"/opt/homebrew/opt/postgresql@17/bin":                 17,
		"/usr/local/opt/postgresql@14/bin":                    14,
		"/Applications/Postgres.app/Contents/Versions/15/bin": 15,
		"/opt/homebrew/opt/postgresql/bin":                    0,
	} {
		if got := versionOf(dir); got != want {
			t.Errorf("versionOf(%s) = %v, want %v", dir, got, want)
		}
	}
}
