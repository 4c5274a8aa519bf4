//go:build linux

package agent

// The sandbox's trust (envd.PathTrust): a sandbox on another machine than the host (a
// Kubernetes pod) cannot be given a CA bundle by a bind mount as a local one is, so the
// host gives its agent the certificates its TLS clients must trust besides the image's
// (sandbox.egress.ca_file, and the egress gateway's CA for the injected domains), and the
// agent writes them where the variables of envd.TrustEnv point, before any command runs
// (and again when another host takes the sandbox over with a CA of its own). The files
// are the sandbox's own (the same user writes them): they decide only what the sandbox
// trusts, never what the gateway sends, so a process that changes them harms itself alone.

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"

	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/tree"
)

// systemBundle is where the image's own CA bundle is, if it has one (Debian's path).
const systemBundle = "/etc/ssl/certs/ca-certificates.crt"

// handleTrust writes the trust a host gives (envd.TrustRequest).
func (s *Server) handleTrust(w http.ResponseWriter, r *http.Request) {
	var req envd.TrustRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, envd.MaxTrust+4<<10)).Decode(&req); err != nil {
		http.Error(w, "bad trust: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := checkPEM([]byte(req.PEM)); err != nil {
		http.Error(w, "bad trust: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := s.writeTrust([]byte(req.PEM)); err != nil {
		http.Error(w, "write the trust: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// checkPEM accepts one or more PEM certificates and nothing else, within envd.MaxTrust.
func checkPEM(b []byte) error {
	if len(b) > envd.MaxTrust {
		return fmt.Errorf("%d bytes of certificates (at most %d)", len(b), envd.MaxTrust)
	}
	n := 0
	for rest := b; len(bytes.TrimSpace(rest)) > 0; n++ {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil || blk.Type != "CERTIFICATE" {
			return errors.New("not a sequence of PEM certificates")
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			return fmt.Errorf("certificate %d: %w", n+1, err)
		}
	}
	if n == 0 {
		return errors.New("no certificate")
	}
	return nil
}

// writeTrust writes the extra certificates and the bundle (the image's, then them) into
// the trust directory, each replaced whole, never through a link.
func (s *Server) writeTrust(extra []byte) error {
	dir := s.cfg.TrustDir
	if dir == "" {
		dir = envd.TrustDir
	}
	system, err := os.ReadFile(systemBundle)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read the image's CA bundle: %w", err)
	}
	bundle := append(append(bytes.TrimRight(system, "\n"), '\n'), extra...)
	if len(system) == 0 {
		bundle = extra
	}
	parent, err := os.Open(filepath.Dir(dir))
	if err != nil {
		return err
	}
	defer parent.Close()
	d, err := tree.OpenDirAt(parent, filepath.Base(dir), true)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := tree.ReplaceAt(d, envd.TrustExtra, 0o644, bytes.NewReader(extra)); err != nil {
		return err
	}
	return tree.ReplaceAt(d, envd.TrustBundle, 0o644, bytes.NewReader(bundle))
}
