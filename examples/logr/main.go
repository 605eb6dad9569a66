// Command logr runs an elector that logs through a logr.Logger, as a
// controller-runtime or client-go program would: logr's own slog bridge,
// then pgleader's zap core over slog, one line in the Config.
//
//	Logger: slogcore.New(logr.ToSlogHandler(log)) // log is your logr.Logger
//
// It campaigns on $DATABASE_URL until Ctrl-C; start it twice to see the
// second follow and take over.
//
//	DATABASE_URL=postgres://... go run ./examples/logr
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/slogcore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Your program's logr.Logger; funcr writes to stdout here.
	log := funcr.New(func(prefix, args string) { fmt.Println(prefix, args) }, funcr.Options{})

	e, err := elector.New(elector.Config{
		Connect: elector.DSN(os.Getenv("DATABASE_URL")),
		Key:     leader.KeyFromName("logr-example"),
		Logger:  slogcore.New(logr.ToSlogHandler(log)),
		Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, _ leader.Leadership) {
			log.Info("leading until stopped")
			<-ctx.Done()
		}},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "logr:", err)
		os.Exit(2)
	}
	if err := e.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "logr:", err)
		os.Exit(1)
	}
}
