package pgleadertest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/pgleadertest"
)

// A test that needs a server of its own: Start stops it at cleanup.
func ExampleStart() {
	testFailover := func(t *testing.T) {
		srv := pgleadertest.Start(t)
		// ... start the program's electors against srv.DSN() ...
		who, err := srv.TerminateLeader(context.Background(), leader.KeyFromName("reports"))
		fmt.Println(who, err)
	}
	_ = testFailover
}
