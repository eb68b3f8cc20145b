// Package etcdembed starts an etcd member inside the jobfence process, so a
// single server needs no external cluster. Its listeners bind 127.0.0.1 unless
// configured otherwise; the returned client talks to it directly.
package etcdembed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Config describes one embedded member.
type Config struct {
	// DataDir holds the member's WAL and snapshot; it survives restarts.
	DataDir string
	// Name is the member name; default "default".
	Name string
	// ClientURL and PeerURL are the listen (and advertised) URLs. Empty means
	// a free 127.0.0.1 port picked at start.
	ClientURL string
	PeerURL   string
	// InitialCluster is "name=peerURL,..." for a multi-member cluster; empty
	// means a single member made of this one.
	InitialCluster string
	// ClusterState is "new" (default) or "existing".
	ClusterState string
	// QuotaBackendBytes caps the backend size; 0 keeps etcd's default.
	QuotaBackendBytes int64
	// UnsafeNoFsync trades durability for speed; for tests only.
	UnsafeNoFsync bool
	// StartTimeout bounds how long Start waits for the member to be ready
	// (default 30s).
	StartTimeout time.Duration
	// Logger receives etcd's own logs; nil discards them.
	Logger *zap.Logger
}

// Server is a running embedded member.
type Server struct {
	etcd   *embed.Etcd
	Client *clientv3.Client
	// Endpoint is the client URL the member serves.
	Endpoint string
}

// Start runs the member and returns it with a connected client.
func Start(cfg Config) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("etcdembed: data dir is required")
	}
	ec := embed.NewConfig()
	ec.Dir = cfg.DataDir
	if cfg.Name != "" {
		ec.Name = cfg.Name
	}
	clientURL, err := resolveURL(cfg.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("etcdembed: client url: %w", err)
	}
	peerURL, err := resolveURL(cfg.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("etcdembed: peer url: %w", err)
	}
	ec.ListenClientUrls = []url.URL{*clientURL}
	ec.AdvertiseClientUrls = []url.URL{*clientURL}
	ec.ListenPeerUrls = []url.URL{*peerURL}
	ec.AdvertisePeerUrls = []url.URL{*peerURL}
	if cfg.InitialCluster != "" {
		ec.InitialCluster = cfg.InitialCluster
	} else {
		ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	}
	if cfg.ClusterState != "" {
		ec.ClusterState = cfg.ClusterState
	}
	ec.QuotaBackendBytes = cfg.QuotaBackendBytes
	ec.UnsafeNoFsync = cfg.UnsafeNoFsync
	lg := cfg.Logger
	if lg == nil {
		lg = zap.NewNop()
	}
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	ec.LogLevel = "error"
	timeout := cfg.StartTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}

	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("etcdembed: start: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcdembed: start: %w", err)
	case <-time.After(timeout):
		e.Close()
		return nil, errors.New("etcdembed: member not ready before the start timeout")
	}
	endpoint := clientURL.String()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("etcdembed: client: %w", err)
	}
	// One round trip proves the client reaches the member before callers rely on it.
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if _, err := cli.Get(ctx, "health-probe"); err != nil {
		cli.Close()
		e.Close()
		return nil, fmt.Errorf("etcdembed: first request: %w", err)
	}
	return &Server{etcd: e, Client: cli, Endpoint: endpoint}, nil
}

// Close stops the client and then the member.
func (s *Server) Close() error {
	cerr := s.Client.Close()
	s.etcd.Close()
	if cerr != nil && !errors.Is(cerr, context.Canceled) {
		return cerr
	}
	return nil
}

// Err reports a fatal member error after start.
func (s *Server) Err() <-chan error { return s.etcd.Err() }

// resolveURL parses u, or picks a free loopback port when u is empty. The
// port is released before etcd binds it; on a loopback-only test machine the
// window in which another process could take it is harmless in practice.
func resolveURL(u string) (*url.URL, error) {
	if u == "" {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		addr := l.Addr().String()
		if err := l.Close(); err != nil {
			return nil, err
		}
		u = "http://" + addr
	}
	parsed, err := url.Parse(u)
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(parsed.Scheme, "http") {
		return nil, fmt.Errorf("unsupported scheme %q", parsed.Scheme)
	}
	return parsed, nil
}
