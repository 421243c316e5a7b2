// Package e2e holds the end-to-end tests: real container runtimes pulling and running images
// through a mounted layerstore daemon, from Debian's docker-registry on 127.0.0.1.
//
//   - The legacy runtime is the machine's podman (Debian 12: podman 4.3.1, which looks layers
//     up by blob digest).
//   - The modern runtime is e2e/harness, a program in its own module built on current
//     containers/image and containers/storage (which look layers up by TOC digest).
//
// The tests need root, FUSE and the packages .ci/run installs; without them they skip, unless
// LAYERSTORE_E2E=1 makes a missing prerequisite a failure. See README.md.
package e2e
