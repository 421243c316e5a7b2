module github.com/layerstore/layerstore/chunked/testdata/gen/notarsplit

go 1.26.8

require (
	github.com/containers/storage v1.46.1
	github.com/layerstore/layerstore/chunked/testdata/gen v0.0.0
)

require (
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/layerstore/layerstore v0.0.0 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/vbatts/tar-split v0.12.3 // indirect
	golang.org/x/sys v0.26.0 // indirect
)

replace (
	github.com/layerstore/layerstore => ../../../..
	github.com/layerstore/layerstore/chunked/testdata/gen => ..
)
