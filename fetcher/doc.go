// Package fetcher owns talking to registries.
//
// A [Resolver] turns a reference (tag, digest, or repo:tag@digest, where the digest wins) into
// an [Image]: the manifest for the host platform (picked from an image index by OS,
// architecture and variant; [Resolver.Platforms] fetches the index's other manifests), its
// layer descriptors with their annotations, and the config's DiffIDs. Resolutions by tag are
// reused for the tag TTL ([WithTagTTL], default 5 minutes), resolutions by digest for the
// resolver's life; failures are never remembered; concurrent resolutions of one reference
// share their requests. OCI and Docker schema2 media types are both read.
//
// A [Blob] reads byte ranges of one registry blob over HTTP: it turns random reads
// ([Blob.ReadAt], which satisfies verify.Source) and batches of ranges ([Blob.Fetch]) into as
// few range requests as it can, and survives what registries and their storage back ends do
// to such requests.
//
// Authentication and registries.conf mirrors are not done yet: a Resolver and a Blob are
// given an http.RoundTripper that already authenticates to the registry, a Blob the blob's URL
// (https://host/v2/<repo>/blobs/<digest>) and its size from the manifest. Bytes are not verified
// here either; package verify does that.
//
// # What a Blob does with a batch of ranges
//
//   - Coalescing: ranges are sorted; overlapping and adjacent ones are merged, and so are ranges
//     closer than the gap ([WithMaxGap], default 64 KiB) while the merged span stays within the
//     maximum span ([WithMaxSpan], default 16 MiB). Longer spans are split at that maximum.
//   - Multi-range requests: up to [WithMaxRangesPerRequest] spans (default 16) are asked for in
//     one request (Range: bytes=a-b,c-d). A 206 multipart/byteranges answer is parsed part by
//     part, each part's Content-Range checked. A single-part 206 must carry a Content-Range that
//     contains whole requested spans, or the answer is rejected with [ErrBadResponse]. A 200
//     answer is read from its start only up to the end of the last needed span.
//   - Fallback: when a registry answers a multi-range request with 400 or 416, with a 200 full
//     body, or with only some of the ranges, the Blob remembers that it does not do multi-range
//     and from then on sends one request per span.
//   - Redirects are followed by the Blob itself (at most 5 hops). A hop to another host goes
//     through the storage transport ([WithStorageTransport], default http.DefaultTransport), so
//     the registry's credentials never reach it. The final redirected URL is cached; when the
//     storage answers 403 (signed URL expired) or 404 on the cached URL, the registry is asked
//     once for a fresh redirect.
//   - Retries: connection errors, timeouts, truncated bodies, 408, 429 and 5xx are retried up to
//     [WithMaxAttempts] attempts in all (default 4), with capped exponential backoff and jitter
//     ([WithBackoff], default 100 ms doubling up to 10 s). Retry-After (seconds or HTTP-date) on
//     429 and 503 is honoured, capped at the same maximum. Each attempt has its own timeout
//     ([WithRequestTimeout], default 30 s). Exhausted retries yield an error wrapping
//     [ErrTransient].
//   - Concurrency: every request holds a slot of a [HostLimiter] for the registry's host
//     (default: one process-wide limiter with 8 slots per host; see [WithHostLimiter]),
//     including the hops to storage it was redirected to. Concurrent calls asking for the same
//     coalesced span share one request.
//
// Errors are [*Error] values wrapping the package sentinels ([ErrNotFound], [ErrUnauthorized],
// [ErrTransient], [ErrBadResponse], [ErrRangeUnsupported]); their URLs never carry a query string
// (signed storage URLs keep secrets there). Context errors are returned wrapped, so errors.Is
// with context.Canceled or context.DeadlineExceeded works.
//
// A Blob is safe for concurrent use.
package fetcher
