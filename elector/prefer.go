package elector

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// Preferred leaders (Config.Priority, Version, Strategy). A ranked
// candidate tells each new leader it sees its rank, with one NOTIFY on the
// key's resign channel, addressed to the leader's backend (tellRank). The
// leader keeps the ranks it heard (candidates in its tenure); NOTIFY is
// not authenticated, so a rank is only a claim. When the candidate it
// prefers most is preferred to itself, the leader proves at once (within
// the resign requests' budget, off the handover's path) from pg_locks and
// pg_stat_activity that the sender's backend (the pid the server stamped
// on the notification) is a session of its own login role standing for
// the key, whose application_name carries the rank it told (a message
// may be anyone's of the role; the session is the candidate's own), and
// takes its name from there; once that candidate has stood
// for PreferredDelay, it hands over to it with the reserved handover of
// RequestResign(..., to), reserved a moment ahead (aheadOf) so that the
// handover's path is the step-down and the unlock alone. A leader that
// leaves (Resign, Run's context, OnElected returning) hands over the same
// way to the candidate it prefers most, when that one ranks above an
// unranked candidate.

// reserveAhead is how long before a preference handover is due the leader
// reserves the lock for the candidate (at most half of PreferredDelay):
// the reservation's statement reads pg_locks and pg_stat_activity (a few
// milliseconds of a small server's time), and a candidate it finds queued
// first is then handed the lock by the unlock alone. A variable for tests.
var reserveAhead = 50 * time.Millisecond

// candidate is a rank a candidate told this leader.
type candidate struct {
	pid   uint32
	pref  leader.Preference
	since time.Time // when this rank reached the leader
	// name is the candidate's session's name, once proven (see prove);
	// retry, when a proof may be tried again (see requests.admit).
	name  string
	retry time.Time
	// first: the candidate was seen waiting for the key first in its
	// queue; looks, how many times precede looked.
	first bool
	looks int
	// ahead: the leader tried to reserve the lock for it ahead of the
	// due time (see reserveAhead).
	ahead bool
}

const (
	// maxCandidates bounds the ranks a leader keeps (a flood of forged
	// ones costs a map entry each, and queries only within the proofs'
	// budget).
	maxCandidates = 256
	// maxLooks bounds how many times a leader readies the handover to a
	// preferred candidate (see precede).
	maxLooks = 3
	// rankRefusedFor: a sender whose rank could not be proven, or whose
	// handover failed, is not heard again for this long.
	rankRefusedFor = 10 * time.Second
	// rankResend: a candidate that ranks above the leader tells it its
	// rank again this long after the first time (a leader begins to
	// listen with its first renew, which a quick lookup may precede), then
	// twice as long each time, up to rankResendMax.
	rankResend    = time.Second
	rankResendMax = 30 * time.Second
	// rankDueMargin: an heir's round shortened to a telling's due time
	// (see rankDue) ends this much after it, and lasts at least as long.
	rankDueMargin = 100 * time.Millisecond
)

// heardRank records a rank a candidate told this leader.
func (e *Elector) heardRank(t *tenure, req lockconn.Request) {
	now := time.Now()
	if until, ok := t.rankRefused[req.PID]; ok && now.Before(until) {
		return
	}
	p := leader.Preference{Priority: req.Rank.Priority, Version: req.Rank.Version}
	switch c, ok := t.cands[req.PID]; {
	case ok && c.pref == p:
		return
	case ok:
		c.pref, c.since, c.name, c.first, c.looks, c.ahead = p, now, "", false, 0, false
	case len(t.cands) >= maxCandidates:
		return
	default:
		t.cands[req.PID] = &candidate{pid: req.PID, pref: p, since: now}
	}
	e.noteCandidates(t)
}

// best returns the candidate s prefers most (of equals, the one heard
// first; then the lower pid), or nil when there is none.
func best(s leader.Strategy, cands map[uint32]*candidate) *candidate {
	var b *candidate
	for _, c := range cands {
		if b == nil {
			b = c
			continue
		}
		switch cmp := leader.Compare(s, c.pref, b.pref); {
		case cmp > 0,
			cmp == 0 && c.since.Before(b.since),
			cmp == 0 && c.since.Equal(b.since) && c.pid < b.pid:
			b = c
		}
	}
	return b
}

// preferredAt returns the candidate this leader prefers to itself, and
// when it is due to hand over to it: PreferredDelay after the later of
// the election and the candidate's rank reaching it. nil when no
// candidate is preferred (a tie keeps the leader).
func (e *Elector) preferredAt(t *tenure) (*candidate, time.Time) {
	c := best(e.cfg.Strategy, t.cands)
	if c == nil || leader.Compare(e.cfg.Strategy, c.pref, e.cfg.preference()) <= 0 {
		return nil, time.Time{}
	}
	from := t.l.ElectedAt
	if c.since.After(from) {
		from = c.since
	}
	at := from.Add(e.cfg.PreferredDelay)
	if c.name == "" && c.retry.After(at) {
		at = c.retry
	}
	return c, at
}

// prefer hands over to the candidate this leader prefers to itself once
// it is due. It proves the candidate stands as soon as it is preferred
// (off the handover's path), reserves the lock for it shortly before it
// is due (reserveAhead; or at the due time, when it did not wait then),
// and releases such a reservation first whenever the candidate it names
// is no longer the one preferred: a reservation held is always the
// preferred candidate's. It returns the reason to step down, or nil to
// lead on.
func (e *Elector) prefer(t *tenure, ls lease) error {
	c, at := e.preferredAt(t)
	if t.handoverTo != "" && (c == nil || c.name != t.handoverTo) {
		// Reserved ahead for a candidate no longer the one preferred.
		if err := e.dropAhead(t, ls); err != nil {
			return err
		}
	}
	if c == nil {
		return nil
	}
	if c.name == "" && (time.Now().Before(c.retry) || !e.prove(t, ls, c)) {
		return nil
	}
	switch left := time.Until(at); {
	case left > e.aheadOf():
		// Once when proven, then while the due time is near, a few
		// times at most: a candidate that watches, not queued on the
		// key, costs the standing leader no statement per renew.
		if !c.first && c.looks < maxLooks && (c.looks == 0 || left <= time.Duration(maxLooks)*e.cfg.RenewInterval) {
			e.precede(t, ls, c)
		}
		return nil
	case left > 0:
		if !c.ahead {
			e.reserveAhead(t, ls, c)
		}
		return nil
	}
	name := t.handoverTo
	if name == "" {
		var ok bool
		if name, ok = e.handTo(t, ls, c); !ok {
			return nil
		}
	} else {
		e.candidateLog(t, c).Info("handing over to the preferred candidate", zap.String("candidate", name))
	}
	return fmt.Errorf("%w: handover to preferred candidate %s (%s)", leader.ErrResigned, name, e.why(c.pref, e.cfg.preference()))
}

// aheadOf is how long before a preference handover is due the leader
// reserves the lock for the candidate: reserveAhead, at most half of
// PreferredDelay.
func (e *Elector) aheadOf() time.Duration {
	return min(reserveAhead, e.cfg.PreferredDelay/2)
}

// reserveAhead reserves the lock for the proven candidate c shortly
// before the handover to it is due (once per candidate), when c already
// waits for the key: the handover's path is then the step-down and the
// unlock alone. The reservation binds nobody while this leader holds the
// lock (the other heirs give a won lock back only after the unlock), and
// it goes with the session. When c does not wait yet, the reservation is
// given up at once and the handover reserves at its due time, as without
// this.
func (e *Elector) reserveAhead(t *tenure, ls lease, c *candidate) {
	c.ahead = true
	ctx, _, cancel := e.renewContext(t)
	defer cancel()
	if err := ls.Reserve(ctx, e.target, c.name, 0); err != nil {
		e.candidateLog(t, c).Debug("no reservation ahead of the handover to the preferred candidate", zap.Error(err))
		return
	}
	t.handoverTo = c.name
}

// dropAhead releases a reservation made ahead of a handover this leader no
// longer makes (another candidate is preferred now, or none). An error
// means the connection is unfit: the tenure ends.
func (e *Elector) dropAhead(t *tenure, ls lease) error {
	ctx, _, cancel := e.renewContext(t)
	defer cancel()
	to := t.handoverTo
	t.handoverTo = ""
	if err := ls.DropReservation(ctx, e.target, to); err != nil {
		return fmt.Errorf("release the reservation for %s: %w", to, err)
	}
	t.log.Debug("released the reservation made ahead of a handover no longer due", zap.String("candidate", to))
	return nil
}

// leaving hands a leaving leader's lock to the candidate it prefers most,
// when it knows a ranked one (and no handover is set up yet) that ranks
// above an unranked candidate: unranked candidates tell no rank, and may
// stand (a priority below 0 ranks below them).
func (e *Elector) leaving(t *tenure, ls lease) {
	c := best(e.cfg.Strategy, t.cands)
	if c != nil && t.handoverTo == "" && leader.Compare(e.cfg.Strategy, c.pref, leader.Preference{}) > 0 {
		e.handTo(t, ls, c)
	}
}

// prove proves that c's backend is a candidate of this leader's role
// standing for the key whose session carries the rank it told (see
// leader.Rank), and learns its name from its session. A
// candidate that fails is not heard again for rankRefusedFor. Proofs
// share the resign requests' budget (5 a second): a flood of forged ranks
// from many sessions costs the leader no more queries than a flood of
// requests.
func (e *Elector) prove(t *tenure, ls lease, c *candidate) bool {
	if now := time.Now(); !e.requests.admit(c.pid, now) {
		c.retry = now.Add(time.Second / requestRate)
		return false
	}
	ctx, _, cancel := e.renewContext(t)
	defer cancel()
	app, ok, err := ls.Candidate(ctx, e.target, c.pid)
	name, r, ranked := leader.ParseApplicationName(app)
	switch {
	case err != nil || !ok || name == "" || name == e.cfg.Identity:
		e.candidateLog(t, c).Info("a rank from a session that does not stand for the key as this leader's role is ignored", zap.Error(err))
	case !ranked || r.Preference != c.pref:
		// The rank its session carries is the candidate's own word; a
		// message may be anyone's of the role.
		e.candidateLog(t, c).Info("a rank that the sender's session does not carry is ignored", zap.String("application_name", app))
	default:
		c.name = name
		return true
	}
	e.refuseRank(t, c)
	return false
}

// precede readies the handover to the proven candidate c, off its path,
// when it is proven and at the renews just before its due time, until c
// waits first in the key's queue. The reservation reads pg_locks and
// pg_stat_activity by name, and a session's first such read loads its
// catalog caches (about 3 ms of the server's time on a small VM, against
// 0.5 ms after); and the other heirs queued ahead of c are sent behind it
// (see lockconn.Lease.Precede), so that the lock goes to c as soon as
// this leader lets go. A candidate tells its rank before its first wait,
// so the first look usually finds it not queued yet. Whether it stands,
// the reservation asks again.
func (e *Elector) precede(t *tenure, ls lease, c *candidate) {
	ctx, _, cancel := e.renewContext(t)
	defer cancel()
	c.looks++
	_, first, err := ls.Precede(ctx, e.target, c.name)
	if err != nil {
		e.candidateLog(t, c).Debug("could not ready the handover to the proven candidate", zap.Error(err))
	}
	c.first = first
}

// refuseRank forgets c, and does not hear its sender for rankRefusedFor.
func (e *Elector) refuseRank(t *tenure, c *candidate) {
	now := time.Now()
	if len(t.rankRefused) > maxCandidates {
		for pid, until := range t.rankRefused {
			if now.After(until) {
				delete(t.rankRefused, pid)
			}
		}
	}
	delete(t.cands, c.pid)
	t.rankRefused[c.pid] = now.Add(rankRefusedFor)
	e.noteCandidates(t)
}

func (e *Elector) candidateLog(t *tenure, c *candidate) *zap.Logger {
	return t.log.With(zap.Uint32("candidate_pid", c.pid), zap.Int("candidate_priority", c.pref.Priority), zap.String("candidate_version", c.pref.Version))
}

// handTo reserves the lock for c (proven first, unless it was), by the
// name its session has. The reservation itself waits for a session of
// that name to queue on the key, so a candidate that died since it was
// proven is not handed over to. A candidate that fails is not heard
// again for rankRefusedFor.
func (e *Elector) handTo(t *tenure, ls lease, c *candidate) (string, bool) {
	if c.name == "" && !e.prove(t, ls, c) {
		return "", false
	}
	ctx, _, cancel := e.renewContext(t)
	defer cancel()
	log := e.candidateLog(t, c).With(zap.String("candidate", c.name))
	if msg, ok := e.reserve(ctx, t, ls, c.name, log); !ok {
		log.Info("no handover to the preferred candidate", zap.String("why", msg))
		e.refuseRank(t, c)
		return "", false
	}
	log.Info("handing over to the preferred candidate")
	return c.name, true
}

// why says why a is preferred to b (or, equal, why neither is).
func (e *Elector) why(a, b leader.Preference) string {
	s := e.cfg.Strategy
	if (s == leader.NewestVersion || s == leader.OldestVersion) && leader.CompareVersions(a.Version, b.Version) != 0 {
		return fmt.Sprintf("%s: version %q over %q", s, a.Version, b.Version)
	}
	if a.Priority != b.Priority {
		return fmt.Sprintf("%s: priority %d over %d", s, a.Priority, b.Priority)
	}
	return "first come"
}

// tellRank tells a leader this candidate's rank, when it has one: on
// first seeing the leader's backend, once more rankResend later, and
// again while the candidate ranks above it (as the leader's
// application_name says, under the leader's strategy, which decides),
// each time twice as long after the last, up to rankResendMax. A rank
// sent before the new leader listens (from its first renew on), or lost
// with a connection, is so told again: a leader that leaves hands over to
// the best rank it heard, so even a rank below its own counts. A
// candidate that does not rank above the leader costs nothing after its
// second telling. Losing one is harmless (the leader only hands over
// later, or to another), so an error is only logged.
func (e *Elector) tellRank(ls lease, leaderPID uint32) {
	if !e.cfg.ranked() || leaderPID == 0 || leaderPID == ls.PID() {
		return
	}
	now := time.Now()
	switch {
	case leaderPID != e.rankTo:
		e.rankTo, e.rankGap = leaderPID, rankResend
	case now.Sub(e.rankSent) >= e.rankGap && (e.rankGap == rankResend || e.outranksLeader()):
		// rankGap is still rankResend only before the second telling.
		e.rankGap = min(2*e.rankGap, rankResendMax)
	default:
		return
	}
	e.rankSent = now
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RenewDeadline)
	defer cancel()
	if err := ls.SendRank(ctx, e.target, leaderPID, lockconn.Rank{Priority: e.cfg.Priority, Version: e.cfg.Version}); err != nil {
		e.log.Debug("could not tell the leader this candidate's rank", zap.Error(err))
	}
}

// rankDue reports when tellRank will next tell the leader this candidate's
// rank, if it will: the second telling, and any later one while the
// candidate ranks above the leader. An heir's rounds (three
// LeaseDurations each) end at that time, so that a rank the leader did
// not hear (one sent before it listened) is told again on time.
func (e *Elector) rankDue() (time.Time, bool) {
	switch {
	case !e.cfg.ranked() || e.rankTo == 0 || e.rankTo != uint32(e.leaderPID):
		return time.Time{}, false
	case e.rankGap != rankResend && !e.outranksLeader():
		return time.Time{}, false
	}
	return e.rankSent.Add(e.rankGap), true
}

// waitForRank ends the next round, when it is an heir's wait, once the
// candidate's rank is due to be told again: an heir tells it only between
// rounds (see tellRank).
func (e *Elector) waitForRank(ls lease) {
	if due, ok := e.rankDue(); ok {
		ls.ShortenWait(e.target, max(time.Until(due)+rankDueMargin, rankDueMargin))
	}
}

// outranksLeader reports whether the leader, by the rank its
// application_name carries, prefers this candidate to itself. An
// unranked leader ranks ByPriority at priority 0 (only a ranked
// candidate may have another strategy).
func (e *Elector) outranksLeader() bool {
	r := e.leaderRank
	return leader.Compare(r.Strategy, e.cfg.preference(), r.Preference) > 0
}

// noteCandidates copies the tenure's candidates into the status.
func (e *Elector) noteCandidates(t *tenure) {
	out := make([]RankedCandidate, 0, len(t.cands))
	for _, c := range t.cands {
		out = append(out, RankedCandidate{PID: c.pid, Priority: c.pref.Priority, Version: c.pref.Version, Since: c.since})
	}
	why := "first come"
	if b := best(e.cfg.Strategy, t.cands); b != nil {
		switch cmp := leader.Compare(e.cfg.Strategy, e.cfg.preference(), b.pref); {
		case cmp > 0:
			why = "preferred (" + e.why(e.cfg.preference(), b.pref) + ")"
		case cmp < 0:
			why = "handing over to a preferred candidate (" + e.why(b.pref, e.cfg.preference()) + ")"
		}
	}
	e.note(func(st *Status) { st.Candidates, st.Why = out, why })
}

// identity returns the identity a session named app has: app without the
// rank a ranked candidate's application_name carries.
func identity(app string) string {
	id, _, _ := leader.ParseApplicationName(app)
	return id
}
