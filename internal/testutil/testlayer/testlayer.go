// Package testlayer gives tests the reference layer (a tar stream holding each kind of entry a
// lazily pullable layer must reproduce; see internal/demo, which owns it) and the fixtures of
// every format made from it.
//
// The content is deterministic, so fixtures generated from it are reproducible. It is used by
// tests, benchmarks and the fixture generator, never by the daemon.
package testlayer

import "github.com/layerstore/layerstore/internal/demo"

// Epoch is the modification time of every entry that does not set its own.
var Epoch = demo.Epoch

// Entry is one member of a tar stream.
type Entry = demo.Entry

// Entries returns the reference layer's members in tar order.
func Entries() []Entry { return demo.Entries() }

// Tar returns the reference layer as an uncompressed tar stream.
func Tar() []byte { return demo.Tar() }

// Build writes entries as a tar stream.
func Build(es []Entry) []byte { return demo.BuildTar(es) }
