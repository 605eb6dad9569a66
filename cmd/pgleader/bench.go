package main

import (
	"io"
)

func cmdBench(args []string, stdout, stderr io.Writer) error {
	return usageError{"bench is not built yet"}
}
