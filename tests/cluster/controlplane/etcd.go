package main

// etcd, embedded: one member on loopback, its data under DIR/etcd.

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

type etcdServer struct {
	server *embed.Etcd
	once   *sync.Once
}

func (e etcdServer) ClientURL() string { return "http://" + e.server.Clients[0].Addr().String() }

// Close stops etcd; it may be called again (run closes it on the way out, and defers a Close
// for the early returns): embed.Etcd's own Close closes a channel, and a second one panics.
func (e etcdServer) Close() { e.once.Do(e.server.Close) }

func startEtcd(dataDir string) (etcdServer, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return etcdServer{}, err
	}
	config := embed.NewConfig()
	config.Name = "kube-testcluster"
	config.Dir = dataDir
	// Free ports, named: etcd dials its own advertised client address, so it cannot be port 0.
	client, err := freeURL()
	if err != nil {
		return etcdServer{}, err
	}
	peer, err := freeURL()
	if err != nil {
		return etcdServer{}, err
	}
	config.ListenClientUrls = []url.URL{client}
	config.AdvertiseClientUrls = []url.URL{client}
	config.ListenPeerUrls = []url.URL{peer}
	config.AdvertisePeerUrls = []url.URL{peer}
	config.InitialCluster = config.InitialClusterFromName(config.Name)
	config.LogLevel = "error"
	// A test cluster: its data need not survive a power cut, and fsync on a shared disk costs
	// every write tens of milliseconds.
	config.UnsafeNoFsync = true
	server, err := embed.StartEtcd(config)
	if err != nil {
		return etcdServer{}, err
	}
	select {
	case <-server.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		server.Close()
		return etcdServer{}, fmt.Errorf("etcd was not ready within 60 s")
	case err := <-server.Err():
		server.Close()
		return etcdServer{}, err
	}
	return etcdServer{server, &sync.Once{}}, nil
}

// freeURL is a loopback address on a port free a moment ago (etcd opens it right after).
func freeURL() (url.URL, error) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return url.URL{}, err
	}
	defer listener.Close()
	return url.URL{Scheme: "http", Host: listener.Addr().String()}, nil
}

// listen opens the API server's port on 127.0.0.1 (port 0: a free one).
func listen(port int) (net.Listener, error) {
	listener, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return nil, fmt.Errorf("the API server's port: %w", err)
	}
	return listener, nil
}
