package leader

// Untime has a Connector made by DSN turn transaction_timeout off in its
// next connection's startup packet, as it does once a connection found
// PostgreSQL 17 or later.
func Untime(c Connector) { c.(*dsnConnector).untime() }
