// Package fetcher owns talking to registries.
//
// A [Client] is what the daemon uses, configured by a [Config] whose zero value is the
// defaults. It reads an image the way podman or CRI-O would for the same reference, through
// registries.conf's mirrors and rewrites and with the credentials they would use, in three
// calls:
//
//   - [Client.Resolve] turns a reference (tag, digest, or repo:tag@digest, where the digest
//     wins) into an [Image]: the manifest for the host platform (picked from an image index by
//     OS, architecture and variant), its layer descriptors with their annotations, and the
//     config's DiffIDs. Resolutions by tag are reused for the tag TTL (Config.TagTTL, default 5
//     minutes), resolutions by digest until they are the least recently used of more than
//     [MaxResolutions] (expired ones are dropped whenever one is kept); failures are never
//     remembered; concurrent resolutions of one reference share their requests. OCI and Docker
//     schema2 media types are both read.
//   - [Client.Platforms] fetches the index's other platforms' manifests.
//   - [Client.Blob] returns a [Blob] reading one layer with range requests.
//
// A [Resolver] does the first two alone, for a transport that already authenticates, and reads
// every reference from its own registry.
//
// # registries.conf
//
// The Client reads registries.conf (v2) and its drop-ins with containers/image's
// sysregistriesv2, from the paths Config.RegistriesConf and RegistriesConfDir give or, by
// default, where podman reads them. containers/image keeps parsed files in a process-wide cache
// keyed by their paths: a Client re-reads its files when it is made (so Clients on different
// files, tests among them, each see their own as they are), and [Client.Reload] re-reads them
// and forgets every resolution (an invalid file leaves the previous configuration in force);
// the daemon calls it on SIGHUP. Short names are not resolved: references come fully
// qualified from the runtime.
//
// For each reference, the entry with the longest matching prefix ("*.example.com" wildcards
// included) gives the sources, in order: its mirrors that pull-from-mirror (all, digest-only,
// tag-only) and mirror-by-digest-only allow for a pull by tag or by digest, then its location,
// each with the reference rewritten as containers/image does. A reference without an entry is
// read from its own registry. Each source is checked as containers/image does: one whose own
// entry is blocked is passed over without a request ([ErrBlocked] when it was the last). An
// insecure source may be reached over plain http (when https fails) and its TLS certificate is
// not verified; other sources are reached over verified https only, loopback and private
// addresses included (go-containerregistry alone would fall back to plain http for registries
// on localhost, 127.0.0.1, ::1 and RFC 1918 addresses; the Client refuses, as podman does). A
// namespace-proxy value is sent as the "ns" query parameter.
//
// The manifests are asked of the sources in turn. Any failure but the caller's context ending
// (not found, unauthorized, 5xx, connection refused, a bad answer) moves on to the next source
// at once; the last source, the registry itself, is retried when it fails transiently, as a
// blob read is (below: the same attempts, backoff, bound of one attempt and stall detection;
// a truncated manifest or config is transient too). When all fail, the error wraps the registry's
// failure and quotes the mirrors'. The Image remembers its sources, the one that served it
// first: its other platforms' manifests and its blobs are read from there, and from the others
// in turn when it fails. This is how a fleet plugs in a pull-through cache or a P2P system
// (Spegel, Dragonfly): as mirrors.
//
// # Authentication
//
// Each source gets one authenticated transport, made on its first request and kept for the
// resolution and the Blobs made from it: one ping of the registry and, when the registry asks
// for bearer tokens (go-containerregistry's transport does the token exchange, scope pull on
// the repository), one token, renewed when the registry refuses it. Credentials are those of
// the source's own registry and repository (a mirror's, not its upstream's), from:
//
//  1. the [MemoryKeychain] of Config.Keychain (credentials from the auth helper),
//     for exactly the repository they were set for;
//  2. the files of containers-auth.json(5), each on its own: the file REGISTRY_AUTH_FILE names
//     (read when the Client is made) if set, otherwise ${XDG_RUNTIME_DIR}/containers/auth.json
//     (or /run/containers/$UID/auth.json), ${XDG_CONFIG_HOME:-~/.config}/containers/auth.json
//     and ${DOCKER_CONFIG:-~/.docker}/config.json, with their credHelpers and registries.conf's
//     credential-helpers, read by containers/image;
//  3. the extra files of Config.AuthFiles (the kubelet's config.json, say), the same way;
//  4. ~/.dockercfg, then the credsStore of the Docker config files among those
//     (docker-credential-<name> get), which hold registry entries only.
//
// Across all of them the most specific entry wins: one for the repository beats one for a
// namespace, which beats one for the registry (a credHelpers entry is a registry entry); among
// entries equally specific, the source first in that list. containers/image would take the
// first file with any match: on a node shared by every pull, a broad entry of one file must not
// shadow a narrower one of another. None means anonymous access. Credentials are
// read when a source first authenticates: credentials changed later apply from the next
// resolution. Secrets are never logged nor put in errors ([Credentials] hides them from fmt and
// slog), but containers/image logs through logrus at debug level which files it used.
//
// # What a Blob does with a batch of ranges
//
// A [Blob] reads byte ranges of one registry blob over HTTP: it turns random reads
// ([Blob.ReadAt], which satisfies verify.Source) and batches of ranges ([Blob.Fetch], and
// [Blob.Stream], which hands out each range's bytes as they arrive) into as few range requests
// as it can, and survives what registries and their storage back ends do to such requests.
// Bytes are not verified here; package verify does that.
//
//   - Coalescing: ranges are sorted; overlapping and adjacent ones are merged, and so are ranges
//     closer than the gap (Config.MaxGap, default 64 KiB) while the merged span stays within the
//     maximum span (Config.MaxSpan, default 16 MiB). Longer spans are split at that maximum. The
//     slices Fetch returns are views of the spans read, not copies: they are read-only.
//   - Multi-range requests: up to Config.MaxRangesPerRequest spans (default 16) are asked for in
//     one request (Range: bytes=a-b,c-d). A 206 multipart/byteranges answer is parsed part by
//     part, each part's Content-Range checked. A single-part 206 must carry a Content-Range that
//     contains whole requested spans, or the answer is rejected with [ErrBadResponse]. A 200
//     answer is read from its start only up to the end of the last needed span.
//   - Fallback: when a registry answers a multi-range request with 400 or 416, with a 200 full
//     body, or with only some of the ranges, the Blob remembers that it does not do multi-range
//     and from then on sends one request per span.
//   - Redirects are followed by the Blob itself (at most 5 hops). A hop to another host goes
//     through the Client's transport (Config.Transport) without the registry's credentials,
//     so that they never reach it. The final redirected URL is cached; when the storage
//     answers 403 (signed URL expired) or 404 on the cached URL, the registry is asked once
//     for a fresh redirect. A hop from https to
//     plain http is refused, and so is a hop to an address that is not public (loopback,
//     link-local, unspecified, private, other special ranges; IPv4-mapped and NAT64 addresses
//     count as their IPv4 address) unless the registry's host resolves to an address of that
//     same class: a registry on loopback may redirect to loopback, one on a public address to
//     public addresses only. The target's name is resolved and checked before the hop is sent,
//     and the address dialed is checked again when Config.Transport is an *http.Transport
//     (the default is), so that DNS rebinding does not get round the check.
//     A refused redirect is an [ErrBadResponse], not retried. The redirects of manifest,
//     config and token requests, which net/http follows for go-containerregistry, obey the
//     same rules, checked by name before each hop.
//   - Retries: connection errors, timeouts, truncated bodies, 408, 429 and 5xx are retried up to
//     Config.MaxAttempts attempts in all (default 4), with capped exponential backoff and jitter
//     (100 ms doubling up to 10 s). Retry-After (seconds or HTTP-date) on 429 and 503 is
//     honoured, capped at the same maximum. Each attempt has its own timeout
//     (Config.RequestTimeout, default 30 s). Exhausted retries yield an error wrapping
//     [ErrTransient].
//   - Stalls: a request the registry leaves without an answer, or whose body it leaves without
//     a byte while it is read, for Config.StallTimeout (default 10 s) is abandoned, and fails
//     with [ErrTransient]: it is retried on a fresh connection, rather than waiting for the
//     request timeout. The time a reader spends between reads does not count.
//   - Sources: a Blob made by a Client reads from the image's sources in turn. When one fails
//     for any reason but the caller's context (after its retries), the same requests go to the
//     next, and the next becomes the first asked for later reads. When all fail, the error is
//     the first source's, quoting the others'.
//   - Streaming: every span is read into its buffer as the body comes, and what has come is
//     published at once ([Blob.Stream]'s readers block for the rest: package verify
//     decompresses and hashes a chunk while it arrives). A byte once written is never written
//     again: a request that fails part way is followed by one (the retry, or the next source's)
//     that skips the bytes already in. A reader of a request that fails gets its error.
//   - Concurrency: every request holds one of the Client's slots for the registry's host
//     (Config.ConcurrencyPerHost, default 8), including the hops to storage it was redirected
//     to. Concurrent Fetch and Stream calls asking for the same coalesced span share one
//     request (a Stream joining another's request reads its bytes once it has ended). ReadAt
//     reads the spans straight into the caller's buffer (no buffer of their own for the
//     collector to find, no copy: a TOC or a tar-split of tens of MB is read this way), so its
//     requests are its own.
//
// # Bounds on what registries send
//
// Every request asks for the body as stored (Accept-Encoding: identity), so that net/http never
// inflates an answer; a successful answer with another Content-Encoding is refused
// ([ErrBadResponse]) rather than read. Bodies read whole (manifests, configs, token, ping and
// error answers: every request without a Range header) are capped at 4 MiB, the cap
// containers/image puts on manifests and configs, whatever size a descriptor claims; a body
// over it fails with [ErrBadResponse], after at most 4 MiB was read. Range answers are read no
// further than the ranges asked for.
//
// Errors are [*Error] values (for a Blob) or errors (for a resolution) wrapping the package
// sentinels ([ErrNotFound], [ErrUnauthorized], [ErrTransient], [ErrBadResponse],
// [ErrRangeUnsupported], [ErrBlocked]); their URLs never carry a query string (signed storage
// URLs keep secrets there). Context errors are returned wrapped, so errors.Is with
// context.Canceled or context.DeadlineExceeded works.
//
// Clients, Resolvers and Blobs are safe for concurrent use.
package fetcher
