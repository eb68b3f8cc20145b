// Package tlsconfig builds the TLS configurations of jobfence's listeners
// (--tls-cert, --tls-key) and of its clients (--tls-ca): the agent calling
// the server and the server calling agents. Certificates are read once at
// start; rotating them means restarting the process.
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// Server returns a listener configuration serving the certificate chain in
// certFile with the key in keyFile, TLS 1.2 or later.
func Server(certFile, keyFile string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("tls: both a certificate file and a key file are required")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		// LoadX509KeyPair never puts key material in its errors.
		return nil, fmt.Errorf("tls: load key pair: %w", err)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
	}, nil
}

// Client returns a client configuration, TLS 1.2 or later, that trusts the
// CA certificates in caFile, or the system pool when caFile is empty.
func Client(caFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile == "" {
		return cfg, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("tls: read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls: %s holds no PEM certificate", caFile)
	}
	cfg.RootCAs = pool
	return cfg, nil
}
