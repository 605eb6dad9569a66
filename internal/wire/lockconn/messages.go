package lockconn

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Every NOTIFY pgleader sends, by channel. NOTIFY carries no
// authentication: any role may send any payload on any channel, and the
// server stamps only the sender's backend pid, which no client can forge.
// So a message is believed only as far as the server proves it: its
// sender's pid is checked against what pg_locks shows (the key's holder, a
// group's members), or it is a hint that triggers a bounded,
// rate-limited check of the server itself, never an action.
//
//	channel                          payload                     sent by
//	pgleader.<c>.<o>.<s>             identity                    a new leader (announcement)
//	pgleader.<c>.<o>.<s>             "" (empty)                  a leader whose unlock found no heir (vacancy)
//	pgleader.resign.<c>.<o>.<s>      identity, or "" for any     anyone (a resign request; the leader checks the role)
//	pgleader.reserve.<c>.<o>.<s>     identity                    the leader, once it reserved the lock for identity
//	pgleader.reply.<pid>             ok, refused: ..., unknown: ..., failed: ...   the leader, to the asker
//	pgleader.group.<roster>          a GroupMessage              a member
//	pgleader.group.<roster>.<lock>   a GroupMessage (resigned)   a member, to one member
//
// An identity is 1 to 63 printable ASCII characters, so each payload of
// the first four kinds is one identity or none. Group messages carry
// several fields and are encoded (EncodeGroup, ParseGroup).

// GroupKind is what a group message says.
type GroupKind int

// The group messages.
const (
	// GroupJoined: the sender joined (its pid is not yet a known member's;
	// see ParseGroup's caller for what that earns it).
	GroupJoined GroupKind = iota + 1
	// GroupReleased: the sender released keys.
	GroupReleased
	// GroupGone: Member is gone (its sender's crash watch saw its lock
	// freed, or Member itself leaves).
	GroupGone
	// GroupResigned: Member resigned Key, to To ("" when no other member).
	GroupResigned
)

// GroupMessage is one message on a group's channels.
type GroupMessage struct {
	Kind   GroupKind
	Member string // GroupGone, GroupResigned
	Key    Tag3   // GroupResigned
	To     string // GroupResigned
}

// Tag3 is an advisory lock's pg_locks columns.
type Tag3 struct {
	C, O uint32
	S    int16
}

// String is "c.o.s".
func (t Tag3) String() string { return fmt.Sprintf("%d.%d.%d", t.C, t.O, t.S) }

// ErrBadMessage is wrapped by ParseGroup's errors.
var ErrBadMessage = errors.New("pgleader: not a pgleader message")

// EncodeGroup renders m: "joined", "released", `gone "<member>"`,
// `resigned "<member>" <c>.<o>.<s> "<to>"`, with every identity quoted
// (strconv.Quote), so that no identity can change a message's meaning.
func EncodeGroup(m GroupMessage) string {
	switch m.Kind {
	case GroupJoined:
		return "joined"
	case GroupReleased:
		return "released"
	case GroupGone:
		return "gone " + strconv.Quote(m.Member)
	case GroupResigned:
		return "resigned " + strconv.Quote(m.Member) + " " + m.Key.String() + " " + strconv.Quote(m.To)
	}
	return ""
}

// ParseGroup reads a group message; anything else is an error wrapping
// ErrBadMessage. It accepts exactly what EncodeGroup writes: a message is
// read, then encoded again, and must come out the same.
func ParseGroup(s string) (GroupMessage, error) {
	m, err := parseGroup(s)
	if err == nil && EncodeGroup(m) != s {
		err = fmt.Errorf("%w: not in canonical form: %q", ErrBadMessage, truncate(s, 80))
	}
	if err != nil {
		return GroupMessage{}, err
	}
	return m, nil
}

func parseGroup(s string) (GroupMessage, error) {
	bad := func(why string) (GroupMessage, error) {
		return GroupMessage{}, fmt.Errorf("%w: %s: %q", ErrBadMessage, why, truncate(s, 80))
	}
	word, rest, _ := strings.Cut(s, " ")
	switch word {
	case "joined", "released":
		if rest != "" || strings.Contains(s, " ") {
			return bad("trailing text")
		}
		if word == "joined" {
			return GroupMessage{Kind: GroupJoined}, nil
		}
		return GroupMessage{Kind: GroupReleased}, nil
	case "gone":
		member, rest, err := unquote(rest)
		if err != nil || rest != "" || member == "" {
			return bad("want gone \"member\"")
		}
		return GroupMessage{Kind: GroupGone, Member: member}, nil
	case "resigned":
		member, rest, err := unquote(rest)
		if err != nil || member == "" || !strings.HasPrefix(rest, " ") {
			return bad("want resigned \"member\" c.o.s \"to\"")
		}
		tag, rest, ok := strings.Cut(rest[1:], " ")
		key, err := parseTag(tag)
		if !ok || err != nil {
			return bad("want resigned \"member\" c.o.s \"to\"")
		}
		to, rest, err := unquote(rest)
		if err != nil || rest != "" {
			return bad("want resigned \"member\" c.o.s \"to\"")
		}
		return GroupMessage{Kind: GroupResigned, Member: member, Key: key, To: to}, nil
	}
	return bad("unknown kind")
}

// unquote reads a quoted string at the start of s and returns the rest.
func unquote(s string) (string, string, error) {
	q, err := strconv.QuotedPrefix(s)
	if err != nil || !strings.HasPrefix(q, `"`) {
		return "", "", ErrBadMessage
	}
	v, err := strconv.Unquote(q)
	if err != nil {
		return "", "", err
	}
	return v, s[len(q):], nil
}

// parseTag reads "c.o.s" as EncodeGroup writes it: decimal numbers,
// objsubid 1 or 2.
func parseTag(s string) (Tag3, error) {
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return Tag3{}, ErrBadMessage
	}
	c, err1 := strconv.ParseUint(parts[0], 10, 32)
	o, err2 := strconv.ParseUint(parts[1], 10, 32)
	sub, err3 := strconv.ParseInt(parts[2], 10, 16)
	if err1 != nil || err2 != nil || err3 != nil || (sub != 1 && sub != 2) {
		return Tag3{}, ErrBadMessage
	}
	return Tag3{C: uint32(c), O: uint32(o), S: int16(sub)}, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
