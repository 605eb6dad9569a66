package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

var shared testpg.Shared

func TestMain(m *testing.M) { os.Exit(testpg.Main(m, childMain, &shared)) }

// Test timings: a short lease, so that a pause past it fits in a test.
const (
	testInterval = 200 * time.Millisecond
	testDeadline = 1 * time.Second
	testLease    = 2 * time.Second
	// resumeBound is the documented bound after a pause (LeaseDuration
	// plus the work connections' idle_in_transaction_session_timeout),
	// with room for a shared 2-core machine.
	resumeBound = testLease + 3*time.Second + 10*time.Second
)

// childMain runs one replica process: the test binary itself, as testpg
// starts it. Its events go to stdout.
func childMain(role string) int {
	em := testpg.NewEmitter(os.Stdout)
	r := &replica{dsn: os.Getenv("KS_DSN"), brokers: strings.Split(os.Getenv("KS_BROKERS"), ","), topic: os.Getenv("KS_TOPIC"),
		identity: role, perRecord: 200 * time.Microsecond,
		report: func(ev string, l leader.Leadership, detail string) {
			em.Emit(testpg.Event{Ev: ev, Identity: l.Identity, Term: l.Term, Data: detail})
		},
		config: func(c *elector.Config) {
			c.RenewInterval, c.RenewDeadline, c.LeaseDuration = testInterval, testDeadline, testLease
		}}
	ctx, cancel := testpg.UntilStdinCloses()
	defer cancel()
	if err := r.run(ctx); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// Three replica processes consume a stream while their leader is resigned,
// SIGKILLed and SIGSTOPped past the lease. Every record's effect exists
// exactly once, the stored offsets are contiguous, no two replicas consumed
// at once outside a pause, no paused replica's write was accepted, and
// consumption resumed within the documented bound after each fault.
func TestExactlyOnceUnderFaults(t *testing.T) {
	const topic, partitions, records = "events", 3, 4000
	srv := shared.Get(t)
	ctx := context.Background()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	brokers := kc.ListenAddrs()
	if err := produce(ctx, brokers, topic, records); err != nil {
		t.Fatal(err)
	}
	conn, err := srv.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `DROP TABLE IF EXISTS kafka_effects, kafka_offsets; `+schema); err != nil {
		t.Fatal(err)
	}
	env := []string{"KS_DSN=" + srv.DSN(), "KS_BROKERS=" + strings.Join(brokers, ","), "KS_TOPIC=" + topic}
	children := map[string]*testpg.Child{} // the live ones
	all := map[string]*testpg.Child{}
	next := 0
	spawn := func() {
		next++
		id := fmt.Sprintf("replica-%d", next)
		children[id] = testpg.StartChild(t, id, env...)
		all[id] = children[id]
	}
	for range 3 {
		spawn()
	}
	applied := func() (n int64) {
		conn.QueryRow(ctx, `SELECT count(*) FROM kafka_effects`).Scan(&n)
		return n
	}
	waitApplied := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for applied() < n {
			if time.Now().After(deadline) {
				t.Fatalf("only %d of %d records applied", applied(), n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	holder := func() string {
		t.Helper()
		h, err := leader.Holder(ctx, conn, leader.KeyFromName("kafka-singleton/"+topic))
		if err != nil {
			t.Fatal(err)
		}
		return h.Holder.Identity
	}
	// waitConsuming waits for a replica other than not to start a term,
	// and returns how long that took from since.
	waitConsuming := func(not string, since time.Time) time.Duration {
		t.Helper()
		sinceMono := testpg.Mono() - int64(time.Since(since))
		for {
			for id, c := range children {
				if id == not {
					continue
				}
				for _, e := range c.Log() {
					if e.Ev == "consuming" && e.Mono >= sinceMono {
						return time.Since(since)
					}
				}
			}
			if time.Since(since) > resumeBound {
				t.Fatalf("no replica but %s resumed consuming within %s", not, resumeBound)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// A killed or stopped replica acts no more from that instant (what it
	// does after SIGCONT must be refused): its term is cut there.
	cutAt := map[string]int64{}

	waitApplied(records / 5)
	cur := holder()
	began := time.Now()
	if _, err := elector.RequestResign(ctx, elector.DSN(srv.DSN()), leader.KeyFromName("kafka-singleton/"+topic), ""); err != nil {
		t.Fatal(err)
	}
	t.Logf("resign of %s: consumption resumed after %s", cur, waitConsuming(cur, began))

	waitApplied(2 * records / 5)
	cur = holder()
	began = time.Now()
	cutAt[cur] = testpg.Mono()
	children[cur].Signal(syscall.SIGKILL)
	select {
	case <-children[cur].Done():
	case <-time.After(time.Minute):
		t.Fatalf("%s still runs a minute after its SIGKILL", cur)
	}
	delete(children, cur)
	t.Logf("SIGKILL of %s: consumption resumed after %s", cur, waitConsuming(cur, began))
	spawn()

	waitApplied(3 * records / 5)
	cur = holder()
	began = time.Now()
	cutAt[cur] = testpg.Mono()
	children[cur].Pause()
	took := waitConsuming(cur, began)
	// Keep it stopped well past the lease and the open transaction's
	// timeout, then let it run: its batch must be refused.
	time.Sleep(testLease + 3*time.Second)
	resumed := testpg.Mono()
	children[cur].Resume()
	t.Logf("SIGSTOP of %s past the lease: consumption resumed after %s", cur, took)

	waitApplied(records)
	// The resumed replica finds out it was demoted and stops consuming;
	// then stop all.
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if _, err := children[cur].WaitAfter(wctx, "stopped", resumed); err != nil {
		t.Fatal(err)
	}
	for _, c := range children {
		c.CloseStdin()
	}
	for _, c := range children {
		select {
		case <-c.Done():
		case <-time.After(time.Minute):
			t.Fatal("a replica did not stop")
		}
	}

	// Exactly once, contiguous offsets, and no write of an older term
	// (the paused replica's) accepted after a newer term's.
	if err := check(ctx, conn, topic, partitions, records); err != nil {
		t.Fatal(err)
	}
	checkNoOverlap(t, all, cutAt)
	fenced := 0
	for _, c := range all {
		for _, e := range c.Log() {
			if e.Ev == "fenced" {
				fenced++
			}
		}
	}
	t.Logf("batches refused by the fence: %d", fenced)
}

// checkNoOverlap: no two replicas' consuming terms overlap, once a killed
// or stopped replica's term is cut at the signal.
func checkNoOverlap(t *testing.T, all map[string]*testpg.Child, cutAt map[string]int64) {
	t.Helper()
	type span struct {
		id         string
		start, end int64
	}
	var spans []span
	for id, c := range all {
		var open *span
		closeAt := func(end int64) {
			if open != nil {
				if cut, ok := cutAt[id]; ok && open.start <= cut && cut < end {
					end = cut
				}
				open.end = end
				spans = append(spans, *open)
				open = nil
			}
		}
		for _, e := range c.Log() {
			switch e.Ev {
			case "consuming":
				closeAt(e.Mono)
				open = &span{id: id, start: e.Mono}
			case "stopped":
				closeAt(e.Mono)
			}
		}
		closeAt(1<<63 - 1)
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].start < spans[j].start })
	for i := 1; i < len(spans); i++ {
		if a, b := spans[i-1], spans[i]; b.start < a.end {
			t.Fatalf("%s consumed from %d while %s still consumed (until %d)", b.id, b.start, a.id, a.end)
		}
	}
	t.Logf("%d consuming terms, none overlapping", len(spans))
}
