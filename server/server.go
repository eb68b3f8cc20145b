package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-json-experiment/json"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"jobfence"
	"jobfence/handlers"
	"jobfence/internal/etcdembed"
	"jobfence/internal/metrics"
	"jobfence/internal/store"
	"jobfence/internal/tlsconfig"
)

// Server is one jobfence replica. Build it with New, start it with Run.
type Server struct {
	cfg     Config
	auth    *handlers.Auth
	metrics *metrics.Server
	// listenTLS serves the HTTP listener (nil: plain HTTP); agentTLS is what
	// the dispatcher's agent client verifies agents with (nil: system roots).
	listenTLS, agentTLS *tls.Config

	started chan struct{}
	mu      sync.Mutex
	addr    string
	client  *clientv3.Client
	store   *store.Store
	leader  leaderState
}

// New checks cfg (defaults applied) and the tokens file; nothing is started.
func New(cfg Config) (*Server, error) {
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("server config: %w", err)
	}
	auth, err := handlers.LoadTokens(cfg.TokensFile)
	if err != nil {
		return nil, err
	}
	// LoadTokens accepted the file, so it reads and decodes here too.
	if raw, err := os.ReadFile(cfg.TokensFile); err == nil {
		var entries []handlers.TokenEntry
		if json.Unmarshal(raw, &entries) == nil {
			for _, e := range entries {
				cfg.Redactor.Add(e.Token)
			}
		}
	}
	s := &Server{cfg: cfg, auth: auth, metrics: metrics.NewServer(), started: make(chan struct{})}
	if cfg.TLSCert != "" {
		if s.listenTLS, err = tlsconfig.Server(cfg.TLSCert, cfg.TLSKey); err != nil {
			return nil, err
		}
	}
	if cfg.TLSCA != "" {
		if s.agentTLS, err = tlsconfig.Client(cfg.TLSCA); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// AgentTLS is the client configuration agents' certificates are verified
// with (--tls-ca); nil means the system roots.
func (s *Server) AgentTLS() *tls.Config { return s.agentTLS }

// UseTLS makes the client verify agents' certificates with cfg (from
// --tls-ca); nil keeps the system roots.
func (h *HTTPAgentClient) UseTLS(cfg *tls.Config) {
	if cfg == nil || h == nil || h.c == nil || h.c.HTTP == nil {
		return
	}
	if tr, ok := h.c.HTTP.Transport.(*http.Transport); ok {
		tr.TLSClientConfig = cfg.Clone()
	}
}

// Started is closed once the HTTP listener is bound (Addr is then valid).
func (s *Server) Started() <-chan struct{} { return s.started }

// Addr is the bound HTTP address.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Store is the running store (nil before Started); tests drive transitions
// through it.
func (s *Server) Store() *store.Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.store
}

// Client is the etcd client in use (nil before Started).
func (s *Server) Client() *clientv3.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.client
}

// connect starts the embedded member or dials the external cluster. The
// returned close stops whichever it was.
func (s *Server) connect() (*clientv3.Client, <-chan error, func() error, error) {
	if len(s.cfg.EtcdEndpoints) == 0 {
		dir := filepath.Join(s.cfg.DataDir, "etcd")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, nil, nil, fmt.Errorf("data dir: %w", err)
		}
		e, err := etcdembed.Start(etcdembed.Config{
			DataDir:           dir,
			Name:              s.cfg.EtcdName,
			PeerURL:           s.cfg.EtcdPeerURL,
			ClientURL:         s.cfg.EtcdClientURL,
			InitialCluster:    s.cfg.EtcdInitialCluster,
			ClusterState:      s.cfg.EtcdClusterState,
			QuotaBackendBytes: s.cfg.EtcdQuotaBackendBytes,
			// A member of a cluster waits for a quorum of its peers, which
			// may start well after it.
			StartTimeout: embedStartTimeout(s.cfg),
		})
		if err != nil {
			return nil, nil, nil, err
		}
		return e.Client, e.Err(), e.Close, nil
	}
	tlsCfg, err := s.tlsConfig()
	if err != nil {
		return nil, nil, nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   s.cfg.EtcdEndpoints,
		DialTimeout: 5 * time.Second,
		TLS:         tlsCfg,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("etcd client: %w", err)
	}
	return cli, nil, cli.Close, nil
}

func (s *Server) tlsConfig() (*tls.Config, error) {
	if s.cfg.EtcdCA == "" && s.cfg.EtcdCert == "" {
		return nil, nil
	}
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.cfg.EtcdCA != "" {
		pem, err := os.ReadFile(s.cfg.EtcdCA)
		if err != nil {
			return nil, fmt.Errorf("etcd-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("etcd-ca %s: no PEM certificate", s.cfg.EtcdCA)
		}
		t.RootCAs = pool
	}
	if s.cfg.EtcdCert != "" {
		cert, err := tls.LoadX509KeyPair(s.cfg.EtcdCert, s.cfg.EtcdKey)
		if err != nil {
			return nil, fmt.Errorf("etcd-cert/etcd-key: %w", err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}

// Run serves until ctx ends or a part fails, then shuts down in this order:
//  0. revoke the replica registry lease, so other replicas stop listing it;
//  1. stop accepting and end event streams, so no new write starts;
//  2. drain in-flight requests (bounded by ShutdownTimeout), so an admitted
//     job's 201 is not cut off;
//  3. stop the leader hook and resign, so another replica takes over at
//     once instead of after the election TTL;
//  4. stop the read model;
//  5. close etcd (the embedded member last, after its last client).
func (s *Server) Run(ctx context.Context) (err error) {
	cfg := s.cfg
	lg := cfg.Logger

	cli, etcdErr, closeEtcd, err := s.connect()
	if err != nil {
		return err
	}
	defer func() {
		if cerr := closeEtcd(); cerr != nil {
			lg.Warn("etcd_close_failed", "err", cerr.Error())
		}
	}()

	st, err := store.New(store.Config{
		Client:        cli,
		Prefix:        cfg.Prefix,
		QuotaGlobal:   cfg.QuotaGlobal,
		QuotaPerScope: cfg.QuotaPerScope,
		Defaults:      cfg.Defaults,
		ReplicaID:     cfg.ReplicaID,
		Now:           cfg.Now,
		Logger:        lg.With("component", "store"),
		OnTransition:  transitionCounter(s.metrics),
	})
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}

	listener := cfg.Listener
	if listener == nil {
		listener, err = net.Listen("tcp", cfg.Listen)
		if err != nil {
			return fmt.Errorf("listen: %w", err)
		}
	}
	if s.listenTLS != nil {
		listener = tls.NewListener(listener, s.listenTLS)
	}

	s.metrics.SetSnapshot(snapshot(st))
	s.metrics.SetLeader(false)
	api := handlers.New(handlers.Config{
		Store:      st,
		Auth:       s.auth,
		Logger:     lg.With("component", "http"),
		Defaults:   cfg.Defaults,
		ReplicaID:  cfg.ReplicaID,
		Leader:     s.leader.get,
		Ready:      st.Ping,
		OpenAPI:    jobfence.OpenAPI,
		Registry:   s.metrics.Registry(),
		Admissions: s.metrics,
	})
	advertise := advertiseURL(cfg.AdvertiseURL, listener.Addr().String(), s.listenTLS != nil)
	reg, err := store.NewReplicaRegistration(cli, cfg.Prefix,
		store.ReplicaInfo{ID: cfg.ReplicaID, URL: advertise, StartedAt: cfg.Now().UTC()},
		cfg.ElectionTTL, lg.With("component", "registry"))
	if err != nil {
		return fmt.Errorf("replica registry: %w", err)
	}
	peerTLS := s.agentTLS
	if peerTLS == nil {
		peerTLS, _ = tlsconfig.Client("")
	}
	peers := newReplicaPeers(cfg.ReplicaID, st.Replicas, peerTLS)
	defer peers.client.CloseIdleConnections()
	var dash interface{ CloseStreams() }
	if !cfg.NoDashboard {
		d := dashboard(cfg, api, peers)
		api.Web, api.Events, dash = d, d.Events(), d
	}
	srv := &http.Server{
		Handler:           api.Routes(),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		// net/http's own complaints (bad requests, handshake failures) go to
		// the injected logger, not the process's default log.
		ErrorLog: log.New(httpErrorLog{lg}, "", 0),
	}

	s.mu.Lock()
	s.addr = listener.Addr().String()
	s.client = cli
	s.store = st
	s.mu.Unlock()

	// fail carries the first part that stops on its own.
	fail := make(chan error, 4)

	storeCtx, stopStore := context.WithCancel(context.Background())
	storeDone := make(chan struct{})
	go func() {
		defer close(storeDone)
		if err := st.Run(storeCtx); err != nil && storeCtx.Err() == nil {
			fail <- fmt.Errorf("read model: %w", err)
		}
	}()

	leadCtx, stopLeading := context.WithCancel(context.Background())
	leadDone := make(chan struct{})
	go func() {
		defer close(leadDone)
		if err := s.lead(leadCtx, cli, st); err != nil && leadCtx.Err() == nil {
			fail <- fmt.Errorf("election: %w", err)
		}
	}()

	// Listed before serving, so a started replica is on the others'
	// overviews and an idle cluster's revision stands still from here.
	regStart, cancelRegStart := context.WithTimeout(context.Background(), 5*time.Second)
	if err := reg.Register(regStart); err != nil {
		lg.Warn("replica_register_failed", "replica_id", cfg.ReplicaID, "err", err.Error())
	}
	cancelRegStart()
	regCtx, stopRegistration := context.WithCancel(context.Background())
	regDone := make(chan struct{})
	go func() {
		defer close(regDone)
		_ = reg.Run(regCtx)
	}()

	serveDone := make(chan struct{})
	go func() {
		defer close(serveDone)
		if err := srv.Serve(listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fail <- fmt.Errorf("http: %w", err)
		}
	}()
	close(s.started)
	lg.Info("server_started", "addr", s.addr, "replica_id", cfg.ReplicaID, "embedded_etcd", len(cfg.EtcdEndpoints) == 0,
		"tls", s.listenTLS != nil)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-fail:
	case e := <-etcdErr:
		runErr = fmt.Errorf("embedded etcd: %w", e)
	}
	if runErr != nil {
		lg.Error("server_failed", "err", runErr.Error())
	}

	// 0: leave the replica registry, so the other overviews stop asking.
	stopRegistration()
	<-regDone
	// 1 + 2: stop accepting, end streams, drain.
	api.CloseStreams()
	if dash != nil {
		dash.CloseStreams()
	}
	drainCtx, cancelDrain := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	if err := srv.Shutdown(drainCtx); err != nil {
		lg.Warn("http_drain_incomplete", "err", err.Error())
		_ = srv.Close()
	}
	cancelDrain()
	<-serveDone
	// 3: leader hook stops, then resign.
	stopLeading()
	<-leadDone
	// 4: read model.
	stopStore()
	<-storeDone
	lg.Info("server_stopped", "replica_id", cfg.ReplicaID)
	// 5: etcd closes in the deferred closeEtcd.
	return runErr
}

// httpErrorLog turns net/http's free-text complaints into one constant
// message with the text as an attribute.
type httpErrorLog struct{ lg *slog.Logger }

func (h httpErrorLog) Write(p []byte) (int, error) {
	h.lg.Warn("http_server_error", "detail", strings.TrimSpace(string(p)))
	return len(p), nil
}

// embedStartTimeout is how long the embedded member may wait to be ready: a
// member of a multi-member cluster needs its peers up.
func embedStartTimeout(cfg Config) time.Duration {
	if cfg.EtcdInitialCluster != "" && strings.Contains(cfg.EtcdInitialCluster, ",") {
		return 5 * time.Minute
	}
	return 0
}
