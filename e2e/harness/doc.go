// Command harness is the modern container runtime of the end-to-end tests: it does what
// podman >= 5.1 does with an additional layer store, through the same libraries
// (go.podman.io/image/v5 and go.podman.io/storage), in one process.
//
// It lives in its own module so that the product's go.mod stays free of c/image's and
// c/storage's dependency trees. It uses c/image v5.41 with c/storage v1.64: c/storage v1.65
// (required by c/image v5.42) needs a github.com/varlink/go pseudo-version that the module
// proxy used here does not serve. Build it with:
//
//	cd e2e/harness
//	go build -tags "exclude_graphdriver_btrfs exclude_graphdriver_devicemapper containers_image_openpgp" -o harness .
//
// The tags drop the btrfs and devicemapper graph drivers (they need C headers and are of no
// use here) and make c/image use its pure-Go OpenPGP code instead of gpgme (cgo).
//
// # Configuration
//
// Like podman, harness reads its configuration from the environment only:
//
//   - CONTAINERS_STORAGE_CONF: storage.conf (driver, graphroot, runroot, additionallayerstores).
//   - CONTAINERS_REGISTRIES_CONF: registries.conf; mark plain-http registries "insecure = true".
//   - REGISTRY_AUTH_FILE: auth.json with registry credentials (optional).
//
// The signature policy is built in code and accepts anything; /etc/containers/policy.json is
// never read. Each run uses a fresh blob-info cache in a temporary directory, because c/image
// otherwise reuses a blob already pushed in another compression.
//
// # Subcommands
//
//	harness convert [--compress ALGO] [--all] [--dest-tls-verify=false] SRC DST
//	harness pull REF [--pause FILE] [--list SCRIPT] [--save PATH] [--push DSTREF] [--rmi]
//	harness compress BLOBFILE < TAR
//
// convert copies SRC to DST (c/image transport references such as oci:/dir:tag or
// docker://127.0.0.1:5000/repo:tag), forcing the compression ALGO (gzip, zstd,
// zstd:chunked) on every layer of the destination.
//
// pull copies docker://REF into the store of storage.conf, exactly as podman pull does, and
// reports each layer of the image, including whether c/storage took it from an additional
// layer store. Everything else pull can do happens in the same process, because modern
// c/storage does not record layers taken from an additional layer store in layers.json:
// a second process would not see them. --pause creates FILE once the image is pulled and
// waits until it is removed before going on, so that a test can restart the store or stop the
// registry between the pull and the steps that read the image. --list mounts the image read-only and runs SCRIPT
// with the image's /bin/busybox sh inside it (chroot); --save writes a docker-archive (this
// reads the layer blobs); --push copies the image to another registry reference with a
// blob-info cache of its own, so that it uploads the layers read from the store instead of
// mounting the pulled blobs across repositories; --rmi deletes the image and its layers,
// even when an earlier step failed. The store is always shut down at the end.
//
// compress writes the tar stream read from stdin as a zstd:chunked blob, with c/storage's
// own compressor at its default level, and reports the annotations the layer descriptor
// needs (the benchmarks build large layers this way, without a registry round trip).
//
// Results are one JSON object on stdout; progress and logs go to stderr. Every run is bounded
// by --timeout (default 2m). Errors exit with status 1, usage errors with status 2.
package main
