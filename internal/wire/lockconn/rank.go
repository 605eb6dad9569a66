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
	id, _, _, _, ok := SplitName(app)
	return app == identity || ok && id == identity && identity != ""
}

// SplitName splits an application_name that ends like a ranked
// candidate's into the identity and the rank's fields as the handover
// statements read them: the strategy's letter (P, N or O), the priority
// (digits after an optional "-") and the version ("" or, after an
// optional "v", a digit and the characters of a semantic version). ok is
// false for any other name. leader.ParseApplicationName reads the same,
// and also requires the priority to be an int as strconv writes it and
// the version to be a semantic version.
func SplitName(app string) (identity string, letter byte, priority, version string, ok bool) {
	i := strings.LastIndex(app, " [")
	if i <= 0 || !strings.HasSuffix(app, "]") || len(app) < i+4 {
		return app, 0, "", "", false
	}
	inner := app[i+2 : len(app)-1]
	priority, version, hasVersion := strings.Cut(inner[1:], " ")
	if !strings.ContainsRune("PNO", rune(inner[0])) || !digits(strings.TrimPrefix(priority, "-")) || hasVersion && !versionLike(version) {
		return app, 0, "", "", false
	}
	return app[:i], inner[0], priority, version, true
}

// digits reports whether s is one or more decimal digits.
func digits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// versionLike reports whether v may be a version: after an optional "v",
// a digit, then the characters of a semantic version.
func versionLike(v string) bool {
	v = strings.TrimPrefix(v, "v")
	return v != "" && v[0] >= '0' && v[0] <= '9' &&
		strings.Trim(v, "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.+-") == ""
}
