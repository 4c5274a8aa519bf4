// Package dir is the directory object store: the embedded default, needing no setup.
//
// Objects live as plain files under <root>/data/<key>, their metadata in a JSON sidecar
// under <root>/meta/<key>.json, and writes are staged in <root>/tmp and renamed into
// place, so an object is visible whole or not at all. Every file operation goes through
// an os.Root on the store's directory and keys are checked with store.ValidKey, so no key
// reaches outside it. Listing has S3's semantics: lexical byte order of the full keys,
// pages of at most 1,000.
//
// Limits of a file system: a key cannot be both an object and the folder of another
// ("a" and "a/b"); each key segment is at most 250 bytes.
package dir

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/owner"
)

const (
	dataDir = "data"
	metaDir = "meta"
	tmpDir  = "tmp"
	metaExt = ".json"
	maxSeg  = 250
)

// Store is a directory object store. It is safe for concurrent use within a process, and
// several processes may share a directory: an object appears whole (its metadata with
// it) or not at all, and a Put with IfNotExists is decided by hard links, which exactly
// one writer wins, whichever process it is in.
type Store struct {
	dir  string // absolute
	root *os.Root
	// mu orders a Put's two renames (data, sidecar) against readers and Delete, so that
	// within this process an object and its metadata are seen together.
	mu sync.RWMutex
}

var _ store.Store = (*Store)(nil)
var _ store.URLer = (*Store)(nil)

// private checks that the store's directory is this user's own and makes it 0700: the
// store holds snapshots of workspaces, which are no one else's to read. A directory of
// another user is refused rather than taken over.
func private(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory: refusing to use it", dir)
	}
	if who, other := owner.Other(dir, fi); other {
		return fmt.Errorf("%s belongs to %s, not to this user: refusing to use it", dir, who)
	}
	return os.Chmod(dir, 0o700)
}

// New opens (creating if needed) a directory store at dir, private to this user (0700;
// objects are written 0600).
func New(dir string) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("dir store %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("dir store %s: %w", dir, err)
	}
	if err := private(abs); err != nil {
		return nil, fmt.Errorf("dir store %s: %w", dir, err)
	}
	root, err := os.OpenRoot(abs)
	if err != nil {
		return nil, fmt.Errorf("dir store %s: %w", dir, err)
	}
	for _, d := range []string{dataDir, metaDir, tmpDir} {
		if err := root.MkdirAll(d, 0o700); err != nil {
			root.Close()
			return nil, fmt.Errorf("dir store %s: %w", dir, err)
		}
	}
	s := &Store{dir: abs, root: root}
	s.cleanTmp(24 * time.Hour)
	return s, nil
}

// Close releases the store's directory handle.
func (s *Store) Close() error { return s.root.Close() }

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

// cleanTmp removes staging files left by a crash, older than age.
func (s *Store) cleanTmp(age time.Duration) {
	ents, err := fs.ReadDir(s.root.FS(), tmpDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > age {
			s.root.Remove(path.Join(tmpDir, e.Name()))
		}
	}
}

func checkKey(key string) error {
	if err := store.ValidKey(key); err != nil {
		return err
	}
	for seg := range strings.SplitSeq(key, "/") {
		if len(seg) > maxSeg {
			return fmt.Errorf("%w %q: a segment is longer than %d bytes", store.ErrInvalidKey, key, maxSeg)
		}
	}
	if err := platformKey(key); err != nil {
		return fmt.Errorf("%w %q: %w", store.ErrInvalidKey, key, err)
	}
	return nil
}

type sidecar struct {
	Size        int64             `json:"size"`
	ContentType string            `json:"content_type,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
}

func tmpName() string {
	var b [12]byte
	rand.Read(b[:])
	return path.Join(tmpDir, hex.EncodeToString(b[:]))
}

// Put stores r under key: staged in tmp/, fsynced, then renamed (or, with IfNotExists,
// hard-linked, which fails if the key exists) into place.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, opts store.PutOptions) (store.ObjectInfo, error) {
	if err := checkKey(key); err != nil {
		return store.ObjectInfo{}, err
	}
	if err := store.ValidMetadata(opts.Metadata); err != nil {
		return store.ObjectInfo{}, fmt.Errorf("put %s: %w", key, err)
	}
	if opts.IfNotExists {
		if _, err := s.root.Lstat(path.Join(dataDir, key)); err == nil {
			return store.ObjectInfo{}, fmt.Errorf("put %s: %w", key, store.ErrExists)
		}
	}
	tmpData := tmpName()
	f, err := s.root.OpenFile(tmpData, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return store.ObjectInfo{}, fmt.Errorf("put %s: %w", key, err)
	}
	defer s.root.Remove(tmpData) // after the rename this is a no-op; after a link it drops the extra name
	n, err := store.CopyContext(ctx, f, r)
	if err == nil && opts.Size > 0 && n != opts.Size {
		err = fmt.Errorf("read %d bytes, expected %d", n, opts.Size)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return store.ObjectInfo{}, fmt.Errorf("put %s: %w", key, err)
	}
	ct := opts.ContentType
	if ct == "" {
		ct = "application/octet-stream"
	}
	meta, _ := json.Marshal(sidecar{Size: n, ContentType: ct, Metadata: opts.Metadata})
	tmpMeta := tmpName()
	if err := s.root.WriteFile(tmpMeta, meta, 0o600); err != nil {
		return store.ObjectInfo{}, fmt.Errorf("put %s: %w", key, err)
	}
	defer s.root.Remove(tmpMeta)

	dataPath, metaPath := path.Join(dataDir, key), path.Join(metaDir, key+metaExt)
	s.mu.Lock()
	err = s.commit(tmpData, tmpMeta, dataPath, metaPath, opts.IfNotExists)
	s.mu.Unlock()
	if err != nil {
		return store.ObjectInfo{}, fmt.Errorf("put %s: %w", key, err)
	}
	return s.Head(ctx, key)
}

// commit moves a staged object into place. Another process may be deleting the last
// object of a folder meanwhile (Delete removes empty folders), so a parent that vanished
// between MkdirAll and the rename is made again.
func (s *Store) commit(tmpData, tmpMeta, dataPath, metaPath string, exclusive bool) error {
	var err error
	for range 3 {
		if err = s.mkParents(dataPath, metaPath); err != nil {
			return err
		}
		if exclusive {
			err = s.commitExclusive(tmpData, tmpMeta, dataPath, metaPath)
		} else {
			err = s.commitReplace(tmpData, tmpMeta, dataPath, metaPath)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return err
}

func (s *Store) mkParents(paths ...string) error {
	for _, p := range paths {
		if err := s.root.MkdirAll(path.Dir(p), 0o700); err != nil {
			if notDir(err) || errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("%w: a parent of the key is itself an object", store.ErrInvalidKey)
			}
			return err
		}
	}
	return nil
}

// orphanAge is how old a metadata file without its object must be before an exclusive
// Put takes it for the leftover of a crash: a writer links its object microseconds after
// its metadata.
const orphanAge = time.Minute

// commitExclusive claims the key with hard links, which fail when the name exists, across
// processes too: the metadata first, then the object. A reader (Head, Get, List) only sees
// an object once its data file is there, and by then its metadata is.
func (s *Store) commitExclusive(tmpData, tmpMeta, dataPath, metaPath string) error {
	if _, err := s.root.Lstat(dataPath); err == nil {
		return store.ErrExists
	}
	if err := s.root.Link(tmpMeta, metaPath); err != nil {
		if !errors.Is(err, fs.ErrExist) {
			return err
		}
		// Another writer's claim, or the metadata of a crashed one whose object never
		// arrived.
		fi, serr := s.root.Lstat(metaPath)
		if _, derr := s.root.Lstat(dataPath); derr == nil || serr != nil || time.Since(fi.ModTime()) < orphanAge {
			return store.ErrExists
		}
		if err := s.root.Remove(metaPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := s.root.Link(tmpMeta, metaPath); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return store.ErrExists
			}
			return err
		}
	}
	if err := s.root.Link(tmpData, dataPath); err != nil {
		s.root.Remove(metaPath) // ours: the claim failed
		if errors.Is(err, fs.ErrExist) {
			return store.ErrExists
		}
		return err
	}
	return nil
}

func (s *Store) commitReplace(tmpData, tmpMeta, dataPath, metaPath string) error {
	if err := s.root.Rename(tmpMeta, metaPath); err != nil {
		return err
	}
	if err := s.root.Rename(tmpData, dataPath); err != nil {
		if isDirInTheWay(err) {
			return fmt.Errorf("%w: the key is the folder of other objects", store.ErrInvalidKey)
		}
		return err
	}
	return nil
}

func (s *Store) info(key string, fi fs.FileInfo) (store.ObjectInfo, error) {
	oi := store.ObjectInfo{
		Key:          key,
		Size:         fi.Size(),
		LastModified: fi.ModTime().UTC(),
		ETag:         fmt.Sprintf("%x-%x", fi.Size(), fi.ModTime().UnixNano()),
	}
	b, err := s.root.ReadFile(path.Join(metaDir, key+metaExt))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return oi, err
	}
	if err == nil {
		var sc sidecar
		if err := json.Unmarshal(b, &sc); err != nil {
			return oi, fmt.Errorf("metadata of %s: %w", key, err)
		}
		oi.ContentType, oi.Metadata = sc.ContentType, sc.Metadata
	}
	if oi.Metadata == nil {
		oi.Metadata = map[string]string{}
	}
	return oi, nil
}

// Get opens an object; the reader is the file itself.
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, store.ObjectInfo, error) {
	if err := checkKey(key); err != nil {
		return nil, store.ObjectInfo{}, err
	}
	if err := ctx.Err(); err != nil {
		return nil, store.ObjectInfo{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	f, err := s.root.Open(path.Join(dataDir, key))
	if err != nil {
		return nil, store.ObjectInfo{}, notFound(key, err)
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fs.ErrNotExist
	}
	if err != nil {
		f.Close()
		return nil, store.ObjectInfo{}, notFound(key, err)
	}
	oi, err := s.info(key, fi)
	if err != nil {
		f.Close()
		return nil, store.ObjectInfo{}, fmt.Errorf("get %s: %w", key, err)
	}
	return f, oi, nil
}

// Head describes an object.
func (s *Store) Head(ctx context.Context, key string) (store.ObjectInfo, error) {
	if err := checkKey(key); err != nil {
		return store.ObjectInfo{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.ObjectInfo{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	fi, err := s.root.Lstat(path.Join(dataDir, key))
	if err == nil && !fi.Mode().IsRegular() {
		err = fs.ErrNotExist
	}
	if err != nil {
		return store.ObjectInfo{}, notFound(key, err)
	}
	oi, err := s.info(key, fi)
	if err != nil {
		return store.ObjectInfo{}, fmt.Errorf("head %s: %w", key, err)
	}
	return oi, nil
}

func notFound(key string, err error) error {
	if errors.Is(err, fs.ErrNotExist) || notDir(err) {
		return fmt.Errorf("%s: %w", key, store.ErrNotFound)
	}
	return fmt.Errorf("%s: %w", key, err)
}

// List returns keys under opts.Prefix in lexical order. The token is the last key of the
// previous page.
func (s *Store) List(ctx context.Context, opts store.ListOptions) (store.ListPage, error) {
	limit := opts.MaxKeys
	if limit <= 0 || limit > store.MaxListKeys {
		limit = store.MaxListKeys
	}
	// Walk only the deepest folder the prefix names.
	start := dataDir
	if i := strings.LastIndexByte(opts.Prefix, '/'); i > 0 {
		folder := opts.Prefix[:i]
		if store.ValidKey(folder) != nil {
			return store.ListPage{}, nil // no valid key can have this prefix
		}
		start = path.Join(dataDir, folder)
	}
	type item struct {
		key string
		fi  fs.FileInfo
	}
	var items []item
	s.mu.RLock()
	err := fs.WalkDir(s.root.FS(), start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == start && errors.Is(err, fs.ErrNotExist) {
				return fs.SkipAll
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		key := strings.TrimPrefix(p, dataDir+"/")
		if d.IsDir() {
			// Prune folders that cannot hold a matching key.
			if p != start && !strings.HasPrefix(key+"/", opts.Prefix) && !strings.HasPrefix(opts.Prefix, key+"/") {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !strings.HasPrefix(key, opts.Prefix) || (opts.Token != "" && key <= opts.Token) {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		items = append(items, item{key, fi})
		return nil
	})
	s.mu.RUnlock()
	if err != nil && !notDir(err) {
		return store.ListPage{}, fmt.Errorf("list %q: %w", opts.Prefix, err)
	}
	slices.SortFunc(items, func(a, b item) int { return strings.Compare(a.key, b.key) })
	var page store.ListPage
	for i, it := range items {
		if i == limit {
			page.Next = page.Objects[len(page.Objects)-1].Key
			break
		}
		page.Objects = append(page.Objects, store.ObjectInfo{
			Key: it.key, Size: it.fi.Size(), LastModified: it.fi.ModTime().UTC(),
			ETag: fmt.Sprintf("%x-%x", it.fi.Size(), it.fi.ModTime().UnixNano()),
		})
	}
	return page, nil
}

// Delete removes objects and their metadata, and folders left empty.
func (s *Store) Delete(ctx context.Context, keys ...string) error {
	for _, k := range keys {
		if err := checkKey(k); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return err
		}
		for _, p := range []string{path.Join(dataDir, k), path.Join(metaDir, k+metaExt)} {
			if fi, err := s.root.Lstat(p); err == nil && fi.IsDir() {
				continue // a folder of other keys, not an object
			}
			if err := s.root.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) && !notDir(err) {
				return fmt.Errorf("delete %s: %w", k, err)
			}
			for d := path.Dir(p); d != dataDir && d != metaDir && d != "."; d = path.Dir(d) {
				if s.root.Remove(d) != nil { // not empty (or gone): stop climbing
					break
				}
			}
		}
	}
	return nil
}

// URL returns the absolute path of the object's file (ttl is ignored).
func (s *Store) URL(ctx context.Context, key string, ttl time.Duration) (string, error) {
	if _, err := s.Head(ctx, key); err != nil {
		return "", err
	}
	return filepath.Join(s.dir, dataDir, filepath.FromSlash(key)), nil
}
