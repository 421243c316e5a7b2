package fetcher

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
)

// Credentials are what a registry is logged in to with: a username and password, or an
// identity token (an OAuth2 refresh token, which docker-credential helpers hand out with the
// username "<token>"). Their String, GoString and LogValue hide the secrets, so printing or
// logging them by mistake leaks nothing.
type Credentials struct {
	Username      string
	Password      string
	IdentityToken string
}

func (c Credentials) String() string {
	return fmt.Sprintf("{Username:%s Password:%s IdentityToken:%s}", c.Username, hidden(c.Password), hidden(c.IdentityToken))
}

// GoString hides the secrets from %#v.
func (c Credentials) GoString() string { return "fetcher.Credentials" + c.String() }

// LogValue hides the secrets from log/slog.
func (c Credentials) LogValue() slog.Value {
	return slog.GroupValue(slog.String("username", c.Username),
		slog.String("password", hidden(c.Password)), slog.String("identity_token", hidden(c.IdentityToken)))
}

func hidden(s string) string {
	if s == "" {
		return ""
	}
	return "REDACTED"
}

func (c Credentials) authenticator() authn.Authenticator {
	return authn.FromConfig(authn.AuthConfig{Username: c.Username, Password: c.Password, IdentityToken: c.IdentityToken})
}

// MemoryKeychain holds credentials handed to the daemon at run time (by the auth helper that
// registries.conf's additional-layer-store-auth-helper runs), each for a while. It is an
// authn.Keychain on its own, and the first place a [Client] looks. It is safe for concurrent use.
type MemoryKeychain struct {
	now func() time.Time // when credentials expire; tests set it

	mu      sync.Mutex
	entries map[string]memEntry // guarded by mu; keyed by normalized key
}

type memEntry struct {
	c       Credentials
	expires time.Time // zero: never
}

var _ authn.Keychain = (*MemoryKeychain)(nil)

// NewMemoryKeychain returns an empty keychain.
func NewMemoryKeychain() *MemoryKeychain {
	return &MemoryKeychain{now: time.Now, entries: map[string]memEntry{}}
}

// Set keeps c for key for ttl (zero or less: until replaced). key is a repository
// ("quay.io/team/app") or a whole reference such as c/image hands the auth helper
// ("quay.io/team/app:v1", "localhost:5000/app@sha256:..."), whose tag and digest are ignored;
// "docker.io", "index.docker.io" and "registry-1.docker.io" name the same registry. The
// credentials apply to exactly that repository: not to the repositories under it, nor to the
// others of its namespace or registry (they were handed over for one image). Setting empty
// credentials removes the key.
func (m *MemoryKeychain) Set(key string, c Credentials, ttl time.Duration) {
	key = normalizeKey(key)
	m.mu.Lock()
	defer m.mu.Unlock()
	if c == (Credentials{}) {
		delete(m.entries, key)
		return
	}
	e := memEntry{c: c}
	if ttl > 0 {
		e.expires = m.now().Add(ttl)
	}
	m.entries[key] = e
}

// Lookup returns the credentials set for exactly the repository key names. Expired
// credentials are ignored, and dropped.
func (m *MemoryKeychain) Lookup(key string) (Credentials, bool) {
	return m.lookup(normalizeKey(key))
}

// lookup is Lookup of a normalized key.
func (m *MemoryKeychain) lookup(key string) (Credentials, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[key]
	if !ok {
		return Credentials{}, false
	}
	if !e.expires.IsZero() && !m.now().Before(e.expires) {
		delete(m.entries, key)
		return Credentials{}, false
	}
	return e.c, true
}

// Resolve implements authn.Keychain: the credentials for the resource's repository, or
// anonymous access.
func (m *MemoryKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	if c, ok := m.lookup(resourceKey(r)); ok {
		return c.authenticator(), nil
	}
	return authn.Anonymous, nil
}

// keyLevels returns key and its parents, most specific first: "r/a/b", "r/a", "r".
func keyLevels(key string) []string {
	levels := []string{key}
	for {
		i := strings.LastIndexByte(key, '/')
		if i < 0 {
			return levels
		}
		key = key[:i]
		levels = append(levels, key)
	}
}

// normalizeKey turns key into the form entries are kept under: a registry, namespace or
// repository. c/image hands the auth helper whole references, so a "@digest" suffix and the
// ":tag" of the last path component are dropped ("quay.io/team/app:v1@sha256:..." is
// "quay.io/team/app"); a registry's ":port" stays ("localhost:5000" is a registry alone).
// Docker Hub's registry is written "docker.io", the name containers-auth.json uses, and
// trailing slashes are dropped.
func normalizeKey(key string) string {
	key, _, _ = strings.Cut(key, "@")
	key = strings.TrimRight(key, "/")
	if slash := strings.LastIndexByte(key, '/'); slash >= 0 {
		if colon := strings.IndexByte(key[slash:], ':'); colon >= 0 {
			key = strings.TrimRight(key[:slash+colon], "/")
		}
	}
	host, rest, _ := strings.Cut(key, "/")
	if isDockerHub(host) {
		host = "docker.io"
	}
	if rest == "" {
		return host
	}
	return host + "/" + rest
}

func isDockerHub(host string) bool {
	switch host {
	case "docker.io", "index.docker.io", "registry-1.docker.io":
		return true
	}
	return false
}

// resourceKey is the containers-auth.json key of a go-containerregistry resource: "registry"
// or "registry/repository".
func resourceKey(r authn.Resource) string {
	reg := r.RegistryStr()
	return normalizeKey(reg + strings.TrimPrefix(r.String(), reg))
}
