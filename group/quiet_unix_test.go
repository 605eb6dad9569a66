//go:build unix

package group_test

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/pgleader/pgleader/group"
	"github.com/pgleader/pgleader/leader"
)

// A quiet round is a real round trip: with the member's backend stopped
// (SIGSTOP: the server's process answers nothing, the connection stays
// open), no ping is answered, and the member stops trusting every key at
// the trust window's end (ErrRenewDeadline). Once the backend runs again
// (SIGCONT), it ends (its client closed the connection), its locks are
// freed, and the member leads its keys again on a new session.
func TestGroupQuietRoundsStalledBackend(t *testing.T) {
	srv := sharedServer(t)
	q := startQuiet(t, srv, srv.DSN(), group.Config{RenewInterval: 100 * time.Millisecond, RenewDeadline: time.Second, LeaseDuration: 3 * time.Second})
	pid := int(q.mainPID(t))
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Skipf("cannot stop the server's backend: %v", err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(resume)
	eventually(t, "every key demoted", func() (bool, string) {
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(q.reasons) == 4, fmt.Sprint(q.reasons)
	})
	q.mu.Lock()
	for _, r := range q.reasons {
		if !errors.Is(r, leader.ErrRenewDeadline) {
			t.Errorf("demoted with %v while the backend was stopped; want ErrRenewDeadline", r)
		}
	}
	q.mu.Unlock()
	if n := len(q.g.Owned()); n != 0 {
		t.Fatalf("%d keys still owned", n)
	}
	resume()
	eventually(t, "the member leads its keys again", func() (bool, string) { return len(q.g.Owned()) == 4, fmt.Sprint(q.g.Owned()) })
}
