// Package standard registers toolhost's built-in modules: the sandbox providers local
// (bubblewrap, Linux), e2b and kubernetes, and the object stores dir and s3. Import it for
// its side effect, beside the root package or package cli:
//
//	import _ "github.com/toolhost/toolhost/modules/standard"
//
// The root package registers no module itself, so a program chooses what it links: this
// package for the built-ins, a module of its own (toolhost.RegisterProvider or
// RegisterStore from its init function), or both. cmd/toolhost is cli.Main with this
// package imported; docs/ARCHITECTURE.md ("A custom build") shows one with a third-party
// provider beside it.
package standard

import (
	_ "github.com/toolhost/toolhost/internal/sandbox/e2b"
	_ "github.com/toolhost/toolhost/internal/sandbox/kubernetes"
	_ "github.com/toolhost/toolhost/internal/sandbox/local"
	_ "github.com/toolhost/toolhost/internal/store/dir"
	_ "github.com/toolhost/toolhost/internal/store/s3"
)
