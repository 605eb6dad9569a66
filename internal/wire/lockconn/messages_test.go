package lockconn_test

import (
	"errors"
	"testing"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
)

// Hostile identities (any printable ASCII is a valid identity) cannot
// change a group message's meaning: each one round-trips as itself.
func TestGroupMessagesRoundTrip(t *testing.T) {
	ids := []string{
		"a", "member-1", `a resigned 1.2.1 to b`, ` resigned `, `gone x`, `"`, `\`, `\"`, `""`, ` `, `joined`,
		`x" 1.2.1 "y`, `x" 1.2.1 "y" extra`, `%q`, `~!@#$%^&*()_+{}|:<>?`,
	}
	tag := lockconn.Tag3{C: 4294967295, O: 0, S: 2}
	var msgs []lockconn.GroupMessage
	msgs = append(msgs, lockconn.GroupMessage{Kind: lockconn.GroupJoined}, lockconn.GroupMessage{Kind: lockconn.GroupReleased})
	for _, id := range ids {
		msgs = append(msgs, lockconn.GroupMessage{Kind: lockconn.GroupGone, Member: id})
		for _, to := range ids {
			msgs = append(msgs, lockconn.GroupMessage{Kind: lockconn.GroupResigned, Member: id, Key: tag, To: to})
		}
		msgs = append(msgs, lockconn.GroupMessage{Kind: lockconn.GroupResigned, Member: id, Key: lockconn.Tag3{C: 1, O: 2, S: 1}})
	}
	for _, m := range msgs {
		enc := lockconn.EncodeGroup(m)
		got, err := lockconn.ParseGroup(enc)
		if err != nil || got != m {
			t.Errorf("%+v: encoded %q, parsed back %+v, %v", m, enc, got, err)
		}
	}
}

// Whatever is not exactly what EncodeGroup writes is refused.
func TestGroupMessagesRefused(t *testing.T) {
	for _, s := range []string{
		"", " ", "joined ", " joined", "released x", "JOINED", "gone", "gone x", `gone ""`, `gone "x" `, `gone "x`,
		`gone 'x'`, "gone `x`", `resigned "a"`, `resigned "a" 1.2.1`, `resigned "a" 1.2.3 "b"`, `resigned "a" 1.2.0 "b"`,
		`resigned "a" 01.2.1 "b"`, `resigned "a" +1.2.1 "b"`, `resigned "a" 1.2.+1 "b"`, `resigned "a" 4294967296.2.1 "b"`,
		`resigned "a" -1.2.1 "b"`, `resigned "a"  1.2.1 "b"`, `resigned "a" 1.2.1 "b" `, `resigned "a" 1.2.1 b`,
		`resigned "" 1.2.1 "b"`, `resigned "\x61" 1.2.1 "b"`, `a resigned 1.2.1 to b`, "EVIL", `gone "a" gone "b"`,
	} {
		if m, err := lockconn.ParseGroup(s); !errors.Is(err, lockconn.ErrBadMessage) {
			t.Errorf("%q: parsed as %+v, %v", s, m, err)
		}
	}
}

// Parsing never panics, and what it accepts encodes back to itself.
func FuzzParseGroup(f *testing.F) {
	for _, s := range []string{"joined", "released", `gone "x"`, `resigned "a" 1.2.1 "b"`, `resigned "a\"" 1.2.2 ""`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := lockconn.ParseGroup(s)
		if err == nil && lockconn.EncodeGroup(m) != s {
			t.Fatalf("%q parsed as %+v, which encodes as %q", s, m, lockconn.EncodeGroup(m))
		}
	})
}
