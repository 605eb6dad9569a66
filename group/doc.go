// Package group runs many elections on one connection per member and
// spreads them over its members: a scheduler per tenant, a worker per
// shard, a consumer per queue, each key led by exactly one member at a
// time, with the members sharing the keys ⌊K/M⌋ or ⌈K/M⌉ each.
//
//	g, err := group.New(group.Config{
//		Connect:   leader.DSN(os.Getenv("DATABASE_URL")),
//		Group:     "tenant-schedulers",
//		Keys:      keys,
//		Callbacks: group.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { runTenant(ctx, l.Key) }},
//	})
//	go g.Run(ctx)
//
// Every member (a process that runs a Group with the same Group name
// against the same database) holds the group's roster lock in share mode,
// so pg_locks lists the members; no table is needed. Each full round, one
// round trip per RenewInterval, proves this member's session (its own
// backend, its token, a primary), which renews every key it leads at once:
// a session-level lock ends only with its session or by its own unlock. On
// a direct session (no proxy between) that round trip is a bare protocol
// Sync, which runs no transaction: at 100,000 keys the end of each
// transaction, which walks every lock the session holds, was most of what
// a standing group cost the server. A
// scan of pg_locks, in the same round trip, reads the members and proves
// each key again by its lock: at each session's start, when the members
// change, and otherwise at most 0.5% of the member's time (every round in
// a small group). Every member computes the same assignment
// from the same list (rendezvous hashing with bounded loads), takes the
// free keys assigned to it with pg_try_advisory_lock (never a wait), and
// hands over the keys assigned to others: their OnElected is cancelled,
// the lock stays held and renewed until it returns, then it is released
// and the group is told (a NOTIFY), so that the new owner takes it at
// once. A second connection per member, the crash watch, waits on the
// next member's lock, so that a member's death is seen at the speed of a
// lock grant.
//
// The per-key contract is the Elector's: OnElected's context is cancelled
// before OnDemoted, exactly one OnDemoted per OnElected, a graceful
// hand-over keeps the lock until OnElected returns, and a silent member
// (paused, partitioned) stops trusting its keys RenewDeadline after its
// last full round was sent, before the server-side lease (LeaseDuration)
// frees them for anyone else: the Elector's ordering argument, since one
// round renews every key. docs/groups.md has the design and the sizing.
//
// # A key's phases
//
// Each round is read, plan, apply: plan is a pure function of the state
// and what the round read (plan.go), and says what happens to each key:
//
//	           assigned to this member, free
//	  free ----------------------------------> (wanted: tried in the exchange)
//	   ^                                               | won (a tenure begins)
//	   |                                               v
//	   |        OnDemoted ran                       leading <-- adopted: held without a
//	ending <-------------------------------+           |        tenure (won in a round
//	   ^     lock lost (a scan did not     |           |        that failed), and mine
//	   |     find it), session ended ------+-----------+
//	   |                                               | no longer mine (a join, a resign,
//	   |  released (OnElected returned,                |  SetKeys), stopping, or OnElected
//	   +-- or ReleaseTimeout passed) <-- handing over <+  returned by itself
//
// Beside the phases: a resign hold keeps a key this member resigned away
// from it for ten intervals (one after OnElected returned by itself), so
// the assignment gives it to the next member; a gift is a key another
// member resigned to this one, told on this member's own channel and
// taken before the next assignment says so (the group's copy of that
// resign, which comes with the resigner's next full round, only sets the
// hold, and is old news where this member leads the key or has resigned
// it since); an ending key is not taken again before its OnDemoted has
// run.
//
// All SQL goes through the wire layer (internal/wire/lockconn: Member for the
// main session, Ring for the crash watch), behind the small wire
// interface, which the package's tests script.
package group
