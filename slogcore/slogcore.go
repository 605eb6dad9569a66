// Package slogcore lets a program that logs with log/slog pass its logger
// to pgleader, whose Config.Logger is a *zap.Logger: New wraps an
// slog.Handler in a zap logger whose core writes every entry to that
// handler. (zap's own bridge, go.uber.org/zap/exp/zapslog, goes the other
// way: an slog front over a zap core.)
//
//	cfg.Logger = slogcore.New(slog.Default().Handler())
//
// The mapping: zap's Debug, Info, Warn and Error levels become slog's;
// DPanic, Panic and Fatal become slog.LevelError+4 (slog has no level
// above Error). Fields keep their types: strings, integers, floats, bools,
// durations and times become slog values of the same kind; an error field
// becomes an slog.Any holding the error itself (handlers format it with
// its Error method, or see through it with errors.As); zap.Object fields,
// zap.Namespace and a logger's name become groups and attributes; arrays
// become []any. The caller, when zap records it (zap.AddCaller), becomes
// the record's source.
package slogcore

import (
	"context"
	"log/slog"
	"sort"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a zap logger that writes to h.
func New(h slog.Handler) *zap.Logger { return zap.New(NewCore(h)) }

// NewCore returns a zapcore.Core that writes to h.
func NewCore(h slog.Handler) zapcore.Core { return &core{h: h} }

type core struct {
	h slog.Handler
}

// Level maps a zap level to slog's.
func Level(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	case l == zapcore.ErrorLevel:
		return slog.LevelError
	default: // DPanic, Panic, Fatal
		return slog.LevelError + 4
	}
}

func (c *core) Enabled(l zapcore.Level) bool { return c.h.Enabled(context.Background(), Level(l)) }

func (c *core) With(fields []zapcore.Field) zapcore.Core {
	// A zap.Namespace in With: the fields after it, here and in every later
	// call, go into it, which is what slog's WithGroup does.
	h, pending := c.h, []zapcore.Field{}
	flush := func() {
		if attrs := convert(pending); len(attrs) > 0 {
			h = h.WithAttrs(attrs)
		}
		pending = pending[:0]
	}
	for _, f := range fields {
		if f.Type == zapcore.NamespaceType {
			flush()
			h = h.WithGroup(f.Key)
			continue
		}
		pending = append(pending, f)
	}
	flush()
	return &core{h: h}
}

func (c *core) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *core) Write(e zapcore.Entry, fields []zapcore.Field) error {
	r := slog.NewRecord(e.Time, Level(e.Level), e.Message, e.Caller.PC)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	r.AddAttrs(convert(fields)...)
	if e.Stack != "" {
		r.AddAttrs(slog.String("stacktrace", e.Stack))
	}
	return c.h.Handle(context.Background(), r)
}

func (c *core) Sync() error { return nil }

// convert turns fields into attributes, in order; the fields after a
// zap.Namespace nest in a group of its name.
func convert(fields []zapcore.Field) []slog.Attr {
	var outer [][]slog.Attr // the enclosing levels' attributes
	var names []string      // the open namespaces
	cur := []slog.Attr{}
	for _, f := range fields {
		switch f.Type {
		case zapcore.NamespaceType:
			outer, names, cur = append(outer, cur), append(names, f.Key), []slog.Attr{}
		case zapcore.SkipType:
		case zapcore.ErrorType:
			if err, ok := f.Interface.(error); ok {
				cur = append(cur, slog.Any(f.Key, err))
			} else {
				cur = append(cur, viaEncoder(f)...)
			}
		case zapcore.DurationType:
			cur = append(cur, slog.Duration(f.Key, time.Duration(f.Integer)))
		case zapcore.StringType:
			cur = append(cur, slog.String(f.Key, f.String))
		case zapcore.BoolType:
			cur = append(cur, slog.Bool(f.Key, f.Integer == 1))
		case zapcore.Int64Type, zapcore.Int32Type, zapcore.Int16Type, zapcore.Int8Type:
			cur = append(cur, slog.Int64(f.Key, f.Integer))
		case zapcore.Uint64Type, zapcore.Uint32Type, zapcore.Uint16Type, zapcore.Uint8Type, zapcore.UintptrType:
			cur = append(cur, slog.Uint64(f.Key, uint64(f.Integer)))
		default:
			cur = append(cur, viaEncoder(f)...)
		}
	}
	for i := len(outer) - 1; i >= 0; i-- {
		cur = append(outer[i], slog.Attr{Key: names[i], Value: slog.GroupValue(cur...)})
	}
	return cur
}

// viaEncoder converts any other field (times, floats, objects, arrays,
// stringers, reflected values) through zap's own map encoder, which keeps
// Go types.
func viaEncoder(f zapcore.Field) []slog.Attr {
	enc := zapcore.NewMapObjectEncoder()
	f.AddTo(enc)
	return mapAttrs(enc.Fields)
}

// mapAttrs converts a MapObjectEncoder's fields; nested maps (objects)
// become groups. Keys sort, as a map keeps no order.
func mapAttrs(m map[string]any) []slog.Attr {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	attrs := make([]slog.Attr, 0, len(keys))
	for _, k := range keys {
		switch v := m[k].(type) {
		case map[string]any:
			attrs = append(attrs, slog.Attr{Key: k, Value: slog.GroupValue(mapAttrs(v)...)})
		default:
			attrs = append(attrs, slog.Any(k, v))
		}
	}
	return attrs
}
