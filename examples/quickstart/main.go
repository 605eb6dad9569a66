// Command quickstart is pgleader's Quick start: run it in every replica of a
// fleet, and exactly one of them does the work at a time. When that one
// stops, crashes or loses the database, another takes over within
// milliseconds (a crash or a resign) or a lease (a partition or a pause).
//
//	DATABASE_URL=postgres://app:secret@db/app go run ./examples/quickstart
package main

import (
	"context"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/slogcore"
)

func main() {
	e, err := elector.New(elector.Config{
		// One dedicated connection per replica; an unset DATABASE_URL is an
		// error here, not a connection to somewhere else.
		Connect: elector.DSN(os.Getenv("DATABASE_URL")),
		// Every replica campaigns for the same key; the name is stable and
		// any other language can compute the same advisory lock.
		Key: leader.KeyFromName("quickstart-worker"),
		// Identity defaults to hostname-pid: what pg_stat_activity and
		// pgleader status show for this replica.
		Callbacks: elector.Callbacks{
			OnElected: func(ctx context.Context, l leader.Leadership) {
				// Work until ctx ends: it is cancelled the moment this replica
				// is no longer sure it leads, or is asked to step down.
				log.Printf("%s leads", l.Identity)
				for {
					select {
					case <-ctx.Done():
						log.Printf("%s stops working: %v", l.Identity, context.Cause(ctx))
						return
					case <-time.After(time.Second):
						log.Print("working")
					}
				}
			},
			OnDemoted:   func(l leader.Leadership, reason error) { log.Printf("%s stepped down: %v", l.Identity, reason) },
			OnNewLeader: func(identity string) { log.Printf("the leader is %s", identity) },
		},
		// Connections, reconnects and elections in the program's own logs.
		Logger: slogcore.New(slog.Default().Handler()),
	})
	if err != nil {
		log.Fatal(err) // names the field and the rule it breaks
	}
	// SIGTERM (a rolling update) makes the leader hand over gracefully: its
	// OnElected returns first, then the lock goes to a waiting replica.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Run campaigns, leads and campaigns again until ctx ends. It returns an
	// error only for what retrying cannot fix (a wrong password, a
	// transaction pooler), with the server's message.
	if err := e.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
