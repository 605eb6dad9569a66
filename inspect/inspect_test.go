package inspect_test

import (
	"fmt"
	"testing"

	"github.com/pgleader/pgleader/inspect"
	"github.com/pgleader/pgleader/leader"
)

// The values tools read are stable: pgleader status of one release reads
// the locks and markers of members of another.
func TestStableValues(t *testing.T) {
	if inspect.Space != 0x70674C48 {
		t.Fatalf("Space = %#x", inspect.Space)
	}
	if c, o := inspect.GroupRoster("tenant-schedulers"); c != inspect.Space || o != 0xe8f47bc5 {
		t.Fatalf("GroupRoster = (%#x, %#x)", c, o)
	}
	if c, o := inspect.KeyRoster(leader.KeyFromName("billing")); c != inspect.Space || o == 0 {
		t.Fatalf("KeyRoster = (%#x, %#x)", c, o)
	}
	if !inspect.InSpace(inspect.Space, 2) || inspect.InSpace(inspect.Space, 1) || inspect.InSpace(7, 2) {
		t.Fatal("InSpace")
	}
}

func TestParseMarkers(t *testing.T) {
	for _, c := range []struct {
		query string
		group string
		keys  int
		ok    bool
	}{
		{"SELECT 'pgleader group v1 74656e616e7473 12'", "tenants", 12, true},
		{"SELECT 'pgleader group v1 zz 12'", "", 0, false},
		{"SELECT 'pgleader group v1 74656e616e7473 -1'", "", 0, false},
		{"SELECT 1", "", 0, false},
	} {
		g, k, ok := inspect.ParseGroupMarker(c.query)
		if g != c.group || k != c.keys || ok != c.ok {
			t.Errorf("ParseGroupMarker(%q) = %q, %d, %v", c.query, g, k, ok)
		}
	}
	if name, ok := inspect.ParseNameMarker("/* pgleader key 62696c6c696e67 */ SELECT 1"); !ok || name != "billing" {
		t.Fatalf("ParseNameMarker: %q %v", name, ok)
	}
	if _, ok := inspect.ParseNameMarker("/* pgleader key */ SELECT 1"); ok {
		t.Fatal("an empty name parsed")
	}
}

// Which group a session belongs to, from its pg_stat_activity.query.
func ExampleParseGroupMarker() {
	group, keys, ok := inspect.ParseGroupMarker("SELECT 'pgleader group v1 74656e616e7473 12'")
	fmt.Println(group, keys, ok)
	// Output: tenants 12 true
}
