package leader

import (
	"fmt"
	"os"
)

// DefaultIdentity is "hostname-pid", cut to the 63 bytes PostgreSQL keeps
// of an application_name.
func DefaultIdentity() string {
	host, _ := os.Hostname()
	suffix := fmt.Sprintf("-%d", os.Getpid())
	if len(host)+len(suffix) > 63 {
		host = host[:63-len(suffix)]
	}
	return host + suffix
}
