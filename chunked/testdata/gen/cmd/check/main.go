// Command check verifies fixture directories and prints their layout:
//
//	go run ./cmd/check ../fixtures/*
package main

import (
	"fmt"
	"os"

	"github.com/layerstore/layerstore/chunked/testdata/gen/fixture"
)

func main() {
	failed := false
	for _, dir := range os.Args[1:] {
		if err := fixture.Check(os.Stdout, dir); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", dir, err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}
