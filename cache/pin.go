package cache

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/layerstore/layerstore/chunked"
)

// A pin file ("pins/<64 hex>", the sha256 of the pin's name) holds:
//
//	"LSCPINS1" | name length (uint32 LE) | record count (uint32 LE) | file count (uint32 LE)
//	| name | per record: length (1 byte), name | per file: digest (32 bytes)
//	| CRC-32C of everything before (uint32 LE)
//
// Records and files are sorted and unique.
const (
	pinMagic = "LSCPINS1"
	// maxPinName is the longest pin name.
	maxPinName = 1024
	// maxPinFile bounds what the start-up scan reads of a pin file (about 32M files).
	maxPinFile = 1 << 30
)

// pin is a pin as loaded: immutable once made.
type pin struct {
	name    string
	records []string      // sorted, unique
	files   []chunked.Sum // sorted, unique
}

// PinInfo describes a pin and how much of what it names the cache holds.
type PinInfo struct {
	Name           string   `json:"name"`
	Records        []string `json:"records"`        // the records it names, sorted
	RecordsPresent int      `json:"recordsPresent"` // of which present
	Files          int      `json:"files"`          // the files it names
	FilesComplete  int      `json:"filesComplete"`  // of which complete
	// Bytes is the content present of the files it names, complete or partial. The cache
	// knows the size of a file only once it holds some of it: the total is the caller's.
	Bytes int64 `json:"bytes"`
}

func pinFileName(name string) string {
	s := sha256.Sum256([]byte(name))
	return hex.EncodeToString(s[:])
}

func compareSum(a, b chunked.Sum) int { return bytes.Compare(a[:], b[:]) }

// Pin keeps the records and files (by digest, complete or partial, present now or stored
// later) that it names out of eviction, under the pin's name (1 to 1024 bytes), replacing a
// pin of that name. It is durable before Pin returns (written atomically, like a record, and
// checksummed): pins survive restarts and crashes. Pinned content is outside the size bound:
// the bound applies to the content no pin names, so usage may exceed it by what pins hold.
// It still counts in [Cache.Usage], and a full filesystem makes room by evicting only what no
// pin names. Open handles keep content too, pinned or not.
func (c *Cache) Pin(name string, records []string, files []chunked.Sum) error {
	if name == "" || len(name) > maxPinName {
		return fmt.Errorf("cache: invalid pin name %q: want 1 to %d bytes", name, maxPinName)
	}
	p := &pin{name: name, records: slices.Clone(records), files: slices.Clone(files)}
	for _, r := range p.records {
		if err := checkRecordName(r); err != nil {
			return err
		}
	}
	for _, s := range p.files {
		if s.IsZero() {
			return errors.New("cache: pin of a zero digest")
		}
	}
	slices.Sort(p.records)
	p.records = slices.Compact(p.records)
	slices.SortFunc(p.files, compareSum)
	p.files = slices.Compact(p.files)
	b := p.encode()
	if len(b) > maxPinFile {
		return fmt.Errorf("cache: pin %q names too much (%d bytes, at most %d)", name, len(b), maxPinFile)
	}

	c.pinMu.Lock()
	defer c.pinMu.Unlock()
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	dir := filepath.Join(c.root, pinsDir)
	err := c.withRoom(int64(len(b)), func() error {
		if err := c.refuseIfFull(); err != nil {
			return fmt.Errorf("cache: writing pin %q: %w", name, err)
		}
		if err := writeFileAtomic(dir, pinFileName(name), b); err != nil {
			return fmt.Errorf("cache: writing pin %q: %w", name, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.pins[name]
	c.pins[name] = p
	c.applyPinLocked(p, 1) // before the old one goes: what both name stays pinned
	if old != nil {
		c.applyPinLocked(old, -1)
	}
	c.evictLocked()
	return nil
}

// Unpin removes the pin name, durably; what it named is evicted like anything else from then
// on (unless another pin names it). A name that is not pinned gives an error wrapping
// [fs.ErrNotExist].
func (c *Cache) Unpin(name string) error {
	c.pinMu.Lock()
	defer c.pinMu.Unlock()
	c.mu.Lock()
	closed, p := c.closed, c.pins[name]
	c.mu.Unlock()
	switch {
	case closed:
		return ErrClosed
	case p == nil:
		return fmt.Errorf("cache: no pin %q: %w", name, fs.ErrNotExist)
	}
	dir := filepath.Join(c.root, pinsDir)
	if err := removeIfExists(filepath.Join(dir, pinFileName(name))); err != nil {
		return fmt.Errorf("cache: removing pin %q: %w", name, err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("cache: removing pin %q: %w", name, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pins, name)
	c.applyPinLocked(p, -1)
	c.evictLocked()
	return nil
}

// Pins returns the pins, sorted by name, with how much of what they name is present.
func (c *Cache) Pins() ([]PinInfo, error) {
	type pinned struct {
		info    PinInfo
		entries []*entry
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	all := make([]pinned, 0, len(c.pins))
	for _, p := range c.pins {
		pi := pinned{info: PinInfo{Name: p.name, Records: slices.Clone(p.records), Files: len(p.files)}}
		for _, r := range p.records {
			if c.records[r] != nil {
				pi.info.RecordsPresent++
			}
		}
		for _, s := range p.files {
			if e := c.entries[s]; e != nil {
				pi.entries = append(pi.entries, e)
			}
		}
		all = append(all, pi)
	}
	c.mu.Unlock()
	// The entries' state is looked at outside Cache.mu: see Has.
	out := make([]PinInfo, 0, len(all))
	for _, pi := range all {
		for _, e := range pi.entries {
			pi.info.Bytes += e.present()
			if e.isComplete() {
				pi.info.FilesComplete++
			}
		}
		out = append(out, pi.info)
	}
	slices.SortFunc(out, func(a, b PinInfo) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

// Available returns the bytes that the cache's filesystem has free for unprivileged use
// (statfs f_bavail times the block size): what can still be stored before the filesystem is
// full, evicting nothing.
func (c *Cache) Available() (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(c.root, &st); err != nil {
		return 0, fmt.Errorf("cache: statfs %s: %w", c.root, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// filePinsLocked returns how many pins name the file sum.
func (c *Cache) filePinsLocked(sum chunked.Sum) int {
	n := 0
	for _, p := range c.pins {
		if _, ok := slices.BinarySearchFunc(p.files, sum, compareSum); ok {
			n++
		}
	}
	return n
}

// recordPinsLocked returns how many pins name the record name.
func (c *Cache) recordPinsLocked(name string) int {
	n := 0
	for _, p := range c.pins {
		if _, ok := slices.BinarySearch(p.records, name); ok {
			n++
		}
	}
	return n
}

// applyPinLocked adds d (1 or -1) to the pin counts of the entries and records that p names
// and that the cache holds (those it does not get their count when they appear).
func (c *Cache) applyPinLocked(p *pin, d int) {
	for _, s := range p.files {
		if e := c.entries[s]; e != nil {
			c.setEntryPinsLocked(e, e.pins+d)
		}
	}
	for _, name := range p.records {
		if r := c.records[name]; r != nil {
			c.setRecordPinsLocked(r, r.pins+d)
		}
	}
}

// setEntryPinsLocked sets an entry's pin count; a pinned entry leaves the LRU list, and comes
// back at its end (least recently used) when its last pin goes: its use while pinned was not
// tracked, and what a pin no longer keeps should go before the working set of what was never
// pinned.
func (c *Cache) setEntryPinsLocked(e *entry, n int) {
	was := e.pins > 0
	e.pins = n
	switch {
	case !was && n > 0:
		c.lru.Remove(e.elem)
		e.setPinnedLocked(true)
	case was && n == 0:
		e.elem = c.lru.PushBack(e)
		e.setPinnedLocked(false)
	}
}

// setRecordPinsLocked is setEntryPinsLocked for a record.
func (c *Cache) setRecordPinsLocked(r *record, n int) {
	was := r.pins > 0
	r.pins = n
	switch {
	case !was && n > 0:
		c.lru.Remove(r.elem)
		c.pinned.Add(r.size)
	case was && n == 0:
		r.elem = c.lru.PushBack(r)
		c.pinned.Add(-r.size)
	}
}

func (p *pin) encode() []byte {
	n := len(pinMagic) + 12 + len(p.name) + len(p.records) + 32*len(p.files) + 4
	for _, r := range p.records {
		n += len(r)
	}
	b := make([]byte, 0, n)
	b = append(b, pinMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(p.name)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(p.records)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(p.files)))
	b = append(b, p.name...)
	for _, r := range p.records {
		b = append(b, byte(len(r)))
		b = append(b, r...)
	}
	for _, s := range p.files {
		b = append(b, s[:]...)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
}

// parsePin decodes and checks a pin file.
func parsePin(b []byte) (*pin, error) {
	const head = len(pinMagic) + 12
	if len(b) < head+4 || string(b[:len(pinMagic)]) != pinMagic {
		return nil, errors.New("not a pin file (bad magic)")
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, crcTable) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return nil, errors.New("checksum mismatch")
	}
	nameLen := binary.LittleEndian.Uint32(body[8:12])
	nRec := binary.LittleEndian.Uint32(body[12:16])
	nFiles := binary.LittleEndian.Uint32(body[16:20])
	rest := body[head:]
	// Each count is checked against the bytes left before anything is allocated.
	if nameLen == 0 || nameLen > maxPinName || uint64(nameLen) > uint64(len(rest)) {
		return nil, fmt.Errorf("bad name length %d", nameLen)
	}
	p := &pin{name: string(rest[:nameLen])}
	rest = rest[nameLen:]
	if uint64(nRec) > uint64(len(rest)/2) {
		return nil, fmt.Errorf("bad record count %d", nRec)
	}
	p.records = make([]string, 0, nRec)
	for range nRec {
		if len(rest) == 0 || int(rest[0]) >= len(rest) {
			return nil, errors.New("truncated record name")
		}
		l := int(rest[0])
		r := string(rest[1 : 1+l])
		if !validRecordName(r) || len(p.records) > 0 && r <= p.records[len(p.records)-1] {
			return nil, fmt.Errorf("bad or unsorted record name %q", r)
		}
		p.records = append(p.records, r)
		rest = rest[1+l:]
	}
	if uint64(len(rest)) != 32*uint64(nFiles) {
		return nil, fmt.Errorf("%d bytes for %d files", len(rest), nFiles)
	}
	p.files = make([]chunked.Sum, nFiles)
	for i := range p.files {
		copy(p.files[i][:], rest[32*i:])
		if p.files[i].IsZero() || i > 0 && compareSum(p.files[i-1], p.files[i]) >= 0 {
			return nil, fmt.Errorf("zero or unsorted file digest at %d", i)
		}
	}
	return p, nil
}

// scanPins loads the pins, and removes temporary files and damaged pin files. A damaged pin
// is dropped and logged: see the package documentation (Pins) for why.
func (c *Cache) scanPins() error {
	dir := filepath.Join(c.root, pinsDir)
	des, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, de := range des {
		p := filepath.Join(dir, de.Name())
		if _, ok := parseName(de.Name()); !ok || !de.Type().IsRegular() {
			if de.Type().IsRegular() {
				c.removeStray(p)
			} else {
				c.opts.logger.Warn("cache: unexpected entry in pins", "path", p)
			}
			continue
		}
		pn, err := readPin(p)
		if err == nil && pinFileName(pn.name) != de.Name() {
			err = fmt.Errorf("file name does not match pin name %q", pn.name)
		}
		if err != nil {
			c.opts.logger.Warn("cache: dropping damaged pin: what it named can be evicted until pinned again",
				"path", p, "err", err)
			c.removeStray(p)
			continue
		}
		c.pins[pn.name] = pn
	}
	return nil
}

func readPin(p string) (*pin, error) {
	info, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if info.Size() > maxPinFile {
		return nil, fmt.Errorf("%d bytes, at most %d", info.Size(), maxPinFile)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	return parsePin(b)
}

// writeFileAtomic writes b to dir/name durably: a temporary file, fsynced, renamed into
// place, the directory fsynced. A crash leaves the old file or the new one; the temporary
// file, if any, is removed by the next start.
func writeFileAtomic(dir, name string, b []byte) error {
	f, err := os.CreateTemp(dir, "."+name+".*"+tmpExt)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		_ = removeIfExists(f.Name())
		return err
	}
	return syncDir(dir)
}
