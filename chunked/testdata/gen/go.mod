module github.com/layerstore/layerstore/chunked/testdata/gen

go 1.26.8

require (
	github.com/klauspost/compress v1.20.3
	github.com/layerstore/layerstore v0.0.0
)

replace github.com/layerstore/layerstore => ../../..
