package slogcore_test

import (
	"log/slog"
	"os"

	"go.uber.org/zap"

	"github.com/pgleader/pgleader/slogcore"
)

// An elector that logs through the program's slog handler:
// elector.Config{..., Logger: slogcore.New(handler)}.
func Example() {
	handler := slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		// Drop the time so that the output is stable.
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{}
			}
			return a
		},
	})
	logger := slogcore.New(handler)
	logger.With(zap.String("key", "reports")).Info("elected", zap.Int64("term", 7))
	// Output: level=INFO msg=elected key=reports term=7
}
