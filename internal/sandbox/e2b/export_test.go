package e2b

// SetPackInSandbox switches Archive between compressing in the sandbox and on the host,
// for the benchmarks that compare them; it returns a function restoring the default.
func SetPackInSandbox(on bool) (restore func()) {
	old := packInSandbox
	packInSandbox = on
	return func() { packInSandbox = old }
}
