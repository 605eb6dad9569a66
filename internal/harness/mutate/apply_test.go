package main

import (
	"os"
	"strings"
	"testing"
)

func TestMutantsApply(t *testing.T) {
	for _, m := range mutants {
		b, err := os.ReadFile("../../../" + m.File)
		if err != nil {
			t.Errorf("%s: %v", m.ID, err)
			continue
		}
		if n := strings.Count(string(b), m.Old); n != 1 {
			t.Errorf("%s: Old occurs %d times in %s", m.ID, n, m.File)
		}
	}
}
