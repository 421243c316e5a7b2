package fetcher

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/sirupsen/logrus"
)

const (
	regPass = "Registry-Pa55-for-everything"
	appPass = "Team-App-Pa55-only-for-team/app"
)

// authWorld has two registries asking for credentials: basic.example.com (HTTP Basic) and
// bearer.example.com (tokens from auth.example.com). On both, user "user" reads team/app with
// appPass and every other repository with regPass.
type authWorld struct {
	*world
	basic, bearer *fakeRegistry
	tokens        *tokenServer
}

func newAuthWorld(t *testing.T) *authWorld {
	w := newWorld(t)
	a := &authWorld{world: w,
		basic:  w.registry("basic.example.com", tlsTrusted),
		bearer: w.registry("bearer.example.com", tlsTrusted),
		tokens: w.tokenServer("auth.example.com", "user", map[string]string{"team/app": appPass, "": regPass}),
	}
	img := testImage(t, 1)
	for _, r := range []*fakeRegistry{a.basic, a.bearer} {
		r.push(t, "team/app:v1", img)
		r.push(t, "other/app:v1", img)
	}
	a.basic.setAuth(basicAuth("user", map[string]string{"team/app": appPass, "": regPass}))
	a.bearer.setAuth(a.tokens.bearerAuth("bearer.example.com"))
	return a
}

// check resolves ref through c and reads its layer, failing the test on error.
func check(t *testing.T, c *Client, ref string) {
	t.Helper()
	img, err := c.Resolve(t.Context(), ref)
	if err != nil {
		t.Fatalf("%s: %v", ref, err)
	}
	b, err := c.Blob(t.Context(), img, &img.Layers[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReadAt(t.Context(), make([]byte, b.Size()), 0); err != nil {
		t.Fatalf("%s: reading the layer: %v", ref, err)
	}
}

var authRefs = []string{
	"basic.example.com/team/app:v1", "basic.example.com/other/app:v1",
	"bearer.example.com/team/app:v1", "bearer.example.com/other/app:v1",
}

// perRepoAuths are the auth file entries that open every reference of authRefs: a repository
// entry beats the registry one.
func perRepoAuths() map[string]any {
	return map[string]any{"auths": map[string]any{
		"basic.example.com":           authEntry("user", regPass),
		"basic.example.com/team/app":  authEntry("user", appPass),
		"bearer.example.com":          authEntry("user", regPass),
		"bearer.example.com/team/app": authEntry("user", appPass),
	}}
}

func emptyConf(t *testing.T) (string, string) { return writeConf(t, "") }

func TestAuthRegistryAuthFile(t *testing.T) {
	home := isolate(t)
	a := newAuthWorld(t)
	file := filepath.Join(t.TempDir(), "auth.json")
	writeJSON(t, file, perRepoAuths())
	t.Setenv("REGISTRY_AUTH_FILE", file)
	// REGISTRY_AUTH_FILE replaces the search: wrong credentials elsewhere are not read.
	writeJSON(t, filepath.Join(home, ".docker", "config.json"), map[string]any{"auths": map[string]any{
		"basic.example.com/team/app": authEntry("user", "wrong")}})
	path, dropIn := emptyConf(t)
	c := a.client(t, path, dropIn)
	for _, ref := range authRefs {
		check(t, c, ref)
	}
	// One ping per registry and repository resolution; one token per repository.
	if n := a.tokens.requests(); n != 2 {
		t.Errorf("%d token requests, want 2 (one per repository)", n)
	}
	if n := a.bearer.count("ping"); n != 2 {
		t.Errorf("%d pings of the bearer registry, want 2", n)
	}
	for _, r := range a.bearer.requests() {
		if k := requestKind(r); k != "ping" && !strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
			t.Errorf("%s %s without a bearer token", r.Method, r.URL.Path)
		}
	}
}

func TestAuthDefaultSearch(t *testing.T) {
	home := isolate(t)
	a := newAuthWorld(t)
	// The first file with an entry wins: $XDG_RUNTIME_DIR/containers/auth.json before
	// ~/.docker/config.json.
	writeJSON(t, filepath.Join(os.Getenv("XDG_RUNTIME_DIR"), "containers", "auth.json"), perRepoAuths())
	writeJSON(t, filepath.Join(home, ".docker", "config.json"), map[string]any{"auths": map[string]any{
		"basic.example.com": authEntry("user", "wrong"), "bearer.example.com": authEntry("user", "wrong")}})
	path, dropIn := emptyConf(t)
	c := a.client(t, path, dropIn)
	for _, ref := range authRefs {
		check(t, c, ref)
	}

	// A Docker config with URL keys, as docker login writes them.
	isolate(t)
	writeJSON(t, filepath.Join(os.Getenv("HOME"), ".docker", "config.json"), map[string]any{"auths": map[string]any{
		"https://basic.example.com/v1/": authEntry("user", regPass)}})
	c = a.client(t, path, dropIn)
	check(t, c, "basic.example.com/other/app:v1")
}

func TestAuthExtraFile(t *testing.T) {
	isolate(t)
	a := newAuthWorld(t)
	dir := t.TempDir()
	kubelet := filepath.Join(dir, "kubelet", "config.json")
	writeJSON(t, kubelet, map[string]any{"auths": map[string]any{
		"https://basic.example.com":   authEntry("user", regPass),
		"bearer.example.com/team/app": authEntry("user", appPass),
	}})
	path, dropIn := emptyConf(t)
	c := a.client(t, path, dropIn, Config{AuthFiles: []string{filepath.Join(dir, "missing.json"), kubelet}})
	check(t, c, "basic.example.com/other/app:v1")
	check(t, c, "bearer.example.com/team/app:v1")

	// The containers files come first.
	writeJSON(t, filepath.Join(os.Getenv("XDG_CONFIG_HOME"), "containers", "auth.json"), map[string]any{"auths": map[string]any{
		"basic.example.com": authEntry("user", "wrong")}})
	c = a.client(t, path, dropIn, Config{AuthFiles: []string{kubelet}})
	if _, err := c.Resolve(t.Context(), "basic.example.com/other/app:v1"); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("err = %v, want ErrUnauthorized: auth.json is asked before the extra file", err)
	}
}

// installHelper puts docker-credential-test on PATH. It answers get for the servers in creds
// (server -> username and secret) and logs the servers it is asked for into the returned file.
func installHelper(t *testing.T, creds map[string][2]string) string {
	t.Helper()
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	var cases strings.Builder
	for server, c := range creds {
		fmt.Fprintf(&cases, "  %q) printf '%%s' '{\"ServerURL\":\"%s\",\"Username\":\"%s\",\"Secret\":\"%s\"}' ;;\n", server, server, c[0], c[1])
	}
	script := fmt.Sprintf(`#!/bin/sh
[ "$1" = get ] || exit 1
read -r server
printf '%%s\n' "$server" >> %q
case "$server" in
%s  *) echo "credentials not found in native keychain"; exit 1 ;;
esac
`, calls, cases.String())
	if err := os.WriteFile(filepath.Join(dir, "docker-credential-test"), []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return calls
}

func helperCalls(t *testing.T, calls string) []string {
	raw, err := os.ReadFile(calls)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(raw))
}

func TestAuthCredHelpers(t *testing.T) {
	home := isolate(t)
	a := newAuthWorld(t)
	calls := installHelper(t, map[string][2]string{"basic.example.com": {"user", regPass}})
	writeJSON(t, filepath.Join(home, ".docker", "config.json"), map[string]any{
		"credHelpers": map[string]string{"basic.example.com": "test"}})
	path, dropIn := emptyConf(t)
	c := a.client(t, path, dropIn)
	check(t, c, "basic.example.com/other/app:v1")
	if got := helperCalls(t, calls); len(got) != 1 || got[0] != "basic.example.com" {
		t.Errorf("helper asked for %v, want [basic.example.com]", got)
	}
}

func TestAuthRegistriesConfCredentialHelpers(t *testing.T) {
	isolate(t)
	a := newAuthWorld(t)
	calls := installHelper(t, map[string][2]string{"basic.example.com": {"user", regPass}})
	path, dropIn := writeConf(t, `credential-helpers = ["test"]`+"\n")
	c := a.client(t, path, dropIn)
	check(t, c, "basic.example.com/other/app:v1")
	if got := helperCalls(t, calls); len(got) == 0 {
		t.Error("registries.conf's credential helper was not asked")
	}
}

func TestAuthCredsStore(t *testing.T) {
	home := isolate(t)
	a := newAuthWorld(t)
	a.tokens.refresh = "Refresh-Token-S3cret"
	calls := installHelper(t, map[string][2]string{
		"basic.example.com":  {"user", regPass},
		"bearer.example.com": {"<token>", a.tokens.refresh}, // an identity token
	})
	// What docker login leaves with a credsStore: empty entries, the secrets in the store.
	writeJSON(t, filepath.Join(home, ".docker", "config.json"), map[string]any{
		"auths":      map[string]any{"basic.example.com": map[string]string{}, "bearer.example.com": map[string]string{}},
		"credsStore": "test",
	})
	path, dropIn := emptyConf(t)
	c := a.client(t, path, dropIn)
	check(t, c, "basic.example.com/other/app:v1")
	check(t, c, "bearer.example.com/other/app:v1")
	if got := helperCalls(t, calls); len(got) != 2 {
		t.Errorf("credsStore asked for %v, want both registries once", got)
	}

	// Docker Hub is stored under its v1 URL.
	kc := c.Keychain()
	if _, err := kc.Resolve(name.MustParseReference("docker.io/library/busybox:1").Context()); err != nil {
		t.Fatal(err)
	}
	if got := helperCalls(t, calls); got[len(got)-1] != "https://index.docker.io/v1/" {
		t.Errorf("Docker Hub asked as %q, want https://index.docker.io/v1/", got[len(got)-1])
	}
}

// TestAuthMemoryKeychain: pushed credentials serve exactly their repository, before the files'
// entries for it; they expire.
func TestAuthMemoryKeychain(t *testing.T) {
	isolate(t)
	a := newAuthWorld(t)
	file := filepath.Join(t.TempDir(), "auth.json")
	writeJSON(t, file, map[string]any{"auths": map[string]any{
		"basic.example.com/team/app": authEntry("user", "wrong")}})
	t.Setenv("REGISTRY_AUTH_FILE", file)
	now := time.Unix(1000, 0)
	mem := NewMemoryKeychain()
	mem.now = func() time.Time { return now }
	mem.Set("basic.example.com/team/app:v1", Credentials{Username: "user", Password: appPass}, time.Minute)
	path, dropIn := emptyConf(t)
	c := a.client(t, path, dropIn, Config{Keychain: mem})
	c.res.tagTTL = 0 // every resolution authenticates anew
	check(t, c, "basic.example.com/team/app:v1")

	// The entry expires: the file's applies (the wrong password).
	now = now.Add(2 * time.Minute)
	if _, err := c.Resolve(t.Context(), "basic.example.com/team/app:v1"); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("after expiry: %v, want ErrUnauthorized", err)
	}
	if _, ok := mem.entries["basic.example.com/team/app"]; ok {
		t.Error("the expired entry was not dropped")
	}
}

// TestAuthPushedCredentialsDoNotSpill: credentials pushed for one repository serve neither the
// repositories under it nor the others of its registry, and a pushed registry entry never
// beats a file's entry for the repository.
func TestAuthPushedCredentialsDoNotSpill(t *testing.T) {
	isolate(t)
	a := newAuthWorld(t)
	img := testImage(t, 1)
	a.basic.push(t, "team/app/sub:v1", img)
	mem := NewMemoryKeychain()
	path, dropIn := emptyConf(t)
	c := a.client(t, path, dropIn, Config{Keychain: mem})

	// Pushed for basic.example.com/team (a reference "basic.example.com/team:other"), with the
	// registry's password: not for team/app nor team/app/sub.
	mem.Set("basic.example.com/team:other", Credentials{Username: "user", Password: appPass}, 0)
	mem.Set("basic.example.com/other/app:v1", Credentials{Username: "user", Password: regPass}, 0)
	for _, ref := range []string{"basic.example.com/team/app:v1", "basic.example.com/team/app/sub:v1"} {
		if _, err := c.Resolve(t.Context(), ref); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("%s: %v, want ErrUnauthorized (credentials pushed for another repository were used)", ref, err)
		}
	}
	check(t, c, "basic.example.com/other/app:v1")

	// A pushed registry entry does not beat the file's repository entry.
	writeJSON(t, filepath.Join(os.Getenv("XDG_CONFIG_HOME"), "containers", "auth.json"), map[string]any{"auths": map[string]any{
		"bearer.example.com/team/app": authEntry("user", appPass)}})
	mem.Set("bearer.example.com", Credentials{Username: "user", Password: regPass}, 0)
	check(t, c, "bearer.example.com/team/app:v1")
}

// TestAuthMostSpecificAcrossFiles: a later file's entry for the repository beats an earlier
// file's entry for the registry or a namespace; equally specific entries go by file order.
func TestAuthMostSpecificAcrossFiles(t *testing.T) {
	home := isolate(t)
	a := newAuthWorld(t)
	writeJSON(t, filepath.Join(os.Getenv("XDG_RUNTIME_DIR"), "containers", "auth.json"), map[string]any{"auths": map[string]any{
		"basic.example.com":       authEntry("user", "wrong"),
		"bearer.example.com/team": authEntry("user", "wrong"),
	}})
	writeJSON(t, filepath.Join(home, ".docker", "config.json"), map[string]any{"auths": map[string]any{
		"basic.example.com/team/app": authEntry("user", appPass),
		"https://bearer.example.com": authEntry("user", "wrong"),
	}})
	kubelet := filepath.Join(t.TempDir(), "config.json")
	writeJSON(t, kubelet, map[string]any{"auths": map[string]any{
		"bearer.example.com/team/app": authEntry("user", appPass),
		"basic.example.com":           authEntry("user", regPass),
	}})
	path, dropIn := emptyConf(t)
	c := a.client(t, path, dropIn, Config{AuthFiles: []string{kubelet}})
	check(t, c, "basic.example.com/team/app:v1")  // docker config's repository entry
	check(t, c, "bearer.example.com/team/app:v1") // the extra file's repository entry
	// Both registry entries are equally specific: the runtime auth.json comes first.
	if _, err := c.Resolve(t.Context(), "basic.example.com/other/app:v1"); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("other/app: %v, want ErrUnauthorized (the first file's registry entry)", err)
	}
}

func TestMemoryKeychainLookup(t *testing.T) {
	now := time.Unix(0, 0)
	m := NewMemoryKeychain()
	m.now = func() time.Time { return now }
	m.Set("quay.io", Credentials{Username: "registry"}, 0)
	m.Set("quay.io/team", Credentials{Username: "namespace"}, 0)
	m.Set("quay.io/team/app", Credentials{Username: "repository"}, time.Second)
	m.Set("index.docker.io/library/busybox/", Credentials{Username: "hub"}, 0)
	for _, tc := range []struct{ key, want string }{
		{"quay.io/team/app", "repository"},
		{"quay.io/team/app/sub", ""},
		{"quay.io/team/other", ""},
		{"quay.io/other/app", ""},
		{"docker.io/library/busybox", "hub"},
		{"registry-1.docker.io/library/busybox", "hub"},
		{"docker.io/library/alpine", ""},
		{"quay.io.evil.com/team/app", ""},
	} {
		c, ok := m.Lookup(tc.key)
		if c.Username != tc.want || ok != (tc.want != "") {
			t.Errorf("Lookup(%q) = %q, %v; want %q", tc.key, c.Username, ok, tc.want)
		}
	}
	now = now.Add(time.Second)
	if c, ok := m.Lookup("quay.io/team/app"); ok {
		t.Errorf("after expiry: %q, want none", c.Username)
	}
	a, err := m.Resolve(name.MustParseReference("index.docker.io/library/busybox:1").Context())
	if err != nil {
		t.Fatal(err)
	}
	if cfg, _ := a.Authorization(); cfg.Username != "hub" {
		t.Errorf("Resolve for Docker Hub = %q, want hub", cfg.Username)
	}
	if a, _ := m.Resolve(name.MustParseReference("ghcr.io/x/y:1").Context()); a != authn.Anonymous {
		t.Error("Resolve without an entry is not anonymous")
	}
}

func TestNormalizeKey(t *testing.T) {
	const dgst = "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct{ key, want string }{
		{"quay.io", "quay.io"},
		{"quay.io/team/app", "quay.io/team/app"},
		{"quay.io/team/app/", "quay.io/team/app"},
		{"127.0.0.1:5000", "127.0.0.1:5000"},
		{"127.0.0.1:5000/", "127.0.0.1:5000"},
		{"[::1]:5000", "[::1]:5000"},
		{"127.0.0.1:5000/private", "127.0.0.1:5000/private"},
		{"127.0.0.1:5000/private:tag", "127.0.0.1:5000/private"},
		{"[::1]:5000/private:tag", "[::1]:5000/private"},
		{"reg/a/b" + dgst, "reg/a/b"},
		{"reg:5000/x:1.0" + dgst, "reg:5000/x"},
		{"reg:5000/team/x:1.0", "reg:5000/team/x"},
		{"docker.io/library/alpine:latest", "docker.io/library/alpine"},
		{"index.docker.io/library/alpine" + dgst, "docker.io/library/alpine"},
		{"registry-1.docker.io/team/app:v1" + dgst, "docker.io/team/app"},
		{"registry-1.docker.io:443/team/app", "registry-1.docker.io:443/team/app"},
	} {
		if got := normalizeKey(tc.key); got != tc.want {
			t.Errorf("normalizeKey(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
}

// TestMemoryKeychainReferenceKeys sets credentials under the whole references c/image hands
// the auth helper and finds them by repository, as the registry client looks them up.
func TestMemoryKeychainReferenceKeys(t *testing.T) {
	const dgst = "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	m := NewMemoryKeychain()
	for key, user := range map[string]string{
		"127.0.0.1:5000/private:tag":                  "private",
		"reg/a/b" + dgst:                              "ab",
		"reg:5000/x:1.0" + dgst:                       "x",
		"docker.io/library/alpine:latest":             "alpine",
		"index.docker.io/team/app:v1" + dgst:          "team-app",
		"registry-1.docker.io/library/redis:7-alpine": "redis",
	} {
		m.Set(key, Credentials{Username: user, Password: "p"}, 0)
	}
	for _, tc := range []struct{ key, want string }{
		{"127.0.0.1:5000/private", "private"},
		{"127.0.0.1:5000/private:other", "private"},
		{"127.0.0.1:5000/other", ""},
		{"127.0.0.1:5000", ""},
		{"reg/a/b", "ab"},
		{"reg/a/b/c", ""},
		{"reg/a", ""},
		{"reg:5000/x", "x"},
		{"reg/x", ""},
		{"docker.io/library/alpine", "alpine"},
		{"index.docker.io/library/alpine", "alpine"},
		{"docker.io/team/app", "team-app"},
		{"docker.io/library/redis", "redis"},
		{"docker.io/library/busybox", ""},
	} {
		c, ok := m.Lookup(tc.key)
		if c.Username != tc.want || ok != (tc.want != "") {
			t.Errorf("Lookup(%q) = %q, %v; want %q", tc.key, c.Username, ok, tc.want)
		}
	}
	a, err := m.Resolve(name.MustParseReference("127.0.0.1:5000/private:other").Context())
	if err != nil {
		t.Fatal(err)
	}
	if cfg, _ := a.Authorization(); cfg.Username != "private" {
		t.Errorf("Resolve for 127.0.0.1:5000/private = %q, want private", cfg.Username)
	}
	// Empty credentials under a reference remove the repository's entry.
	m.Set("127.0.0.1:5000/private:newer", Credentials{}, 0)
	if c, ok := m.Lookup("127.0.0.1:5000/private"); ok {
		t.Errorf("after removal: %q", c.Username)
	}
}

func TestCredentialsHideSecrets(t *testing.T) {
	c := Credentials{Username: "user", Password: regPass, IdentityToken: "Identity-S3cret"}
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("x", "creds", c)
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%v %+v %#v %s", c, c, c, c), logs.String()} {
		if strings.Contains(s, regPass) || strings.Contains(s, "Identity-S3cret") || !strings.Contains(s, "user") {
			t.Errorf("printed credentials: %s", s)
		}
	}
}

// TestAuthWrongCredentials fails with wrong passwords on both kinds of registry, quickly, and
// checks that the password is in no error and no log line.
func TestAuthWrongCredentials(t *testing.T) {
	isolate(t)
	a := newAuthWorld(t)
	const wrong = "Wr0ng-Pa55word-that-must-not-leak"
	file := filepath.Join(t.TempDir(), "auth.json")
	writeJSON(t, file, map[string]any{"auths": map[string]any{
		"basic.example.com": authEntry("user", wrong), "bearer.example.com": authEntry("user", wrong)}})
	t.Setenv("REGISTRY_AUTH_FILE", file)
	var logs bytes.Buffer
	var logrusOut bytes.Buffer
	logrus.SetOutput(&logrusOut)
	level := logrus.GetLevel()
	logrus.SetLevel(logrus.DebugLevel)
	t.Cleanup(func() { logrus.SetOutput(os.Stderr); logrus.SetLevel(level) })
	mem := NewMemoryKeychain()
	mem.Set("bearer.example.com/other", Credentials{Username: "user", Password: wrong}, 0)

	path, dropIn := emptyConf(t)
	c := a.client(t, path, dropIn, Config{Keychain: mem,
		Logger:           slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		manifestAttempts: 3})
	var errs []string
	for _, ref := range authRefs {
		start := time.Now()
		_, err := c.Resolve(t.Context(), ref)
		if !errors.Is(err, ErrUnauthorized) {
			t.Errorf("%s: %v, want ErrUnauthorized", ref, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s: failing took %v", ref, d)
		}
		if err != nil {
			errs = append(errs, err.Error())
		}
	}
	if n := a.basic.count(""); n > 4 {
		t.Errorf("basic registry: %d requests for 2 refused resolutions, want no retries", n)
	}

	// A Blob whose fallback source refuses the credentials: the error is typed, not retried.
	p2p := a.registry("p2p.example.com", tlsTrusted)
	img := testImage(t, 1)
	p2p.push(t, "other/app:v1", img)
	a.basic.push(t, "other/app:v1", img)
	p2p.setFault(statusForPath(layerDigest(t, img, 0), http.StatusNotFound))
	path, dropIn = writeConf(t, "[[registry]]\nlocation = \"basic.example.com\"\n[[registry.mirror]]\nlocation = \"p2p.example.com\"\n")
	c = a.client(t, path, dropIn, Config{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	got, err := c.Resolve(t.Context(), "basic.example.com/other/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Blob(t.Context(), got, &got.Layers[0])
	if err != nil {
		t.Fatal(err)
	}
	before := a.basic.count("")
	_, err = b.ReadAt(t.Context(), make([]byte, 4), 0)
	var fe *Error
	if !errors.As(err, &fe) || !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "unauthorized") {
		t.Errorf("blob: %v, want the mirror's ErrNotFound quoting the registry's refusal", err)
	}
	if n := a.basic.count("") - before; n > 2 {
		t.Errorf("the registry got %d requests for a refused blob, want no retries", n)
	}
	errs = append(errs, err.Error())

	all := strings.Join(errs, "\n") + logs.String() + logrusOut.String()
	for _, secret := range []string{
		wrong,
		base64.StdEncoding.EncodeToString([]byte(wrong)),
		base64.StdEncoding.EncodeToString([]byte("user:" + wrong)),
		regPass, appPass,
	} {
		if strings.Contains(all, secret) {
			t.Errorf("secret %q found in errors or logs:\n%s", secret, all)
		}
	}
	if !strings.Contains(logs.String(), "using credentials") {
		t.Error("the logs do not say which credentials were used: the check above proves nothing")
	}
}

func TestAuthDockerHubKeys(t *testing.T) {
	isolate(t)
	file := filepath.Join(t.TempDir(), "auth.json")
	writeJSON(t, file, map[string]any{"auths": map[string]any{
		"docker.io":               authEntry("hub", "x"),
		"docker.io/library/redis": authEntry("redis", "x"),
	}})
	t.Setenv("REGISTRY_AUTH_FILE", file)
	path, dropIn := emptyConf(t)
	c, err := NewClient(Config{RegistriesConf: path, RegistriesConfDir: dropIn})
	if err != nil {
		t.Fatal(err)
	}
	for ref, want := range map[string]string{
		"docker.io/library/busybox:1":       "hub",
		"index.docker.io/library/redis:7":   "redis",
		"registry-1.docker.io/team/thing:1": "hub",
		"quay.io/team/thing:1":              "",
	} {
		r, err := name.ParseReference(ref)
		if err != nil {
			t.Fatal(err)
		}
		a, err := c.Keychain().Resolve(r.Context())
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := a.Authorization()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Username != want {
			t.Errorf("%s: username %q, want %q", ref, cfg.Username, want)
		}
	}
}

// A system service has no $HOME: the credentials of its user are still found, in the home
// directory of the password database, as containers/image finds them.
func TestHomeDirWithoutHOME(t *testing.T) {
	u, err := user.Current()
	if err != nil || u.HomeDir == "" {
		t.Skipf("no password entry: %v", err)
	}
	t.Setenv("HOME", "/elsewhere")
	if got := HomeDir(); got != "/elsewhere" {
		t.Errorf("HomeDir() = %q with $HOME set, want /elsewhere", got)
	}
	os.Unsetenv("HOME")
	if got := HomeDir(); got != u.HomeDir {
		t.Errorf("HomeDir() = %q without $HOME, want %q from the password database", got, u.HomeDir)
	}
}
