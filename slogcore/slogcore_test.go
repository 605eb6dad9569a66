package slogcore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/pgleader/pgleader/slogcore"
)

// recorder is an slog.Handler that keeps the records it gets, with the
// attributes and groups its WithAttrs and WithGroup calls added.
type recorder struct {
	mu      *sync.Mutex
	records *[]slog.Record
	level   slog.Level
	prefix  []string    // groups opened with WithGroup
	with    []slog.Attr // attributes added with WithAttrs, under prefix
}

func newRecorder(level slog.Level) *recorder {
	return &recorder{mu: &sync.Mutex{}, records: &[]slog.Record{}, level: level}
}

func (r *recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= r.level }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec = rec.Clone()
	rec.AddAttrs(slog.String("prefix", strings.Join(r.prefix, ".")))
	rec.AddAttrs(r.with...)
	*r.records = append(*r.records, rec)
	return nil
}

func (r *recorder) WithAttrs(as []slog.Attr) slog.Handler {
	c := *r
	c.with = append(append([]slog.Attr{}, r.with...), as...)
	return &c
}

func (r *recorder) WithGroup(name string) slog.Handler {
	c := *r
	c.prefix = append(append([]string{}, r.prefix...), name)
	return &c
}

func (r *recorder) last(t *testing.T) slog.Record {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(*r.records) == 0 {
		t.Fatal("no record")
	}
	return (*r.records)[len(*r.records)-1]
}

func attrs(r slog.Record) map[string]slog.Value {
	m := map[string]slog.Value{}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value; return true })
	return m
}

type point struct{ X, Y int }

func (p point) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddInt("x", p.X)
	enc.AddInt("y", p.Y)
	return nil
}

var errBoom = errors.New("boom")

func TestLevelsAndFields(t *testing.T) {
	h := newRecorder(slog.LevelDebug)
	log := slogcore.New(h)
	for _, tt := range []struct {
		log  func(string, ...zap.Field)
		want slog.Level
	}{
		{log.Debug, slog.LevelDebug}, {log.Info, slog.LevelInfo}, {log.Warn, slog.LevelWarn},
		{log.Error, slog.LevelError}, {log.DPanic, slog.LevelError + 4},
	} {
		tt.log("msg")
		if got := h.last(t).Level; got != tt.want {
			t.Errorf("level %v, want %v", got, tt.want)
		}
	}
	wrapped := fmt.Errorf("renew: %w", errBoom)
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	log.Info("fields",
		zap.String("s", "v"), zap.Int("i", -3), zap.Uint32("u", 7), zap.Bool("b", true),
		zap.Duration("d", 1500*time.Millisecond), zap.Time("t", at), zap.Float64("f", 0.5),
		zap.Error(wrapped), zap.Object("p", point{1, 2}), zap.Strings("list", []string{"a", "b"}))
	r := h.last(t)
	a := attrs(r)
	if r.Message != "fields" || a["s"].String() != "v" || a["i"].Int64() != -3 || a["u"].Uint64() != 7 || !a["b"].Bool() {
		t.Errorf("scalars: %v", a)
	}
	if a["d"].Kind() != slog.KindDuration || a["d"].Duration() != 1500*time.Millisecond {
		t.Errorf("duration: %v (%v)", a["d"], a["d"].Kind())
	}
	if a["t"].Kind() != slog.KindTime || !a["t"].Time().Equal(at) {
		t.Errorf("time: %v (%v)", a["t"], a["t"].Kind())
	}
	if a["f"].Kind() != slog.KindFloat64 || a["f"].Float64() != 0.5 {
		t.Errorf("float: %v (%v)", a["f"], a["f"].Kind())
	}
	if err, ok := a["error"].Any().(error); !ok || !errors.Is(err, errBoom) {
		t.Errorf("error: %v, want the error value itself", a["error"])
	}
	if g := a["p"]; g.Kind() != slog.KindGroup || fmt.Sprint(g) != "[x=1 y=2]" {
		t.Errorf("object: %v (%v)", g, g.Kind())
	}
	if l, ok := a["list"].Any().([]any); !ok || len(l) != 2 {
		t.Errorf("array: %#v", a["list"].Any())
	}
}

// zap.Namespace and a logger's name become groups and attributes, in Write
// and in With; With's attributes reach the handler through WithAttrs.
func TestGroupsAndWith(t *testing.T) {
	h := newRecorder(slog.LevelInfo)
	log := slogcore.New(h).Named("elector").With(zap.String("key", "k1"), zap.Namespace("tenure"), zap.Int64("term", 4))
	log.Info("elected", zap.Namespace("wait"), zap.Duration("acquire", time.Millisecond))
	r := h.last(t)
	a := attrs(r)
	if a["logger"].String() != "elector" || a["prefix"].String() != "tenure" || a["key"].String() != "k1" || a["term"].Int64() != 4 {
		t.Errorf("with: %v", a)
	}
	if g := a["wait"]; g.Kind() != slog.KindGroup || fmt.Sprint(g) != "[acquire=1ms]" {
		t.Errorf("namespace in Write: %v", g)
	}
	// Below the handler's level nothing is built.
	log.Debug("hidden")
	if got := h.last(t).Message; got != "elected" {
		t.Errorf("a debug entry reached an info handler: %q", got)
	}
}

// Through a real JSON handler: the shape an slog user sees.
func TestJSONHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slogcore.New(slog.NewJSONHandler(&buf, nil))
	log.Warn("demoted", zap.Error(errBoom), zap.Duration("held", 2*time.Second))
	out := buf.String()
	for _, want := range []string{`"level":"WARN"`, `"msg":"demoted"`, `"error":"boom"`, `"held":2000000000`} {
		if !strings.Contains(out, want) {
			t.Errorf("%s lacks %s", out, want)
		}
	}
}
