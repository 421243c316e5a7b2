package main

// Tests of what the packages ship beside the binaries: the systemd unit (its properties, and its
// ExecStart= and ExecStopPost= run for real), packaging/config.toml against the Config struct,
// the code's defaults and docs/configuration.md, and the man pages against the commands and
// flags.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/internal/control"
	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/layer"
)

// Files of the source tree the packages install, relative to this package.
const (
	unitFilePath      = "../../systemd/layerstore.service"
	shippedConfigPath = "../../packaging/config.toml"
	configDocPath     = "../../docs/configuration.md"
	manDirPath        = "../../packaging/man"
)

// The paths the unit runs with on a node, which the test relocates under a temporary directory.
const (
	unitBinary = "/usr/bin/layerstore"
	unitConfig = "/etc/layerstore/config.toml"
	unitStore  = "/var/lib/layerstore/store"
	// unitSessionMark is where the daemon says the unit keeps its FUSE session (RuntimeDirectory=).
	unitSessionMark = "/run/layerstore/fuse-session"
)

// unitFile is a parsed systemd unit file: section -> key -> values, in order, as systemd reads
// them (an empty assignment resets a list).
type unitFile map[string]map[string][]string

func readUnitFile(t *testing.T, path string) unitFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := unitFile{}
	section := ""
	var pending string
	for n, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if pending != "" {
			line, pending = pending+" "+line, ""
		}
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if cont, ok := strings.CutSuffix(line, "\\"); ok {
			pending = cont
			continue
		}
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok || section == "" {
			t.Fatalf("%s:%d: not a key=value line in a section: %q", path, n+1, line)
		}
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if value == "" {
			u[section][key] = []string{}
			continue
		}
		u[section][key] = append(u[section][key], value)
	}
	return u
}

// words returns the space-separated words of every value of key.
func (u unitFile) words(section, key string) []string {
	var w []string
	for _, v := range u[section][key] {
		w = append(w, strings.Fields(v)...)
	}
	return w
}

// one returns the single value of key, failing if it is not set exactly once.
func (u unitFile) one(t *testing.T, section, key string) string {
	t.Helper()
	v := u[section][key]
	if len(v) != 1 {
		t.Fatalf("[%s] %s= is set %d times, want once: %q", section, key, len(v), v)
	}
	return v[0]
}

// splitUnitCommand splits a command line of the unit the way systemd does for what the unit
// uses: words separated by spaces, single- or double-quoted words, and the "-" prefix (failure
// ignored). It refuses what it does not handle (other prefixes, variables, escapes).
func splitUnitCommand(t *testing.T, line string) (argv []string, ignoreFailure bool) {
	t.Helper()
	if rest, ok := strings.CutPrefix(line, "-"); ok {
		line, ignoreFailure = rest, true
	}
	if strings.ContainsAny(line[:1], "@:+!|") || strings.ContainsAny(line, "$%\\") {
		t.Fatalf("command line %q uses syntax this test does not parse", line)
	}
	for s := strings.TrimSpace(line); s != ""; s = strings.TrimSpace(s) {
		if q := s[0]; q == '\'' || q == '"' {
			end := strings.IndexByte(s[1:], q)
			if end < 0 {
				t.Fatalf("unterminated quote in %q", line)
			}
			argv, s = append(argv, s[1:1+end]), s[2+end:]
			continue
		}
		word, rest, _ := strings.Cut(s, " ")
		argv, s = append(argv, word), rest
	}
	return argv, ignoreFailure
}

// mountNamespaceOptions are the settings with which systemd runs a service in a mount namespace
// of its own that does not propagate mounts to the host's (systemd.exec(5), PrivateMounts= and
// MountFlags=; exec_needs_mount_namespace in systemd's sources), and ProtectHostname=, which
// recent systemd implements partly with read-only mounts. A store mounted there would be
// invisible to podman and CRI-O.
var mountNamespaceOptions = []string{
	"PrivateTmp", "PrivateDevices", "PrivateMounts", "PrivateNetwork", "PrivateIPC", "PrivatePIDs",
	"PrivateUsers", "PrivateBPF", "DynamicUser", "ProtectSystem", "ProtectHome",
	"ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups",
	"ProtectProc", "ProcSubset", "ProtectHostname", "ReadWritePaths", "ReadOnlyPaths",
	"InaccessiblePaths", "ExecPaths", "NoExecPaths", "TemporaryFileSystem", "BindPaths",
	"BindReadOnlyPaths", "RootDirectory", "RootImage", "MountImages", "ExtensionImages",
	"ExtensionDirectories", "NetworkNamespacePath", "IPCNamespacePath", "MountAPIVFS",
	"BindLogSockets",
}

// TestUnitFile checks the properties of systemd/layerstore.service that the package and the
// runtimes rely on.
func TestUnitFile(t *testing.T) {
	u := readUnitFile(t, unitFilePath)
	for _, kv := range [][3]string{
		{"Service", "Type", "notify"},
		{"Service", "NotifyAccess", "main"},
		{"Service", "Restart", "on-failure"},
		{"Service", "KillMode", "mixed"},
		{"Service", "StateDirectory", "layerstore"},
		{"Service", "CacheDirectory", "layerstore"},
		{"Service", "RuntimeDirectory", "layerstore"},
		{"Service", "CapabilityBoundingSet", "CAP_SYS_ADMIN"},
		{"Service", "DeviceAllow", "/dev/fuse rw"},
		{"Service", "NoNewPrivileges", "yes"},
	} {
		if got := u.one(t, kv[0], kv[1]); got != kv[2] {
			t.Errorf("[%s] %s=%s, want %s", kv[0], kv[1], got, kv[2])
		}
	}
	argv, ignore := splitUnitCommand(t, u.one(t, "Service", "ExecStart"))
	if want := []string{unitBinary, "serve", "--config", unitConfig, unitStore}; ignore || !slices.Equal(argv, want) {
		t.Errorf("ExecStart=%q, want %q", argv, want)
	}
	for _, key := range []string{"Environment", "EnvironmentFile", "PassEnvironment", "UnsetEnvironment"} {
		for _, v := range u["Service"][key] {
			if strings.Contains(v, "HOME") {
				t.Errorf("%s=%s: the daemon must not depend on a HOME set for it", key, v)
			}
		}
	}
	if after := u.words("Unit", "After"); slices.Contains(after, "network.target") {
		t.Errorf("After=%q: the daemon uses the network on demand only", after)
	}
	for _, runtime := range []string{"crio.service", "podman.service"} {
		if before := u.words("Unit", "Before"); !slices.Contains(before, runtime) {
			t.Errorf("Before=%q lacks %s: the store must answer before the runtime starts", before, runtime)
		}
	}
	for _, target := range []string{"crio.service", "multi-user.target"} {
		if wanted := u.words("Install", "WantedBy"); !slices.Contains(wanted, target) {
			t.Errorf("WantedBy=%q lacks %s", wanted, target)
		}
	}
	if n, err := strconv.Atoi(u.one(t, "Service", "FileDescriptorStoreMax")); err != nil || n < 1 {
		t.Errorf("FileDescriptorStoreMax=%d (%v): the FUSE connection must fit in the store", n, err)
	}
	if p := u["Service"]["FileDescriptorStorePreserve"]; len(p) > 0 && p[len(p)-1] == "yes" {
		t.Errorf("FileDescriptorStorePreserve=yes keeps the connection of a stopped daemon: the store's accesses would hang instead of failing")
	}
	if reload := u["Service"]["ExecReload"]; len(reload) != 1 || reload[0] != "/bin/kill -HUP $MAINPID" {
		t.Errorf("ExecReload=%q, want SIGHUP to the daemon (it reloads, see TestReloadOnSIGHUP)", reload)
	}
	if post := u["Service"]["ExecStopPost"]; len(post) != 1 || !strings.Contains(post[0], "umount --lazy "+unitStore) {
		t.Errorf("ExecStopPost=%q: want the safety net detaching a dead mount at %s", post, unitStore)
	}
	for _, key := range mountNamespaceOptions {
		for _, v := range u["Service"][key] {
			if !slices.Contains([]string{"no", "false", "off", "0"}, v) {
				t.Errorf("%s=%s gives the service its own mount namespace: the store would be mounted where no runtime sees it", key, v)
			}
		}
	}
	for _, v := range u["Service"]["MountFlags"] {
		if v != "shared" {
			t.Errorf("MountFlags=%s: the store's mount would not reach the host", v)
		}
	}
}

// unitCommand makes a command of the unit runnable in a test: paths are relocated with paths,
// and, when setpriv(1) is there, it runs with the unit's capability bounding set and
// NoNewPrivileges=, as systemd would run it. The environment is systemd's for a root service:
// no HOME.
func unitCommand(t *testing.T, u unitFile, argv []string, paths map[string]string) *exec.Cmd {
	t.Helper()
	argv = slices.Clone(argv)
	for i, a := range argv {
		if p, ok := paths[a]; ok {
			argv[i] = p
			continue
		}
		for from, to := range paths {
			argv[i] = strings.ReplaceAll(argv[i], from, to)
		}
	}
	if setpriv, err := exec.LookPath("setpriv"); err == nil {
		caps := "-all"
		for _, c := range u.words("Service", "CapabilityBoundingSet") {
			caps += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
		}
		wrap := []string{setpriv, "--bounding-set=" + caps}
		if u.one(t, "Service", "NoNewPrivileges") == "yes" {
			wrap = append(wrap, "--no-new-privs")
		}
		argv = append(append(wrap, "--"), argv...)
	} else {
		t.Logf("no setpriv: running without the unit's capability bounding set")
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	return cmd
}

// TestUnitExecStart runs the unit's ExecStart= exactly as written, relocated under a temporary
// directory, with the unit's capabilities and without HOME: READY=1 only once the store is
// mounted, a lazy read through it, SIGTERM (systemctl stop) and ExecStopPost= leaving no
// mount. Then the ExecStopPost= safety net: it detaches the dead mount a killed daemon leaves
// unless the daemon's session is kept for a restart, and leaves a live mount and an empty
// mountpoint alone.
func TestUnitExecStart(t *testing.T) {
	e := newServeEnv(t)
	u := readUnitFile(t, unitFilePath)
	paths := map[string]string{unitBinary: e.bin, unitConfig: e.config, unitStore: e.mnt,
		unitSessionMark: filepath.Join(t.TempDir(), "fuse-session")}
	if err := os.Remove(e.mnt); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	execStart, _ := splitUnitCommand(t, u.one(t, "Service", "ExecStart"))
	d := e.startCmd(unitCommand(t, u, execStart, paths)) // the daemon creates the mountpoint (the unit does not)
	toc := digest.Digest(e.fixture.Desc.Annotations["io.github.containers.zstd-chunked.manifest-checksum"])
	tree, err := os.ReadDir(filepath.Join(e.layerDir(toc), "diff"))
	if err != nil || len(tree) == 0 {
		t.Fatalf("ls of the layer's diff: %v, %v", tree, err)
	}
	ref, err := testlayer.ReferenceTree(testlayer.Tar())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := sha(t, filepath.Join(e.layerDir(toc), "diff", "usr/bin/tool")), ref["usr/bin/tool"].Content; got != want {
		t.Errorf("usr/bin/tool through the store: %s, want %s", got, want)
	}

	stopPost, ignore := splitUnitCommand(t, u.one(t, "Service", "ExecStopPost"))
	if !ignore {
		t.Error("ExecStopPost= must not fail the unit (\"-\" prefix)")
	}
	runStopPost := func() {
		t.Helper()
		if out, err := unitCommand(t, u, stopPost, paths).CombinedOutput(); err != nil {
			t.Logf("ExecStopPost: %v: %s (ignored by systemd)", err, out)
		}
	}
	// A live mount (another daemon serving the path) is left alone.
	runStopPost()
	if !isMount(t, e.mnt) {
		t.Fatal("ExecStopPost removed a live store")
	}
	if _, err := os.ReadDir(e.mnt); err != nil {
		t.Fatalf("store after ExecStopPost: %v", err)
	}

	// systemctl stop: SIGTERM to the main process, which leaves its FUSE session to the service
	// manager and exits 0; this test's notify socket does not keep it, so the connection ends
	// with the daemon, and ExecStopPost detaches the dead mount.
	d.stop()
	runStopPost()
	if isMount(t, e.mnt) {
		t.Error("still mounted after SIGTERM and ExecStopPost")
	}
	runStopPost() // nothing mounted: nothing done

	// A crash leaves a dead mount. While the daemon says the service manager keeps its session
	// (the mark), the mount is left for the next daemon unless the job is a stop (no systemd
	// here: no job, as after a crash that Restart= restarts); without the mark, ExecStopPost
	// detaches it.
	d = e.startCmd(unitCommand(t, u, execStart, paths))
	d.kill()
	if _, err := os.ReadDir(e.mnt); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("store after SIGKILL: %v, want ENOTCONN", err)
	}
	mustWrite(t, paths[unitSessionMark], "")
	runStopPost()
	if !isMount(t, e.mnt) {
		t.Fatal("ExecStopPost detached a mount whose session the service manager keeps for a restart")
	}
	os.Remove(paths[unitSessionMark])
	runStopPost()
	if isMount(t, e.mnt) {
		t.Fatal("the dead mount is still there after ExecStopPost")
	}
	if _, err := os.ReadDir(e.mnt); err != nil {
		t.Errorf("mountpoint after ExecStopPost: %v", err)
	}
}

// shippedConfigSettings returns packaging/config.toml with its settings uncommented: lines
// "#key = value" and "#[table]" lose their "#"; explanations ("# text") stay comments. It fails
// if any line is not a comment, since the file must leave every default in force.
func shippedConfigSettings(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(shippedConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	s := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; s.Scan(); n++ {
		line := s.Text()
		switch {
		case strings.TrimSpace(line) == "":
		case !strings.HasPrefix(line, "#"):
			t.Errorf("%s:%d: %q is not commented out: the shipped file must leave every default in force", shippedConfigPath, n, line)
		case len(line) > 1 && line[1] != ' ' && line[1] != '#':
			out.WriteString(line[1:] + "\n")
		}
	}
	return out.String()
}

// configKeys lists the keys of the Config struct as dotted TOML paths ("registries.tag-ttl").
func configKeys(typ reflect.Type, prefix string) []string {
	var keys []string
	for i := range typ.NumField() {
		f := typ.Field(i)
		name := prefix + strings.Split(f.Tag.Get("toml"), ",")[0]
		if f.Type.Kind() == reflect.Struct {
			keys = append(keys, configKeys(f.Type, name+".")...)
			continue
		}
		keys = append(keys, name)
	}
	return keys
}

// documentedDefaults reads the table of docs/configuration.md: dotted key -> default column.
func documentedDefaults(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(configDocPath)
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `(?:\\[([a-z-]+)\\] )?([a-z-]+)` \\| (.*?) \\|")
	docs := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		key := m[2]
		if m[1] != "" {
			key = m[1] + "." + key
		}
		docs[key] = m[3]
	}
	return docs
}

// TestShippedConfig: packaging/config.toml (installed as /etc/layerstore/config.toml) names
// every key of the Config struct and of docs/configuration.md, each with the daemon's default,
// and the daemon accepts it uncommented.
func TestShippedConfig(t *testing.T) {
	settings := shippedConfigSettings(t)
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(settings), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := loadConfig(p, true) // unknown keys are errors
	if err != nil {
		t.Fatalf("the daemon refuses the shipped settings uncommented: %v", err)
	}
	var raw map[string]any
	if _, err := toml.Decode(settings, &raw); err != nil {
		t.Fatal(err)
	}
	shipped := map[string]string{} // dotted key -> value as written, without quotes
	var flatten func(prefix string, m map[string]any)
	flatten = func(prefix string, m map[string]any) {
		for k, v := range m {
			switch v := v.(type) {
			case map[string]any:
				flatten(prefix+k+".", v)
			case []any:
				shipped[prefix+k] = strings.ReplaceAll(fmt.Sprintf("%q", v), " ", ", ")
			default:
				shipped[prefix+k] = fmt.Sprint(v)
			}
		}
	}
	flatten("", raw)
	structKeys := configKeys(reflect.TypeFor[Config](), "")
	docs := documentedDefaults(t)
	for _, k := range structKeys {
		if _, ok := shipped[k]; !ok {
			t.Errorf("key %s of Config is not in %s", k, shippedConfigPath)
		}
		if _, ok := docs[k]; !ok {
			t.Errorf("key %s of Config is not in the table of %s", k, configDocPath)
		}
	}
	for k, v := range shipped {
		if doc, ok := docs[k]; !ok {
			t.Errorf("key %s of %s is not in the table of %s", k, shippedConfigPath, configDocPath)
		} else if !strings.Contains(doc, v) {
			t.Errorf("%s = %q in %s, but %s says the default is %s", k, v, shippedConfigPath, configDocPath, doc)
		}
	}
	if len(shipped) != len(structKeys) {
		t.Errorf("%s has %d keys, Config %d", shippedConfigPath, len(shipped), len(structKeys))
	}

	// The values are the defaults the daemon uses when the keys are absent.
	var want Config
	want.CacheDir = DefaultCacheDir
	want.CacheMaxSize = Size(cache.DefaultMaxSize)
	want.ControlSocket = protocol.DefaultSocket
	want.LogLevel = DefaultLogLevel
	want.AuthFiles = []string{}
	want.CredentialTTL = Duration(control.DefaultCredentialTTL)
	r := &want.Registries
	r.Conf, r.ConfDir = got.Registries.Conf, got.Registries.ConfDir // the system's; checked against the docs above
	r.TagTTL = Duration(fetcher.DefaultTagTTL)
	r.Timeout = Duration(fetcher.DefaultRequestTimeout)
	r.Stall = Duration(fetcher.DefaultStallTimeout)
	r.Attempts = fetcher.DefaultMaxAttempts
	r.PerHost = fetcher.DefaultConcurrencyPerHost
	r.MaxGap = Size(fetcher.DefaultMaxGap)
	r.MaxSpan = Size(fetcher.DefaultMaxSpan)
	r.MaxRanges = fetcher.DefaultMaxRangesPerRequest
	l := &want.Layers
	l.ResolveTimeout = Duration(layer.DefaultResolveTimeout)
	l.ReadTimeout = Duration(layer.DefaultReadTimeout)
	l.KeepTTL = Duration(layer.DefaultKeepTTL)
	l.NegativeTTL = Duration(layer.DefaultNegativeTTL)
	prefetch, passthrough := true, true
	want.Prefetch.Enabled = &prefetch
	want.Prefetch.Concurrency = layer.DefaultPrefetchConcurrency
	want.Prefetch.BatchSize = Size(layer.DefaultPrefetchBatch)
	quiet := Duration(layer.DefaultPrefetchQuiet)
	want.Prefetch.Quiet = &quiet
	want.FUSE.Passthrough = &passthrough
	record := true
	want.Runtimes.RecordLayers = &record
	want.Runtimes.Graphroots = []string{}
	want.Runtimes.CrioConfig, want.Runtimes.CrioConfigDir = crioConf.file, crioConf.dir
	for _, d := range configDiff(reflect.ValueOf(*got), reflect.ValueOf(want), "") {
		t.Errorf("%s: %s (the daemon's default)", shippedConfigPath, d)
	}
	if got.Registries.Conf == "" || got.Registries.ConfDir == "" {
		t.Errorf("registries conf %q, conf-dir %q: want the system's paths", got.Registries.Conf, got.Registries.ConfDir)
	}
}

// configDiff lists the fields of two Configs that differ, as "key: got X, want Y".
func configDiff(got, want reflect.Value, prefix string) []string {
	var diffs []string
	for i := range got.NumField() {
		name := prefix + strings.Split(got.Type().Field(i).Tag.Get("toml"), ",")[0]
		g, w := got.Field(i), want.Field(i)
		switch {
		case g.Kind() == reflect.Struct:
			diffs = append(diffs, configDiff(g, w, name+".")...)
		case g.Kind() == reflect.Pointer && !g.IsNil() && !w.IsNil():
			g, w = g.Elem(), w.Elem()
			fallthrough
		default:
			if !reflect.DeepEqual(g.Interface(), w.Interface()) {
				diffs = append(diffs, fmt.Sprintf("%s: got %v, want %v", name, g.Interface(), w.Interface()))
			}
		}
	}
	return diffs
}

// TestManPages: the man pages describe every command of `layerstore` and every flag of serve,
// status and the auth helper.
func TestManPages(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(manDirPath, name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.ReplaceAll(string(b), `\-`, "-")
	}
	page := read("layerstore.8")
	cmd := regexp.MustCompile(`(?m)^  ([a-z]+)  `)
	var commands []string
	for _, m := range cmd.FindAllStringSubmatch(usage, -1) {
		commands = append(commands, m[1])
	}
	if len(commands) < 4 {
		t.Fatalf("commands %q from the usage text: the test no longer finds them", commands)
	}
	for _, c := range commands {
		if !strings.Contains(page, "\n.B "+c+"\n") {
			t.Errorf("layerstore.8 does not describe the command %s", c)
		}
	}
	flagLine := regexp.MustCompile(`(?m)^  -([a-z-]+)`)
	for _, sub := range []string{"serve", "status"} {
		var out, errb bytes.Buffer
		run(t.Context(), []string{sub, "-h"}, &out, &errb)
		flags := flagLine.FindAllStringSubmatch(errb.String(), -1)
		if len(flags) == 0 {
			t.Fatalf("%s -h lists no flags:\n%s", sub, errb.String())
		}
		for _, f := range flags {
			if !strings.Contains(page, "--"+f[1]) {
				t.Errorf("layerstore.8 does not describe %s --%s", sub, f[1])
			}
		}
	}
	helper := read("layerstore-auth-helper.8")
	for _, want := range []string{"--control-socket", `additional-layer-store-auth-helper = "layerstore-auth-helper"`} {
		if !strings.Contains(helper, want) {
			t.Errorf("layerstore-auth-helper.8 lacks %s", want)
		}
	}
}

// TestUserUnitFile: the user unit (rootless podman) runs the daemon with the per-user
// defaults at the user's runtime directory, tells systemd when the mount answers, and detaches
// a dead mount after a stop through fusermount3 (a user cannot umount).
func TestUserUnitFile(t *testing.T) {
	u := readUnitFile(t, filepath.Join("..", "..", "systemd", "user", "layerstore.service"))
	for _, kv := range [][3]string{
		{"Service", "Type", "notify"},
		{"Service", "NotifyAccess", "main"},
		{"Service", "Restart", "on-failure"},
		{"Install", "WantedBy", "default.target"},
	} {
		if got := u.one(t, kv[0], kv[1]); got != kv[2] {
			t.Errorf("[%s] %s=%s, want %s", kv[0], kv[1], got, kv[2])
		}
	}
	if got, want := u.one(t, "Service", "ExecStart"), unitBinary+" serve %t/layerstore/store"; got != want {
		t.Errorf("ExecStart=%s, want %s (the per-user configuration, cache and socket are the defaults)", got, want)
	}
	if post := u.one(t, "Service", "ExecStopPost"); !strings.Contains(post, "fusermount3 -u -z %t/layerstore/store") {
		t.Errorf("ExecStopPost=%s: a dead rootless mount is detached with fusermount3", post)
	}
	for _, key := range []string{"CapabilityBoundingSet", "DeviceAllow", "StateDirectory"} {
		if v := u["Service"][key]; len(v) > 0 {
			t.Errorf("%s=%q in a user unit: a user manager cannot apply it", key, v)
		}
	}
}
