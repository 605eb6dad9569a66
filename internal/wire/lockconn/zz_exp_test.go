package lockconn_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestZZCancelForms(t *testing.T) {
	if os.Getenv("ZZ") == "" {
		t.Skip()
	}
	ctx := context.Background()
	srv := server(t)
	holder, err := pgx.Connect(ctx, srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock(1,2)"); err != nil {
		t.Fatal(err)
	}
	c, err := pgx.Connect(ctx, srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, `
CREATE FUNCTION pg_temp.fa() RETURNS int LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE g int := 0;
BEGIN
  PERFORM set_config('x.w','0',true);
  BEGIN
    PERFORM set_config('lock_timeout','3',true);
    PERFORM pg_advisory_lock(1,2);
  EXCEPTION WHEN lock_not_available OR query_canceled THEN RETURN 0;
  END;
  RETURN 1;
END $$;
CREATE FUNCTION pg_temp.fc() RETURNS int LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM set_config('x.w','0',true);
  BEGIN
    PERFORM set_config('lock_timeout','3',true);
    PERFORM pg_advisory_lock(1,2);
  EXCEPTION WHEN lock_not_available THEN RETURN 0;
  END;
  RETURN 1;
EXCEPTION WHEN query_canceled THEN RETURN 7;
END $$;
CREATE PROCEDURE pg_temp.pb(INOUT code int, INOUT waited float8) LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  waited := 0;
  PERFORM set_config('x.w','0',true);
  BEGIN
    PERFORM set_config('lock_timeout','3',true);
    PERFORM pg_advisory_lock(1,2);
  EXCEPTION WHEN lock_not_available THEN code := 0; RETURN;
  END;
  code := 1;
EXCEPTION WHEN query_canceled THEN code := 7;
END $$;`)
	if err != nil {
		t.Fatal(err)
	}
	forms := map[string]string{
		"from":   "SELECT w, coalesce(nullif(current_setting('x.w', true), ''), '0')::float8 FROM pg_temp.fa() w",
		"select": "SELECT pg_temp.fa(), 0::float8",
		"selc":   "SELECT pg_temp.fc(), 0::float8",
		"call":   "CALL pg_temp.pb(NULL, NULL)",
	}
	n := 1500
	if s := os.Getenv("ZZN"); s != "" {
		n = 3000
	}
	for _, name := range []string{"selc", "call", "selc", "call"} {
		q := forms[name]
		errs, codes := 0, map[int32]int{}
		for i := 0; i < n; i++ {
			d := time.Duration(rand.N(5000)) * time.Microsecond
			done := make(chan struct{})
			go func() {
				defer close(done)
				time.Sleep(d)
				cctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				_ = c.PgConn().CancelRequest(cctx)
			}()
			var code int32
			var w float64
			err := c.QueryRow(ctx, q).Scan(&code, &w)
			<-done
			var pe *pgconn.PgError
			if errors.As(err, &pe) {
				errs++
			} else if err != nil {
				t.Fatal(err)
			} else {
				codes[code]++
			}
			time.Sleep(3 * time.Millisecond)
		}
		t.Logf("%s: errors %d of %d, codes %v", name, errs, n, codes)
	}
}
