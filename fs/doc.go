// Package storefs serves the additional layer store's namespace over FUSE, as the contract
// in docs/als-contract.md describes it. It owns three things:
//
//   - the namespace <mnt>/<base64(ref)>/<key>/{diff,info,blob,use}: decoding the
//     reference and the layer key, the info and blob files, and the use/rmdir protocol by
//     which the runtime counts its users of a layer;
//   - the diff tree: a read-only, overlay-ready view of a layer's chunked.Index, with every
//     piece of metadata (modes with setuid/setgid/sticky, owners, times, xattrs, symlink
//     targets verbatim, hardlinks sharing one inode, devices, FIFOs, whiteouts) and file
//     content read through Layer.ReadFile or, when the layer has the file locally, served by
//     the kernel itself through FUSE passthrough;
//   - the one place where Go errors become errnos (errno.go): errors wrapping
//     io/fs.ErrNotExist answer ENOENT (ESTALE for a layer the kernel already holds a node
//     of), context.Canceled answers EINTR, everything else EIO.
//
// It does not own the network, the layer formats, verification or any caching policy: it
// translates FUSE calls into calls on a [Store] and its [Layer]s, passing the request's
// context along, and nothing more.
//
// # Concurrency
//
// go-fuse calls the handlers from many goroutines at once, one per request in flight, so
// they are safe for concurrent use, and the [Store] and [Layer]s given must be too. What
// requests share, and its locks, in the order they may be taken:
//
//   - the passthrough state (the inodes with open files, their backing IDs): ptMu, held
//     across Layer.Backing and the kernel's registration of the backing file;
//   - the numbering (reference directories, blocks, the runtime's uses): mu, a RWMutex, held
//     while a new number is appended to the session table, whose own lock is taken last;
//   - the stop gate (requests held while the server stops): gateMu, taken alone.
//
// No other lock is held across a call into the Store or a Layer: lookups, reads, use and
// release run unlocked. Each block holds its layer in an atomic pointer. [Server]'s methods
// may be called from any goroutine.
//
// # Mounting and sessions
//
// [Mount] mounts with default_permissions (the kernel checks permissions against the modes
// and owners of the tree), as subtype "layerstore", and returns once the mountpoint answers
// from the new server. The mount itself is read-write at the VFS level: the runtime's
// create(<key>/use) and rmdir(<ref>/<key>) must reach the daemon, and a read-only mount would
// fail them with EROFS in the kernel. Every other modification answers EROFS from the daemon.
// [ClearDeadMount] removes the dead mount a crashed daemon leaves behind, so that a restarted
// daemon can mount again.
//
// The daemon mounts /dev/fuse itself (mount(2)), so that it holds the FUSE session's
// descriptor; [Server.Session] returns it with the session table, for the next process. A
// FUSE connection lives as long as some process holds that descriptor: a daemon killed, or
// stopped with [Server.Stop] for a restart or an upgrade, is taken over by the next process
// with [Resume], which serves the same mount without a new mount or INIT, with the same node
// IDs and file handles, and has the kernel resend the requests the previous process had read
// and not answered (FUSE_NOTIFY_RESEND, Linux 6.9+; on older kernels those stay unanswered
// until the mount is aborted). Without the privilege to mount (not root) the daemon mounts
// through go-fuse (fusermount), without a session.
//
// The session table is a memfd that only grows: a header (what the next process must repeat:
// the kernel's INIT, the FUSE settings, whether passthrough is on, the mount's device and
// start time), then one record for each number handed to the kernel (reference directories,
// layer blocks) and for each passthrough backing ID registered or unregistered, each written
// before the answer that gives it. The next process treats it as untrusted input.
//
// Requests are served through go-fuse's [fuse.RawFileSystem]: every answer comes from the
// node ID (the inode number) and the layer's index, none from per-node state, so the daemon
// holds nothing per entry the kernel knows and FORGET is ignored. A file handle is the node ID
// (with the top bit set for a passthrough open): reads are stateless (Layer.ReadFile at an
// offset, info read again at each read), and a directory listing resumes at any offset it
// gave. A block of numbers keeps its layer while it is used, and asks the Store for it again
// after ten idle minutes (and in a process that resumed the session), so that layers the
// runtime no longer uses are the Store's to free.
//
// A layer the Store refuses after handing it out ([Refuser]: a zstd:chunked layer whose
// tar-split contradicts its TOC) answers EIO from then on, and its block's waiter has the
// kernel drop what it cached of the layer's directory and tree (entries, attributes, kept
// pages: refusal.go), so that a path looked up before the refusal fails too. Files already
// open with passthrough read on: the kernel reads their backing files itself.
// # Who may use the mount
//
// Only the daemon's user: root, the runtime, and overlayfs on behalf of containers (a rootless
// daemon: its user, whose rootless runtime reaches the mount from a user namespace whose root
// is that user; the checks below compare with the daemon's uid rather than 0, and
// Config.IDs shows the trees' owners through that namespace's map). The daemon resolves layers
// with the node's registry credentials, so a local user who could look up a reference would
// read private images and make the daemon connect wherever a reference names. Two checks
// keep other users out:
//
//   - The mount is made without allow_other: the kernel refuses every access of a process
//     whose uids and gids are not all those of the mounter (root of the initial user
//     namespace) with EACCES before it reaches the daemon. Root in another user namespace
//     is another user.
//   - Behind it, the daemon refuses (EACCES) every request that would make the Store resolve
//     or count a layer, or open a file, unless the request's uid is 0: lookups in the store
//     root and in reference directories, create of use, rmdir, and open of info, blob and
//     the diff trees' files.
//
// Containers of any uid, in user namespaces or not, keep working: overlayfs looks up, opens
// and reads its lower layers with the credentials of the process that mounted the overlay
// (the runtime, root), so those requests arrive as uid 0. The exception is a page fault in a
// file a container's process mapped: overlayfs hands the mapping to the file of this mount,
// and the kernel reads the missing pages with the faulting process's credentials, whatever
// its uid. Reads are therefore not checked; they only reach files that root opened.
//
// # Inode numbers and kernel caching
//
// Inode numbers are the FUSE node IDs, and mean the same in every process of a session. The
// root is 1. Each (ref, key) layer directory that resolves gets its own block of 2^32 inode
// numbers, for as long as the layer it resolves to has the same identity (the key and
// chunked.Index.Identity: what numbers its entries): the layer directory, info and blob at
// the start of the block, the diff tree's entries at a fixed offset plus the chunked.EntryID
// of the entry owning the inode (so hardlinks share an inode number). Two references to the
// same layer get different blocks on purpose: the kernel allows a directory inode only one
// path. A layer that resolves under its (ref, key) with another identity gets a new block;
// the kernel's numbers in the old one answer ESTALE (logged), never another file's bytes.
//
// Reference directories take numbers from 2^63 up, above every block, one per name ever
// looked up in the session; a number is never handed out twice, so two names never share one
// (numbers derived from a hash of the name could collide). Blocks and reference numbers come
// from the session table, not from a per-process counter, and the table grows by one record
// per reference name and per layer identity resolved during the session's life.
//
// FUSE passthrough registers a file's backing file with the kernel once per inode while it
// has passthrough opens, and unregisters it with the last; the kernel refuses (EIO) a
// passthrough open of an inode with files open through the daemon and the reverse, so an
// inode is opened one way at a time. A process that resumes a session reuses the backing IDs
// the table holds for new opens of their inodes and never unregisters them (their opens are
// unknown to it); the other inodes of layers the previous processes numbered are served
// through the daemon, since files of theirs may be open that way.
//
// The diff tree and blob never change for a given layer directory inode, so entries,
// attributes, failed lookups, directory listings and file pages there are cached by the
// kernel for a long time (Config.EntryTimeout, Config.AttrTimeout, FOPEN_KEEP_CACHE for
// files; no listing of the mount ever changes, so directories are opened by the kernel
// itself, without OPENDIR or RELEASEDIR, and their listings kept: see rawFS.OpenDir).
// Directories are listed with READDIRPLUS: every entry comes with its attributes and becomes a
// cached lookup, so that a first walk of a tree (find, a scanner) reaches the daemon about
// once per directory, not once per entry, and a second one only for the attributes of the
// directories it lists (listing a directory invalidates its access time). Files are opened FOPEN_NOFLUSH:
// nothing is ever written, so a close(2) sends no FLUSH and waits for no answer (a process
// closing a file while the daemon restarts does not hang on it). The attributes of the root and of
// the reference and layer directories never change for their inode numbers either, and are
// cached too.
//
// The layer directories and their lookups are never cached: every lookup reaches Store.Lookup
// (a layer that failed resolves again on the next access) and the daemon's check of its
// caller, which a cached entry would skip for everything below it; every create of use
// reaches Store.Use and every rmdir reaches Store.Release. A walk that resolves every path
// from the mount's root therefore makes one request per path, for the layer directory; one
// relative to an open directory, as find does and as overlayfs does for a container, makes
// none. The content of info may change during a layer's life (a DiffID proven after the
// pull), so its attributes and pages are not cached either.
package storefs
