module github.com/layerstore/layerstore

go 1.26.0

require (
	github.com/containerd/stargz-snapshotter/estargz v0.19.1
	github.com/go-json-experiment/json v0.0.0-20260820222146-c27c302e5fc3
	github.com/google/go-containerregistry v0.22.1
	github.com/klauspost/compress v1.20.3
	github.com/opencontainers/go-digest v1.0.0
)

require github.com/vbatts/tar-split v0.12.3 // indirect
