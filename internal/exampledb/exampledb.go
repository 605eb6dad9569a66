// Package exampledb gives the examples a database: $DATABASE_URL when set,
// otherwise a throwaway PostgreSQL.
package exampledb

import (
	"fmt"
	"os"

	"github.com/pgleader/pgleader/internal/pgtemp"
)

// DSN returns a connection string and a function that releases it.
func DSN() (string, func(), error) {
	if dsn := os.Getenv("DATABASE_URL"); dsn != "" {
		return dsn, func() {}, nil
	}
	fmt.Println("DATABASE_URL not set: starting a throwaway PostgreSQL ...")
	srv, err := pgtemp.New(pgtemp.Options{})
	if err != nil {
		return "", nil, err
	}
	return srv.DSN(), srv.Close, nil
}
