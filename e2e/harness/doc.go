// Command harness is the modern container runtime of the end-to-end tests: it does what
// podman >= 5.1 does with an additional layer store, through the same libraries
// (go.podman.io/image/v5 and go.podman.io/storage), in one process.
//
// It lives in its own module so that the product's go.mod stays free of c/image's and
// c/storage's dependency trees. It is built twice, from the same code:
//
//   - go.mod: the newest c/image and c/storage (v5.42.1, v1.65.1);
//   - go.crio.mod (and go.crio.sum): c/image v5.38.0 with c/storage
//     v1.61.1-0.20251212224252-b0f86df5a665, what CRI-O 1.35 (from 1.35.1; 1.35.0 has v1.61.0),
//     1.36 and 1.37 vendor.
//
// Build them with:
//
//	cd e2e/harness
//	tags="exclude_graphdriver_btrfs exclude_graphdriver_devicemapper containers_image_openpgp"
//	go build -tags "$tags" -o harness .
//	go build -modfile=go.crio.mod -tags "$tags" -o harness-crio .
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
//	harness crio-start [--clean-shutdown-file FILE]
//	harness crio-repair
//	harness crio-stop [--clean-shutdown-file FILE]
//	harness images [--pinned PATTERN]... [IMAGE...]
//	harness run IMAGE --list SCRIPT [--name NAME] [--hold FILE]
//	harness rmi IMAGE
//
// convert copies SRC to DST (c/image transport references such as oci:/dir:tag or
// docker://127.0.0.1:5000/repo:tag), forcing the compression ALGO (gzip, zstd,
// zstd:chunked) on every layer of the destination.
//
// pull copies docker://REF into the store of storage.conf, exactly as podman pull does, and
// reports each layer of the image, including whether c/storage took it from an additional
// layer store. Everything else pull can do happens in the same process, because modern
// c/storage does not record layers taken from an additional layer store in layers.json:
// a second process would not see them, unless the daemon records them ([runtimes] in its
// configuration), which the CRI-O steps below rely on. --pause creates FILE once the image is pulled and
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
// # CRI-O's storage steps
//
// The other subcommands do to the store what CRI-O does, through the same calls, each in a
// process of its own as CRI-O is after a restart. They open the store as CRI-O does
// (RootConfig.GetStore: storage.conf's run root, graph root, image store, driver, driver
// options, which carry additionallayerstores, and pull options) and report the c/storage and
// c/image versions they were built with ("libraries").
//
// crio-start is CRI-O's start-up: when the last stop was unclean (--clean-shutdown-file FILE
// set, FILE.supported present, FILE missing) internal_repair first (Check and Repair, as
// crio-repair); then restore, which deletes the CRI-O containers it cannot restore (those of
// "harness run" left behind: no config.json); then FILE is removed and FILE.supported written;
// then store.GarbageCollect(), which CRI-O runs at every start. It reports what each of these
// removed: records (layers.json, images.json, containers.json) and directories
// (<graphroot>/<driver>/<id>, <driver>-images/<id>, <driver>-containers/<id>).
//
// crio-repair is CRI-O's internal_repair: store.Check with CRI-O's options (mountable layers
// and data items, no digests or contents) and, when the report has errors, store.Repair with
// RepairEverything. It reports what Check found and what Repair removed. Where the check
// fails or the repair reports errors, CRI-O wipes the whole graph root: the harness says so
// ("wouldWipe") and fails instead.
//
// crio-stop is CRI-O's clean stop: store.Shutdown(false), a syncfs of the graph root, and
// FILE written.
//
// images is CRI-O's ListImages (with IMAGE arguments, its ImageStatus of each): per image its
// names, tags and digested references, top layer, layer chain, user and size as CRI-O
// computes it (img.Size() of c/image's storage image: data items, signatures and each layer's
// recorded uncompressed size), pinned as CRI-O's pinned_images patterns say (--pinned). An
// image that fails as CRI-O reads it (ref.NewImage: "layer not known" where the store lacks a
// layer) has its error reported, and the run fails: CRI-O's ListImages fails as a whole.
//
// run creates a container of IMAGE as CRI-O does (the image's config read through c/image,
// store.CreateContainer with Volatile set and CRI-O's metadata, its layer named NAME-layer),
// mounts it (StartContainer), runs SCRIPT with the image's /bin/busybox sh chrooted into it,
// unmounts it (StopContainer) and deletes it (RemoveContainer). --hold FILE creates FILE once
// the script ran and waits, the container mounted, until FILE is removed: kill the harness
// then to leave the container behind as an unclean stop does.
//
// rmi is crictl rmi (CRI-O's RemoveImage): an ID is deleted with its layers (ref.DeleteImage);
// a name is looked up with ImageStatus, then removed from the image, which is deleted if it
// was its last name. Where ImageStatus fails, CRI-O removes nothing and answers success: the
// harness fails.
//
// Results are one JSON object on stdout; progress and logs go to stderr. Every run is bounded
// by --timeout (default 2m), c/storage's calls included. Errors exit with status 1 (the CRI-O
// steps still print their JSON, with what they found), usage errors with status 2.
package main
