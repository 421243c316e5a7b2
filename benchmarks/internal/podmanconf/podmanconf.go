// Package podmanconf owns the private configuration the benchmarks give podman, so that
// nothing under /etc/containers, nor the machine's credentials, is read or changed: Write puts
// containers.conf, storage.conf (overlay, optionally with an additional layer store) and
// registries.conf (a plain-HTTP registry) into a directory and returns the environment that
// points podman at them; CleanEnv is this process's environment without the variables that
// point a runtime at the machine's configuration or credentials.
//
// The layout below the directory: the three files; home/ (HOME, XDG_RUNTIME_DIR,
// XDG_CONFIG_HOME, DOCKER_CONFIG, and home/auth.json, REGISTRY_AUTH_FILE); copy/ (TMPDIR and
// image_copy_tmp_dir); graph/ (c/storage's graph root); networks/. Below the run root: run/
// (c/storage's run root) and libpod/ (libpod's tmp_dir).
package podmanconf

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// Config is what Write writes and the environment it returns.
type Config struct {
	// RunRoot holds c/storage's run root and libpod's tmp_dir. It must be a short path:
	// podman 4.3.1 waits 20 s for the exit of every container whose run root is longer than
	// about 45 characters (measured: 41 fine, 49 not).
	RunRoot string
	// Store, when set, is the additional layer store (a mountpoint), given as "Store:ref".
	Store string
	// RegistryHost is the registry's host:port, spoken to in plain HTTP.
	RegistryHost string
	// IgnoreCgroupsV1Warning adds PODMAN_IGNORE_CGROUPSV1_WARNING=1 to the environment.
	IgnoreCgroupsV1Warning bool
	// Drop names further variables of this process's environment to leave out (see CleanEnv).
	Drop []string
}

// Write writes the configuration into dir (which must exist) and returns the environment for
// podman: CleanEnv(c.Drop) and the variables that point podman at the files.
func Write(dir string, c Config) ([]string, error) {
	containersConf := fmt.Sprintf(`[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
netns = "none"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = %q
image_copy_tmp_dir = %q
[network]
network_config_dir = %q
`, filepath.Join(c.RunRoot, "libpod"), filepath.Join(dir, "copy"), filepath.Join(dir, "networks"))
	storageConf := fmt.Sprintf("[storage]\ndriver = \"overlay\"\nrunroot = %q\ngraphroot = %q\n",
		filepath.Join(c.RunRoot, "run"), filepath.Join(dir, "graph"))
	if c.Store != "" {
		storageConf += fmt.Sprintf("[storage.options]\nadditionallayerstores = [%q]\n", c.Store+":ref")
	}
	home := filepath.Join(dir, "home")
	for _, d := range []string{home, filepath.Join(dir, "copy")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	files := map[string]string{
		"containers.conf": containersConf,
		"storage.conf":    storageConf,
		"registries.conf": testregistry.RegistriesConf(c.RegistryHost),
		"home/auth.json":  "{}", // podman 4.3 wants the file to exist
	}
	for n, content := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(content), 0o644); err != nil {
			return nil, err
		}
	}
	env := []string{
		"HOME=" + home, "XDG_RUNTIME_DIR=" + home, "XDG_CONFIG_HOME=" + home, "DOCKER_CONFIG=" + home,
		"REGISTRY_AUTH_FILE=" + filepath.Join(home, "auth.json"),
		"CONTAINERS_CONF=" + filepath.Join(dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF=" + filepath.Join(dir, "storage.conf"),
		"CONTAINERS_REGISTRIES_CONF=" + filepath.Join(dir, "registries.conf"),
		"TMPDIR=" + filepath.Join(dir, "copy"),
	}
	if c.IgnoreCgroupsV1Warning {
		env = append(env, "PODMAN_IGNORE_CGROUPSV1_WARNING=1")
	}
	return CleanEnv(c.Drop, env...), nil
}

// Private names the variables CleanEnv always leaves out: those that point a runtime or the
// daemon at the machine's configuration, credentials, temporary directory or service manager.
var Private = []string{
	"HOME", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "DOCKER_CONFIG", "REGISTRY_AUTH_FILE",
	"CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF", "NOTIFY_SOCKET",
	"LAYERSTORE_CONTROL_SOCKET", "TMPDIR",
}

// SocketActivation names systemd's socket-activation variables, meant for this process alone.
var SocketActivation = []string{"LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"}

// CleanEnv is this process's environment without the variables named in Private or in drop,
// plus extra.
func CleanEnv(drop []string, extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if slices.Contains(Private, k) || slices.Contains(drop, k) {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}
