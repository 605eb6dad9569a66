package elector_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/wire/lockconn"
)

// handoverScript is a scripted lease whose candidates stand: a rank's
// sender pid P is the session "cand-P" carrying the rank it told (ranks
// maps P to its priority), waiting first for the key; reservations,
// their release and the handover's end are recorded ("reserve cand-P
// within", "drop cand-P", "unreserve cand-P").
type handoverScript struct {
	scriptLease
	ranks map[uint32]int
}

func (s *handoverScript) Candidate(_ context.Context, _ *lockconn.Target, pid uint32) (string, bool, error) {
	s.record("candidate")
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.ranks[pid]
	return fmt.Sprintf("cand-%d [P%d]", pid, p), ok, nil
}

func (s *handoverScript) Standing(context.Context, *lockconn.Target, string) (bool, error) {
	return true, nil
}

func (s *handoverScript) Requester(context.Context, uint32, []string) (string, bool, bool, error) {
	return "ops", true, true, nil
}

func (s *handoverScript) Precede(context.Context, *lockconn.Target, string) (bool, bool, error) {
	return true, true, nil
}

func (s *handoverScript) Reserve(_ context.Context, _ *lockconn.Target, to string, within time.Duration) error {
	s.record(fmt.Sprintf("reserve %s %s", to, within))
	return nil
}

func (s *handoverScript) DropReservation(_ context.Context, _ *lockconn.Target, to string) error {
	s.record("drop " + to)
	return nil
}

func (s *handoverScript) Unreserve(_ context.Context, _ *lockconn.Target, to string, _ time.Duration) (string, error) {
	s.record("unreserve " + to)
	return to, nil
}

// rank has pid tell the leader the priority p (its session carries it).
func (s *handoverScript) rank(pid uint32, p int) {
	s.mu.Lock()
	s.ranks[pid] = p
	s.mu.Unlock()
	s.requests <- lockconn.Request{PID: pid, Rank: &lockconn.Rank{Priority: p}}
}

// handovers lists the recorded reservation calls, in order.
func (s *handoverScript) handovers() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, c := range s.calls {
		if strings.HasPrefix(c, "reserve ") || strings.HasPrefix(c, "drop ") || strings.HasPrefix(c, "unreserve ") || c == "unlock" {
			out = append(out, c)
		}
	}
	return out
}

// runAhead runs a leader of priority 0 on a handoverScript, with a
// PreferredDelay of 600 ms and reservations 250 ms ahead of it (long
// enough that a loaded machine's late wake still lands ahead).
func runAhead(t *testing.T) (*handoverScript, *scripted) {
	t.Helper()
	old := elector.SetReserveAhead(250 * time.Millisecond)
	t.Cleanup(func() { elector.SetReserveAhead(old) })
	ls := &handoverScript{scriptLease: scriptLease{campaigns: []step{{round: lockconn.Round{Held: true, Free: true}}},
		requests: make(chan lockconn.Request)}, ranks: map[uint32]int{}}
	sc := runScriptedOn(t, &ls.scriptLease, ls, func(c *elector.Config) { c.PreferredDelay = 600 * time.Millisecond })
	return ls, sc
}

// waitCalls waits until the recorded reservation calls are want.
func waitCalls(t *testing.T, ls *handoverScript, want ...string) {
	t.Helper()
	eventually(t, strings.Join(want, ", "), func() (bool, string) {
		got := ls.handovers()
		return slices.Equal(got, want), fmt.Sprint(got)
	})
}

// A preference handover reserves the lock for the candidate ahead of its
// due time (Reserve with no wait: the candidate already waits first), and
// at the due time steps down without reserving again: the step-down and
// the unlock are the handover's whole path.
func TestScriptedPreferenceReservedAhead(t *testing.T) {
	ls, sc := runAhead(t)
	sc.waitElected(t)
	ls.rank(77, 5)
	waitCalls(t, ls, "reserve cand-77 0s", "unlock", "unreserve cand-77")
	if sc.e.IsLeader() {
		t.Fatal("still leading after the handover")
	}
}

// A reservation made ahead for one candidate is released as soon as
// another is preferred, before the lock is reserved for that one (the
// gate taken twice would stay held after one release, and the lock
// would be handed to the candidate no longer preferred).
func TestScriptedAheadReservationFollowsThePreferred(t *testing.T) {
	ls, sc := runAhead(t)
	sc.waitElected(t)
	ls.rank(77, 5)
	waitCalls(t, ls, "reserve cand-77 0s")
	ls.rank(78, 9)
	waitCalls(t, ls, "reserve cand-77 0s", "drop cand-77", "reserve cand-78 0s", "unlock", "unreserve cand-78")
}

// A candidate reserved ahead whose rank falls below the leader's is no
// longer preferred: the reservation is released and the leader leads on.
func TestScriptedAheadReservationDroppedWhenOutranked(t *testing.T) {
	ls, sc := runAhead(t)
	sc.waitElected(t)
	ls.rank(77, 5)
	waitCalls(t, ls, "reserve cand-77 0s")
	ls.rank(77, -1)
	waitCalls(t, ls, "reserve cand-77 0s", "drop cand-77")
	// 40 more renews (20 ms apart): past the due time of the first rank.
	renews := ls.count("renew") + 40
	eventually(t, "the leader's renews past the first due time", func() (bool, string) { return ls.count("renew") >= renews, "" })
	if got := ls.handovers(); len(got) != 2 || !sc.e.IsLeader() {
		t.Fatalf("after the candidate fell below the leader: IsLeader %v, calls %v", sc.e.IsLeader(), got)
	}
}

// A resign request naming another candidate while the lock is reserved
// ahead for a preferred one: the reservation is released first, and the
// lock is handed to the one the request named.
func TestScriptedRequestReplacesTheAheadReservation(t *testing.T) {
	ls, sc := runAhead(t)
	sc.waitElected(t)
	ls.rank(77, 5)
	waitCalls(t, ls, "reserve cand-77 0s")
	ls.requests <- lockconn.Request{PID: 900, To: "ops-pick"}
	eventually(t, "the handover to the named candidate", func() (bool, string) {
		got := ls.handovers()
		return len(got) == 5 && got[1] == "drop cand-77" && strings.HasPrefix(got[2], "reserve ops-pick ") &&
			got[3] == "unlock" && got[4] == "unreserve ops-pick", fmt.Sprint(got)
	})
}
