package group_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pgleader/pgleader/group"
	"github.com/pgleader/pgleader/leader"
)

// A member's value (Config.Value) is reported with the member for every
// key it leads (leader.HolderValue), and with no other member: once a
// member stops, its keys move and report their new leader's value.
func TestMemberValue(t *testing.T) {
	srv := sharedServer(t)
	w := newGroupWatch(t)
	keys := groupKeys(t.Name(), 6)
	start := func(id string) *member {
		return runMember(t, group.Config{
			Connect: leader.DSN(srv.DSN()), Group: t.Name(), Keys: keys, Identity: id,
			Value: []byte("addr-of-" + id), Values: group.Values{Table: "values_group"},
			Callbacks:     w.callbacks(id),
			RenewInterval: 100 * time.Millisecond, RenewDeadline: 1500 * time.Millisecond, LeaseDuration: 4500 * time.Millisecond,
			Logger: testLogger(t, nil),
		})
	}
	a := start("val-m1")
	start("val-m2")
	balanced(t, w, len(keys), 2, 4, "val-m1", "val-m2")
	conn := mustConn(t, srv)
	check := func(from ...string) {
		t.Helper()
		eventually(t, "every key's value is its leader's", func() (bool, string) {
			for _, k := range keys {
				p, err := leader.HolderValue(context.Background(), conn, k, "values_group", "")
				if err != nil {
					return false, fmt.Sprint(k, ": ", err)
				}
				ok := false
				for _, id := range from {
					ok = ok || p.Identity == id
				}
				if !ok {
					return false, fmt.Sprintf("%s led by %q", k, p.Identity)
				}
				if p.Value == nil {
					// What the table holds, should this never pair.
					var rows []string
					if rs, err := conn.Query(context.Background(), "SELECT holder, backend_pid, backend_start::text FROM values_group"); err == nil {
						for rs.Next() {
							var h, st string
							var pid int32
							rs.Scan(&h, &pid, &st)
							rows = append(rows, fmt.Sprintf("%s/%d/%s", h, pid, st))
						}
						rs.Close()
					}
					h, _ := leader.Holder(context.Background(), conn, k)
					return false, fmt.Sprintf("%s: %q (pid %d, started %s) has no value yet; rows %v", k, p.Identity, h.Holder.PID, h.Holder.BackendStart, rows)
				}
				if string(p.Value) != "addr-of-"+p.Identity {
					t.Fatalf("%s: leader %q reported with value %q", k, p.Identity, p.Value)
				}
			}
			return true, ""
		})
	}
	check("val-m1", "val-m2")
	a.stop()
	check("val-m2")
	c := group.Config{Connect: leader.DSN(srv.DSN()), Group: "g", Keys: keys, Value: make([]byte, leader.MaxValueSize+1),
		Callbacks: group.Callbacks{OnElected: func(context.Context, leader.Leadership) {}}}
	var ce *leader.ConfigError
	if _, err := group.New(c); !errors.As(err, &ce) || ce.Field != "Value" {
		t.Fatalf("a value of %d bytes: %v", len(c.Value), err)
	}
}
