package dir

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/toolhost/toolhost/internal/module"
)

// The directory store as a module of toolhost's configuration (store.kind: dir, the
// default): its one key, store.dir.
func init() {
	module.RegisterStore(module.Store[Section]{
		Kind:   "dir",
		Prefix: "store.",
		Keys: []module.Key{{Name: "store.dir", Flag: "store-dir", Default: `"" (data_dir/store)`, HostPath: true,
			Usage: "directory store's root (default data_dir/store)",
			Doc:   `The directory store's root.`}},
		Config: func() *Section { return &Section{} },
		Validate: func(cfg *Section, _ module.Settings) error {
			if d := cfg.Dir; d != "" && strings.TrimSpace(d) == "" {
				return fmt.Errorf("config: store.dir: is blank")
			}
			return nil
		},
		Open: func(_ context.Context, cfg *Section, env module.Env) (module.Opened, error) {
			d := cfg.Dir
			if d == "" {
				d = filepath.Join(env.DataDir, "store")
			}
			abs, err := filepath.Abs(d)
			if err != nil {
				return module.Opened{}, fmt.Errorf("store.dir: %w", err)
			}
			st, err := New(abs)
			if err != nil {
				return module.Opened{}, fmt.Errorf("opening the directory store %s: %w", abs, err)
			}
			return module.Opened{Store: st, Where: abs, Close: st.Close}, nil
		},
	})
}

// Section is the directory store's key.
type Section struct {
	Dir string `key:"dir"`
}
