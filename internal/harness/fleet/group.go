package fleet

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/pgleader/pgleader/group"
	"github.com/pgleader/pgleader/leader"
)

// GroupKeys returns the keys of a group member's Options: Keys names
// "<Key>/0" to "<Key>/<Keys-1>".
func GroupKeys(o Options) []leader.Key {
	keys := make([]leader.Key, o.Keys)
	for i := range keys {
		keys[i] = leader.KeyFromName(GroupKeyName(o.Key, i))
	}
	return keys
}

// GroupKeyName is the name of a group's i-th key.
func GroupKeyName(group string, i int) string { return fmt.Sprintf("%s/%d", group, i) }

// runGroupMember runs one member of the group o.Key (Options.Keys > 0).
// Per key it reports "elected", "returned" (OnElected returned) and
// "demoted", with the key's name in Data; "resign" resigns one key it
// leads, after a "resigning" event.
func runGroupMember(ctx context.Context, o Options, in io.Reader, em *Emitter) error {
	g, err := group.New(group.Config{
		Connect:  leader.DSN(o.DSN),
		Group:    o.Key,
		Keys:     GroupKeys(o),
		Identity: o.ID,
		Callbacks: group.Callbacks{
			OnElected: func(ctx context.Context, l leader.Leadership) {
				em.Emit(Event{Ev: "elected", Identity: o.ID, Term: l.Term, Data: l.Key.Name()})
				<-ctx.Done()
				em.Emit(Event{Ev: "returned", Identity: o.ID, Term: l.Term, Data: l.Key.Name()})
			},
			OnDemoted: func(l leader.Leadership, reason error) {
				em.Emit(Event{Ev: "demoted", Identity: o.ID, Term: l.Term, Data: l.Key.Name(), Err: leader.ReasonLabel(reason)})
			},
		},
		RenewInterval: o.Interval, RenewDeadline: o.Deadline, LeaseDuration: o.Lease,
		Fencing:          group.Fencing{Enabled: o.Fencing},
		SingleConnection: o.SingleConnection,
		Logger:           debugLogger(o.ID),
	})
	if err != nil {
		return err
	}
	resign := func(ctx context.Context) {
		if owned := g.Owned(); len(owned) > 0 {
			em.Emit(Event{Ev: "resigning", Identity: o.ID, Data: owned[0].Name()})
			go func() {
				if err := g.Resign(ctx, owned[0]); err != nil && ctx.Err() == nil {
					em.Emit(Event{Ev: "resign-failed", Identity: o.ID, Data: owned[0].Name(), Err: err.Error()})
				}
			}()
		}
	}
	stats := func() string {
		st := g.Status()
		return fmt.Sprintf("%d %d %d %d", st.Rounds, st.LightRounds, st.WatchWaits, st.Scans)
	}
	return serveCommands(ctx, o.ID, in, em, g.Run, resign, stats)
}

// debugLogger is a member's logger: with $PGLEADER_FLEET_LOGDIR set, debug
// lines to <dir>/<identity>.log (how the group's resign regression was
// traced); none otherwise. The lines of each key's tenure (elected,
// handing over, demoted) are left out unless $PGLEADER_FLEET_LOGKEYS is
// set: at 100,000 keys, writing them made the member's rounds late enough
// to lapse, and the trace showed the logger rather than the member.
func debugLogger(id string) *zap.Logger {
	dir := os.Getenv("PGLEADER_FLEET_LOGDIR")
	if dir == "" {
		return nil
	}
	c := zap.NewDevelopmentConfig()
	c.OutputPaths = []string{filepath.Join(dir, id+".log")}
	c.EncoderConfig.EncodeTime = zapcore.TimeEncoderOfLayout("15:04:05.000000") // a hand-over takes a millisecond or two
	var opts []zap.Option
	if os.Getenv("PGLEADER_FLEET_LOGKEYS") == "" {
		opts = append(opts, zap.WrapCore(func(c zapcore.Core) zapcore.Core { return skipKeyLines{c} }))
	}
	l, err := c.Build(opts...)
	if err != nil {
		return nil
	}
	return l
}

// skipKeyLines leaves out a group's lines about one key's tenure.
type skipKeyLines struct{ zapcore.Core }

var keyLines = map[string]bool{"elected": true, "handing over": true, "demoted": true}

func (c skipKeyLines) With(f []zapcore.Field) zapcore.Core { return skipKeyLines{c.Core.With(f)} }

func (c skipKeyLines) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.Level == zapcore.DebugLevel && keyLines[e.Message] {
		return ce
	}
	return c.Core.Check(e, ce)
}
