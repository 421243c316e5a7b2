package fetcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	helperclient "github.com/docker/docker-credential-helpers/client"
	"github.com/docker/docker-credential-helpers/credentials"
	"github.com/google/go-containerregistry/pkg/authn"
	"go.podman.io/image/v5/pkg/docker/config"
	"go.podman.io/image/v5/types"
)

// keychain finds credentials for a repository the way the containers tools do, except that
// across all its sources the most specific entry wins. Its sources, in order:
//
//  1. the MemoryKeychain (credentials from the auth helper), for exactly the repository;
//  2. the auth files containers/image reads (containers-auth.json(5)), each on its own: the
//     file REGISTRY_AUTH_FILE names if set, else ${XDG_RUNTIME_DIR}/containers/auth.json (or
//     /run/containers/$UID/auth.json), ${XDG_CONFIG_HOME:-~/.config}/containers/auth.json and
//     ${DOCKER_CONFIG:-~/.docker}/config.json, with their "credHelpers" (which answer for a
//     whole registry) and registries.conf's credential-helpers;
//  3. each extra file (Config.AuthFiles), the same way;
//  4. when none of those has an entry: containers/image's whole search (which adds the legacy
//     ~/.dockercfg), then the "credsStore" of the Docker config files among those
//     (containers/image ignores it): docker-credential-<credsStore> get, with the registry's
//     host as the server URL ("https://index.docker.io/v1/" for Docker Hub, as docker login
//     stores it). Both count as registry entries.
//
// An entry for the repository beats one for a namespace, which beats one for the registry,
// whichever source holds it; between entries equally specific, the source first in the list
// wins. A file's "credHelpers" entry for the registry is a registry entry.
//
// Nothing found means anonymous access. Secrets are never logged nor put in errors.
type keychain struct {
	mem   *MemoryKeychain      // may be nil
	sys   *types.SystemContext // registries.conf paths, and the auth file REGISTRY_AUTH_FILE names
	extra []string             // extra auth files, in order
	log   *slog.Logger
}

var _ authn.Keychain = (*keychain)(nil)

func (k *keychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	key := resourceKey(r)
	c, from, err := k.lookup(key)
	if err != nil {
		return nil, err
	}
	if c == (Credentials{}) {
		k.log.Debug("no credentials; accessing the registry anonymously", "for", key)
		return authn.Anonymous, nil
	}
	k.log.Debug("using credentials", "for", key, "from", from, "username", c.Username)
	return c.authenticator(), nil
}

// lookup returns the credentials for key, and where they came from (for logs).
func (k *keychain) lookup(key string) (Credentials, string, error) {
	if k.mem != nil {
		if c, ok := k.mem.lookup(key); ok {
			return c, "memory keychain entry " + key, nil
		}
	}
	levels := keyLevels(key)
	best, bestLevel, bestFrom := Credentials{}, len(levels), ""
	for _, p := range k.authFiles() {
		sys := *k.sys
		sys.AuthFilePath = p
		c, level, err := fileEntry(&sys, levels)
		if err != nil {
			return Credentials{}, "", fmt.Errorf("fetcher: looking up credentials for %s in %s: %w", key, p, err)
		}
		if level < bestLevel {
			best, bestLevel, bestFrom = c, level, fmt.Sprintf("auth file %s, entry %s", p, levels[level])
		}
	}
	if bestLevel < len(levels) {
		return best, bestFrom, nil
	}
	c, err := fileCredentials(k.sys, key)
	if err != nil {
		return Credentials{}, "", fmt.Errorf("fetcher: looking up credentials for %s: %w", key, err)
	}
	if c != (Credentials{}) {
		return c, "containers auth files", nil
	}
	return k.credsStore(key)
}

// authFiles lists the auth files asked one by one: those containers/image reads (but the legacy
// ~/.dockercfg), then the extra files.
func (k *keychain) authFiles() []string {
	var files []string
	if k.sys.AuthFilePath != "" {
		files = append(files, k.sys.AuthFilePath)
	} else {
		if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
			files = append(files, filepath.Join(d, "containers", "auth.json"))
		} else {
			files = append(files, filepath.Join("/run/containers", strconv.Itoa(os.Getuid()), "auth.json"))
		}
		home := HomeDir()
		cfg := os.Getenv("XDG_CONFIG_HOME")
		if cfg == "" && home != "" {
			cfg = filepath.Join(home, ".config")
		}
		if cfg != "" {
			files = append(files, filepath.Join(cfg, "containers", "auth.json"))
		}
		if d := os.Getenv("DOCKER_CONFIG"); d != "" {
			files = append(files, filepath.Join(d, "config.json"))
		} else if home != "" {
			files = append(files, filepath.Join(home, ".docker", "config.json"))
		}
	}
	return append(files, k.extra...)
}

// fileEntry returns the credentials of the auth file sys.AuthFilePath for levels[0] (a
// repository, then its parents: see keyLevels) with the index in levels of the key of the
// file's most specific entry for it: its own key for an "auths" entry, the registry's for a
// "credHelpers" entry (containers/image asks those first). len(levels) when the file has
// none or does not exist. The file's keys are read here; the credentials come from
// containers/image, asked for that key.
func fileEntry(sys *types.SystemContext, levels []string) (Credentials, int, error) {
	raw, err := os.ReadFile(sys.AuthFilePath)
	if errors.Is(err, os.ErrNotExist) {
		return Credentials{}, len(levels), nil
	}
	var f struct {
		Auths       map[string]json.RawMessage `json:"auths"`
		CredHelpers map[string]string          `json:"credHelpers"`
	}
	if err == nil {
		err = json.Unmarshal(raw, &f)
	}
	if err != nil { // containers/image words the error
		_, err := fileCredentials(sys, levels[0])
		return Credentials{}, len(levels), err
	}
	host := len(levels) - 1
	level := len(levels)
	if _, ok := f.CredHelpers[levels[host]]; ok {
		level = host
	} else {
		for i, k := range levels[:host] {
			if _, ok := f.Auths[k]; ok {
				level = i
				break
			}
		}
		if level == len(levels) {
			for k := range f.Auths {
				if authFileRegistry(k) == authFileRegistry(levels[host]) {
					level = host
					break
				}
			}
		}
	}
	if level == len(levels) {
		return Credentials{}, level, nil
	}
	c, err := fileCredentials(sys, levels[level])
	if err != nil || c == (Credentials{}) {
		return Credentials{}, len(levels), err
	}
	return c, level, nil
}

// authFileRegistry is the registry an auth file key names when it names one, as
// containers/image reads it: "https://index.docker.io/v1/" is "index.docker.io", and so are
// "docker.io" and "registry-1.docker.io".
func authFileRegistry(key string) string {
	stripped := strings.TrimPrefix(strings.TrimPrefix(key, "http://"), "https://")
	if stripped != key {
		stripped, _, _ = strings.Cut(stripped, "/")
	}
	switch stripped {
	case "registry-1.docker.io", "docker.io":
		return "index.docker.io"
	}
	return stripped
}

// fileCredentials asks containers/image.
func fileCredentials(sys *types.SystemContext, key string) (Credentials, error) {
	ac, err := config.GetCredentials(sys, key)
	if err != nil {
		return Credentials{}, err
	}
	return Credentials{Username: ac.Username, Password: ac.Password, IdentityToken: ac.IdentityToken}, nil
}

// credsStore asks the credsStore helpers of the Docker config files, in the order the files are
// searched. A helper that fails is logged and passed over.
func (k *keychain) credsStore(key string) (Credentials, string, error) {
	host, _, _ := strings.Cut(key, "/")
	server := host
	if isDockerHub(host) {
		server = "https://index.docker.io/v1/"
	}
	asked := map[string]bool{}
	for _, p := range k.authFiles() {
		store := readCredsStore(p)
		if store == "" || asked[store] {
			continue
		}
		asked[store] = true
		helper := "docker-credential-" + store
		if _, err := exec.LookPath(helper); err != nil {
			k.log.Debug("credsStore helper not installed", "helper", helper, "file", p)
			continue
		}
		cr, err := helperclient.Get(helperclient.NewShellProgramFunc(helper), server)
		switch {
		case err == nil:
			c := Credentials{Username: cr.Username, Password: cr.Secret}
			if cr.Username == "<token>" {
				c = Credentials{IdentityToken: cr.Secret}
			}
			return c, fmt.Sprintf("credsStore %s of %s", helper, p), nil
		case credentials.IsErrCredentialsNotFound(err):
			k.log.Debug("credsStore has no credentials", "helper", helper, "server", server)
		default:
			k.log.Warn("credsStore helper failed", "helper", helper, "server", server, "err", err)
		}
	}
	return Credentials{}, "", nil
}

// readCredsStore returns the "credsStore" of a Docker config file, or "" when the file does not
// exist, cannot be parsed (containers/image reports that) or has none.
func readCredsStore(path string) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var f struct {
		CredsStore string `json:"credsStore"`
	}
	if json.Unmarshal(raw, &f) != nil {
		return ""
	}
	return f.CredsStore
}

// HomeDir is the home directory whose files containers/image reads: $HOME, else the user's
// entry in the password database, as c/storage's homedir does. A system service has no $HOME
// (systemd sets it only for units with User=), and the credentials of root are still in
// /root. "" when neither says.
func HomeDir() string {
	if h := os.Getenv("HOME"); h != "" {
		return h
	}
	if u, err := user.LookupId(strconv.Itoa(os.Getuid())); err == nil {
		return u.HomeDir
	}
	return ""
}
