// Package fusesession carries a live FUSE session from one process to the next: what a process
// that takes over a mounted filesystem's /dev/fuse descriptor needs besides the descriptor (the
// kernel's INIT request, which the kernel sends once per mount), and the notification by which
// it has the kernel send again the requests its predecessor read but never answered.
//
// The descriptor itself travels as any other (SCM_RIGHTS, a service manager's file descriptor
// store, an inherited file); a go-fuse server resumes on it with the mount point /dev/fd/N and
// fuse.MountOptions.ResumeInit set to the decoded InitIn (a change carried in
// internal/third_party/go-fuse, see its README.md). The functions here hold no state and are
// safe for concurrent use.
package fusesession

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// ErrNoResend is returned by Resend when the kernel cannot resend requests (before Linux 6.9).
var ErrNoResend = errors.New("fusesession: the kernel cannot resend requests (FUSE_NOTIFY_RESEND, Linux 6.9+)")

// EncodeInit returns the kernel's INIT request (a Server's KernelSettings) in the form
// DecodeInit reads, for the next process on the same machine.
func EncodeInit(in *fuse.InitIn) []byte {
	var b bytes.Buffer
	_ = binary.Write(&b, binary.NativeEndian, in) // fixed-size fields only: cannot fail
	return b.Bytes()
}

// DecodeInit reads what EncodeInit wrote.
func DecodeInit(b []byte) (*fuse.InitIn, error) {
	in := new(fuse.InitIn)
	if len(b) != binary.Size(in) {
		return nil, fmt.Errorf("fusesession: saved INIT is %d bytes, want %d", len(b), binary.Size(in))
	}
	if err := binary.Read(bytes.NewReader(b), binary.NativeEndian, in); err != nil {
		return nil, fmt.Errorf("fusesession: saved INIT: %w", err)
	}
	return in, nil
}

// CanResend reports whether the kernel that sent in resends requests on Resend.
func CanResend(in *fuse.InitIn) bool {
	return in.Flags64()&fuse.CAP_HAS_RESEND != 0
}

// Resend has the kernel queue again, in their order, every request of the session on fd that a
// reader took and did not answer: those a dead process was handling. A resent request keeps its
// unique number with the top bit set. It must be sent before the new process reads: a request
// it had read and not yet answered would be resent too, and handled twice (the second answer
// fails with ENOENT).
func Resend(fd int, in *fuse.InitIn) error {
	if !CanResend(in) {
		return ErrNoResend
	}
	// go-fuse's NOTIFY_ codes are negated, as it negates statuses in the header.
	h := fuse.OutHeader{Status: -fuse.NOTIFY_RESEND}
	h.Length = uint32(unsafe.Sizeof(h))
	b := unsafe.Slice((*byte)(unsafe.Pointer(&h)), unsafe.Sizeof(h))
	for {
		n, err := syscall.Write(fd, b)
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			return fmt.Errorf("fusesession: FUSE_NOTIFY_RESEND: %w", err)
		case n != len(b):
			return fmt.Errorf("fusesession: FUSE_NOTIFY_RESEND: short write (%d of %d bytes)", n, len(b))
		}
		return nil
	}
}
