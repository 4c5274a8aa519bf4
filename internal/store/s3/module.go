package s3

import (
	"context"
	"fmt"
	"net/url"

	"github.com/toolhost/toolhost/internal/module"
)

// S3 and S3-compatible stores as a module of toolhost's configuration (store.kind: s3):
// the store.s3.* keys.
func init() {
	module.RegisterStore(module.Store[Section]{
		Kind:     "s3",
		Prefix:   "store.s3.",
		Sections: []module.Section{{Name: "store.s3"}},
		Keys:     keys,
		Config:   func() *Section { return &Section{Checksums: "when_supported"} },
		Validate: func(cfg *Section, s module.Settings) error { return cfg.Validate(s.StoreKind == "s3") },
		Open: func(ctx context.Context, s *Section, env module.Env) (module.Opened, error) {
			st, err := New(ctx, Config{
				Bucket:               s.Bucket,
				Region:               s.Region,
				Endpoint:             s.Endpoint,
				PathStyle:            s.PathStyle,
				ChecksumWhenRequired: s.Checksums == "when_required",
				CreateBucket:         s.CreateBucket,
				Logger:               env.Logger,
			})
			if err != nil {
				return module.Opened{}, fmt.Errorf("store s3://%s: %w", s.Bucket, err)
			}
			return module.Opened{Store: st, Where: "s3://" + s.Bucket, Shared: true}, nil
		},
	})
}

// Section is the store.s3.* keys.
type Section struct {
	Bucket       string `key:"bucket"`
	Region       string `key:"region"`
	Endpoint     string `key:"endpoint"`
	PathStyle    bool   `key:"path_style"`
	CreateBucket bool   `key:"create_bucket"`
	Checksums    string `key:"checksums"`
}

// Validate checks the keys; chosen says whether store.kind is s3 (the bucket is then
// required).
func (s *Section) Validate(chosen bool) error {
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("config: %s: %s", key, fmt.Sprintf(format, args...))
	}
	if chosen && s.Bucket == "" {
		return bad("store.s3.bucket", "is required when store.kind is s3")
	}
	if e := s.Endpoint; e != "" {
		if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("store.s3.endpoint", "must be an http or https URL, got %q", e)
		}
	}
	switch s.Checksums {
	case "when_supported", "when_required":
	default:
		return bad("store.s3.checksums", "must be \"when_supported\" or \"when_required\", got %q", s.Checksums)
	}
	return nil
}

var keys = []module.Key{
	{Name: "store.s3.bucket", Flag: "s3-bucket",
		Usage: "S3 bucket (store s3)",
		Doc:   `Required when kind is s3.`},
	{Name: "store.s3.region", Flag: "s3-region", Default: `"" (the AWS SDK's, else us-east-1)`,
		Usage: "S3 region (default: the AWS SDK's, else us-east-1)",
		Doc:   `The region of the bucket; by default the SDK's (AWS_REGION, ~/.aws/config).`},
	{Name: "store.s3.endpoint", Flag: "s3-endpoint", Default: `"" (AWS)`,
		Usage: "S3-compatible endpoint URL (default: AWS)",
		Doc:   `An S3-compatible endpoint such as http://127.0.0.1:7070, instead of AWS.`},
	{Name: "store.s3.path_style", Flag: "s3-path-style",
		Usage: "address buckets as endpoint/bucket (most S3-compatible servers)",
		Doc:   `Address buckets as endpoint/bucket/key (most S3-compatible servers need it).`},
	{Name: "store.s3.create_bucket", Flag: "s3-create-bucket",
		Usage: "create the bucket when a request finds it missing",
		Doc: `Create the bucket the first time a request finds it missing (a new S3-compatible
server, a test). Off, a missing bucket fails with one line that names it and says how to
fix it.`},
	{Name: "store.s3.checksums", Flag: "s3-checksums",
		Usage: "request checksums: when_supported or when_required",
		Doc: `when_supported (the SDK's default) or when_required, for S3-compatible stores that
refuse the newer checksum headers.`},
}
