module github.com/layerstore/layerstore

go 1.26.0

require (
	github.com/BurntSushi/toml v1.6.0
	github.com/containerd/stargz-snapshotter/estargz v0.19.1
	github.com/docker/docker-credential-helpers v0.9.10
	github.com/go-json-experiment/json v0.0.0-20260820222146-c27c302e5fc3
	github.com/google/go-containerregistry v0.22.1
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/klauspost/compress v1.20.3
	github.com/opencontainers/go-digest v1.0.0
	github.com/opencontainers/image-spec v1.1.1
	github.com/sirupsen/logrus v1.10.2
	go.podman.io/image/v5 v5.42.0
	go.podman.io/storage v1.65.0
	golang.org/x/sync v0.24.0
	golang.org/x/sys v0.49.0
)

require (
	github.com/docker/cli v29.9.0+incompatible // indirect
	github.com/docker/go-units v0.5.0 // indirect
	github.com/moby/sys/capability v0.4.0 // indirect
	github.com/moby/sys/mountinfo v0.7.2 // indirect
	github.com/moby/sys/user v0.4.1 // indirect
	github.com/opencontainers/runtime-spec v1.3.0 // indirect
	github.com/vbatts/tar-split v0.12.3 // indirect
	gotest.tools/v3 v3.5.2 // indirect
)

// go-fuse v2.12.1, trimmed to what the build and the tests use, with the patch described in
// internal/third_party/go-fuse/README.md.
replace github.com/hanwen/go-fuse/v2 => ./internal/third_party/go-fuse
