package lockconn

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Rank is how a candidate ranks for leadership (elector.Config's Priority
// and Version), as it tells the leader with SendRank. The leader believes
// a rank only from a session that Candidate proves stands for the key.
type Rank struct {
	Priority int
	Version  string
}

// A rank's payload is addressed like a request (see RequestPayload), with
// a tab after the pid, which no request has: "<leader's backend
// pid>\trank\t<priority>\t<version>". A leader that does not know ranks
// reads it as no request and drops it.
const rankTag = "\trank\t"

// MaxRankVersion bounds a rank's version (a semantic version is short).
const MaxRankVersion = 64

// RankPayload is the payload that tells the leader on backend leaderPID
// this candidate's rank.
func RankPayload(leaderPID uint32, r Rank) string {
	return strconv.FormatUint(uint64(leaderPID), 10) + rankTag + strconv.Itoa(r.Priority) + "\t" + r.Version
}

// ParseRank reads a rank's payload; ok is false when it is not one.
func ParseRank(payload string) (leaderPID uint32, r Rank, ok bool) {
	num, rest, found := strings.Cut(payload, rankTag)
	if !found {
		return 0, Rank{}, false
	}
	pid, err := strconv.ParseUint(num, 10, 32)
	if err != nil || pid == 0 || num != strconv.FormatUint(pid, 10) {
		return 0, Rank{}, false
	}
	prio, version, found := strings.Cut(rest, "\t")
	p, err := strconv.Atoi(prio)
	if !found || err != nil || prio != strconv.Itoa(p) || len(version) > MaxRankVersion || strings.ContainsAny(version, "\t\n") {
		return 0, Rank{}, false
	}
	return uint32(pid), Rank{Priority: p, Version: version}, true
}

// SendRank tells the leader on backend leaderPID this candidate's rank, on
// t's resign channel, where a leader listens from its first renew on.
func (l *Lease) SendRank(ctx context.Context, t *Target, leaderPID uint32, r Rank) error {
	_, err := l.conn.Exec(ctx, statement("handover", "rank"), t.ResignChannel(), RankPayload(leaderPID, r))
	return err
}

// Candidate reports the name of backend pid when it stands for t (it holds
// t's roster lock or waits for t's lock) and is a session of this
// session's own login role; ok is false otherwise.
func (l *Lease) Candidate(ctx context.Context, t *Target, pid uint32) (name string, ok bool, err error) {
	err = l.conn.QueryRow(ctx, statement("handover", "candidate"),
		int32(pid), uint32(Space), uint32(t.Roster()), t.ClassID, t.ObjID, t.ObjSubID).Scan(&name)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return name, true, nil
}

// Names reports whether a session whose application_name is app is the
// candidate identity: app is identity, or identity and a ranked
// candidate's rank, " [N0 1.8.0]" (leader.Rank; the handover statements
// match names the same way).
func Names(app, identity string) bool {
	if app == identity {
		return true
	}
	rest, ok := strings.CutPrefix(app, identity+" [")
	if !ok || identity == "" {
		return false
	}
	rest, ok = strings.CutSuffix(rest, "]")
	if !ok || rest == "" || !strings.ContainsRune("PNO", rune(rest[0])) {
		return false
	}
	prio, version, hasVersion := strings.Cut(strings.TrimPrefix(rest[1:], "-"), " ")
	if prio == "" || strings.Trim(prio, "0123456789") != "" {
		return false
	}
	if !hasVersion {
		return true
	}
	version = strings.TrimPrefix(version, "v")
	return version != "" && version[0] >= '0' && version[0] <= '9' &&
		strings.Trim(version, "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.+-") == ""
}
