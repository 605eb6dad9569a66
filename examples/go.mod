module github.com/pgleader/pgleader/examples

// Go 1.26: franz-go's in-process Kafka (kfake), which examples/kafka-singleton
// runs, requires it. The library modules need only Go 1.25.
go 1.26.0

require github.com/pgleader/pgleader v0.0.0-20261203232724-d9e24ba23b37

require (
	github.com/go-co-op/gocron/v2 v2.21.2
	github.com/go-logr/logr v1.4.3
	github.com/jackc/pgx/v5 v5.12.0
	github.com/pgleader/pgleader/contrib/gocronleader v0.0.0-20261203232724-d9e24ba23b37
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kadm v1.20.0
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
	go.uber.org/zap v1.28.0
)

require (
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/jonboulle/clockwork v0.5.0 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.1 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	go.uber.org/multierr v1.10.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
)
