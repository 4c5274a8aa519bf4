package mcpserve_test

// The built-in providers and stores, which the tests use: the root package registers none.
import _ "github.com/toolhost/toolhost/modules/standard"
