package podmanconf

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestWrite(t *testing.T) {
	t.Setenv("CONTAINERS_CONF", "/etc/containers/containers.conf")
	t.Setenv("LISTEN_FDS", "3")
	dir := t.TempDir()
	env, err := Write(dir, Config{RunRoot: "/r", Store: "/mnt/s", RegistryHost: "127.0.0.1:5000",
		IgnoreCgroupsV1Warning: true, Drop: SocketActivation})
	if err != nil {
		t.Fatal(err)
	}
	storage, err := os.ReadFile(filepath.Join(dir, "storage.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`driver = "overlay"`, `runroot = "/r/run"`, `additionallayerstores = ["/mnt/s:ref"]`} {
		if !strings.Contains(string(storage), want) {
			t.Errorf("storage.conf lacks %s:\n%s", want, storage)
		}
	}
	for _, f := range []string{"containers.conf", "registries.conf", "home/auth.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	for _, want := range []string{"CONTAINERS_CONF=" + filepath.Join(dir, "containers.conf"),
		"TMPDIR=" + filepath.Join(dir, "copy"), "PODMAN_IGNORE_CGROUPSV1_WARNING=1"} {
		if !slices.Contains(env, want) {
			t.Errorf("environment lacks %s", want)
		}
	}
	for _, kv := range env {
		if kv == "CONTAINERS_CONF=/etc/containers/containers.conf" || strings.HasPrefix(kv, "LISTEN_FDS=") {
			t.Errorf("environment keeps %s", kv)
		}
	}

	env, err = Write(dir, Config{RunRoot: "/r", RegistryHost: "127.0.0.1:5000"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(env, "LISTEN_FDS=3") || slices.Contains(env, "PODMAN_IGNORE_CGROUPSV1_WARNING=1") {
		t.Errorf("without Drop and IgnoreCgroupsV1Warning: %q", env)
	}
	if storage, _ := os.ReadFile(filepath.Join(dir, "storage.conf")); strings.Contains(string(storage), "additionallayerstores") {
		t.Errorf("storage.conf without a store:\n%s", storage)
	}
}
