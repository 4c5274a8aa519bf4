package screenshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// Kinds of stored captures: the ones the agent asked for, and the ones the session took on
// its own (after a dev server started, after a commit).
const (
	KindAgent = "agent"
	KindAuto  = "auto"
)

// Recorder captures a preview and keeps the images in the object store under
// screenshots/{project}/{kind}/{YYYYMMDDTHHMMSSZ}_{desktop|mobile}.webp.
type Recorder struct {
	Capturer *Capturer
	Store    store.Store
	// PublicBase, when set, is the public origin (a CDN) the store's keys are served
	// under: a capture's URL is PublicBase + "/" + key.
	PublicBase string
	// URLTTL is how long a presigned URL stays valid. Default 7 days.
	URLTTL time.Duration
	Logger *slog.Logger
	// Now names captures; nil means time.Now.
	Now func() time.Time
}

// Stored is one image in the store.
type Stored struct {
	Key      string
	Viewport string // "desktop" or "mobile"
	Kind     string
	Time     time.Time
	Size     int64
	// URL is where a person (or a later tool) can fetch it: PublicBase + key, else a
	// presigned URL, else the directory store's file path.
	URL string
}

// Shoot captures both viewports of path on the preview origin base and stores them. The
// pair is returned even when storing fails (the error says so), so an agent still sees
// what it asked for.
func (r *Recorder) Shoot(ctx context.Context, base *url.URL, pagePath, project, kind string) (*Pair, []Stored, error) {
	if err := validProject(project); err != nil {
		return nil, nil, err
	}
	if kind != KindAgent && kind != KindAuto {
		return nil, nil, fmt.Errorf("screenshot: unknown kind %q", kind)
	}
	pair, err := r.Capturer.CapturePair(ctx, base, pagePath)
	if err != nil {
		return nil, nil, err
	}
	stored, err := r.store(ctx, pair, project, kind)
	return pair, stored, err
}

func (r *Recorder) now() time.Time {
	if r.Now != nil {
		return r.Now().UTC()
	}
	return time.Now().UTC()
}

func (r *Recorder) log() *slog.Logger {
	if r.Logger != nil {
		return r.Logger
	}
	return slog.Default()
}

// Prefix is where a project's captures of one kind live.
func Prefix(project, kind string) string { return storekeys.Screenshots(project, kind) }

func (r *Recorder) store(ctx context.Context, pair *Pair, project, kind string) ([]Stored, error) {
	now := r.now()
	stamp := now.Format("20060102T150405Z")
	put := func(name string, shot *Shot) (Stored, error) {
		key := Prefix(project, kind) + name + "_" + shot.Viewport.Name + ".webp"
		info, err := r.Store.Put(ctx, key, bytes.NewReader(shot.WebP), store.PutOptions{
			Size: int64(len(shot.WebP)), ContentType: "image/webp", IfNotExists: true,
			Metadata: map[string]string{"viewport": fmt.Sprintf("%dx%d", shot.Viewport.Width, shot.Viewport.Height)},
		})
		if err != nil {
			return Stored{Key: key}, err
		}
		st := Stored{Key: key, Viewport: shot.Viewport.Name, Kind: kind, Time: now, Size: info.Size}
		if st.URL, err = r.URL(ctx, key); err != nil {
			r.log().Warn("screenshot: no URL for stored capture", "key", key, "err", err)
		}
		return st, nil
	}
	// Two captures in the same second never overwrite each other: the desktop image is
	// written only if absent, and a taken name moves on to the next suffix (_01, _02...),
	// which still sorts after the plain stamp.
	name := stamp
	var desktop Stored
	for seq := 1; ; seq++ {
		var err error
		desktop, err = put(name, &pair.Desktop)
		if err == nil {
			break
		}
		if !errors.Is(err, store.ErrExists) || seq > 99 {
			return nil, fmt.Errorf("screenshot: store %s: %w", desktop.Key, err)
		}
		name = fmt.Sprintf("%s_%02d", stamp, seq)
	}
	mobile, err := put(name, &pair.Mobile)
	if err != nil {
		return []Stored{desktop}, fmt.Errorf("screenshot: store %s: %w", mobile.Key, err)
	}
	r.log().Info("screenshot: stored", "project", project, "kind", kind, "desktop", desktop.Key,
		"bytes", desktop.Size+mobile.Size, "took", pair.Elapsed)
	return []Stored{desktop, mobile}, nil
}

// URL returns where a stored key can be fetched.
func (r *Recorder) URL(ctx context.Context, key string) (string, error) {
	if r.PublicBase != "" {
		return strings.TrimRight(r.PublicBase, "/") + "/" + key, nil
	}
	u, ok := r.Store.(store.URLer)
	if !ok {
		return "", errors.New("the store cannot make URLs and no public base is configured")
	}
	ttl := r.URLTTL
	if ttl <= 0 {
		ttl = 7 * 24 * time.Hour
	}
	return u.URL(ctx, key, ttl)
}

// List returns a project's stored captures of one kind ("" for both), newest first.
func (r *Recorder) List(ctx context.Context, project, kind string) ([]Stored, error) {
	if err := validProject(project); err != nil {
		return nil, err
	}
	kinds := []string{KindAgent, KindAuto}
	if kind != "" {
		kinds = []string{kind}
	}
	var out []Stored
	for _, k := range kinds {
		objs, err := store.ListAll(ctx, r.Store, Prefix(project, k))
		if err != nil {
			return nil, fmt.Errorf("screenshot: list %s: %w", Prefix(project, k), err)
		}
		for _, o := range objs {
			name := strings.TrimSuffix(path.Base(o.Key), ".webp")
			stamp, _, ok := strings.Cut(name, "_")
			if !ok {
				continue
			}
			t, _ := time.Parse("20060102T150405Z", stamp)
			s := Stored{Key: o.Key, Viewport: name[strings.LastIndexByte(name, '_')+1:], Kind: k, Time: t, Size: o.Size}
			s.URL, _ = r.URL(ctx, o.Key)
			out = append(out, s)
		}
	}
	// Newest first across kinds: by stamp, then by same-second suffix (_01 after none).
	slices.SortStableFunc(out, func(a, b Stored) int { return strings.Compare(captureOrder(b.Key), captureOrder(a.Key)) })
	return out, nil
}

func validProject(id string) error {
	if err := storekeys.ValidProject(id); err != nil {
		return fmt.Errorf("screenshot: %w", err)
	}
	return nil
}

// captureOrder is a key's name rewritten to sort by time: "STAMP_desktop.webp" becomes
// "STAMP_00_desktop", "STAMP_01_mobile.webp" stays "STAMP_01_mobile".
func captureOrder(key string) string {
	name := strings.TrimSuffix(path.Base(key), ".webp")
	stamp, rest, _ := strings.Cut(name, "_")
	if len(rest) < 3 || rest[2] != '_' || rest[0] < '0' || rest[0] > '9' {
		rest = "00_" + rest
	}
	return stamp + "_" + rest
}
