// Command kafka-singleton keeps exactly one Kafka consumer of a topic alive
// across a fleet: the leader creates its franz-go client when elected and,
// on demotion, stops polling, commits what it processed and closes the
// client, before the next leader starts consuming.
//
//	KAFKA_BROKERS=localhost:9092 KAFKA_TOPIC=events go run ./examples/kafka-singleton
//
// Without KAFKA_BROKERS it says so and exits; it still compiles in CI.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/exampledb"
	"github.com/pgleader/pgleader/leader"
)

func main() {
	brokers := os.Getenv("KAFKA_BROKERS")
	if brokers == "" {
		fmt.Println("kafka-singleton: KAFKA_BROKERS is not set; set it (and KAFKA_TOPIC) to run against a real broker")
		return
	}
	if err := run(strings.Split(brokers, ","), envOr("KAFKA_TOPIC", "events")); err != nil {
		fmt.Fprintln(os.Stderr, "kafka-singleton:", err)
		os.Exit(1)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func run(brokers []string, topic string) error {
	dsn, release, err := exampledb.DSN()
	if err != nil {
		return err
	}
	defer release()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	e, err := elector.New(elector.Config{
		Connect: elector.DSN(dsn),
		Key:     leader.KeyFromName("kafka-singleton/" + topic),
		Callbacks: elector.Callbacks{
			OnElected: func(ctx context.Context, l leader.Leadership) {
				if err := consume(ctx, brokers, topic, l); err != nil {
					fmt.Fprintln(os.Stderr, "consumer:", err)
				}
			},
			OnDemoted: func(l leader.Leadership, reason error) {
				fmt.Printf("%s stopped consuming: %v\n", l.Identity, reason)
			},
		},
		// Leave time to commit and close before the lock is released.
		ReleaseTimeout: 15 * time.Second,
	})
	if err != nil {
		return err
	}
	return e.Run(ctx)
}

// consume polls until ctx is done, then commits and closes. The elector
// keeps the lock until it returns, so two consumers never overlap.
func consume(ctx context.Context, brokers []string, topic string, l leader.Leadership) error {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumerGroup("pgleader-singleton"),
		kgo.ConsumeTopics(topic),
		kgo.AutoCommitMarks(), // commit only what was processed (marked)
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	fmt.Printf("%s consuming %s\n", l.Identity, topic)
	for ctx.Err() == nil {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			break
		}
		fetches.EachRecord(func(r *kgo.Record) {
			fmt.Printf("  %s/%d@%d: %s\n", r.Topic, r.Partition, r.Offset, r.Value)
		})
		cl.MarkCommitRecords(fetches.Records()...)
	}
	// Demoted or stopping: commit what was processed, on a fresh deadline.
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return cl.CommitMarkedOffsets(cctx)
}
