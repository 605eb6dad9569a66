package elector

import (
	"sync"
	"time"
)

// requests admits resign requests. NOTIFY is not authenticated, so any
// role can send a leader a flood of them, and each one the leader takes up
// costs a lookup of the asker's role and an answer. So a refused asker's
// next requests are dropped unread for refusedFor, at most requestRate
// requests a second are taken up in all (a burst of as many), and a
// refusal is logged at most once per interval (the rest are counted, and
// the count logged once a minute). A legitimate request during a flood
// may go unanswered: the asker sees ErrNoAnswer and asks again.
type requests struct {
	mu      sync.Mutex
	refused map[uint32]time.Time // asker pid -> dropped until
	tokens  float64
	last    time.Time // when tokens were counted
	dropped int64     // requests dropped or refused unlogged, in all
	logged  time.Time // the last refusal logged
	summary time.Time // the last count logged
	since   int64     // dropped as of the last count logged
}

const (
	refusedFor  = 10 * time.Second
	requestRate = 5.0
)

// admit reports whether a request from pid may be taken up now.
func (r *requests) admit(pid uint32, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refused == nil {
		r.refused = map[uint32]time.Time{}
	}
	if until, ok := r.refused[pid]; ok && now.Before(until) {
		r.dropped++
		return false
	}
	r.tokens = min(requestRate, r.tokens+now.Sub(r.last).Seconds()*requestRate)
	if r.last.IsZero() {
		r.tokens = requestRate
	}
	r.last = now
	if r.tokens < 1 {
		r.dropped++
		return false
	}
	r.tokens--
	return true
}

// refuse notes a refusal of pid; it reports whether to log it (at most one
// a period).
func (r *requests) refuse(pid uint32, now time.Time, period time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.refused) > 1024 {
		for p, until := range r.refused {
			if now.After(until) {
				delete(r.refused, p)
			}
		}
	}
	r.refused[pid] = now.Add(refusedFor)
	if now.Sub(r.logged) < period {
		r.dropped++
		return false
	}
	r.logged = now
	return true
}

// report returns how many requests were dropped since the last report,
// once a minute at most (0 otherwise).
func (r *requests) report(now time.Time) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dropped == r.since || now.Sub(r.summary) < time.Minute {
		return 0
	}
	n := r.dropped - r.since
	r.since, r.summary = r.dropped, now
	return n
}

// total is how many requests were dropped or refused unlogged.
func (r *requests) total() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dropped
}
