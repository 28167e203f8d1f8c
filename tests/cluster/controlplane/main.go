// kube-testcluster: Kubernetes' own control plane for jupyter-gpushare's tests, in one process.
//
// It runs kube-apiserver (with an embedded etcd), kube-scheduler and kube-controller-manager,
// built from k8s.io/kubernetes at the version go.mod pins, on loopback. Each component is
// configured through its own command-line flags (components.go), the way an administrator
// configures it, and started through its cmd/*/app package. Everything it needs lives in --dir:
// the certificates it generates (pki.go), etcd's data, and a kubeconfig per identity. Nothing
// of the node side runs in this process: tests/cluster/ in Python plays the simulated nodes, and
// starts the real node's kubelet as another process of this binary.
//
// Usage: kube-testcluster --dir DIR [--port N] [--apiserver-arg=--flag=value ...]
//
// It is also the kubelet of the same version (kubelet.go): `kube-testcluster kubelet ARGS...`.
//
// It is also kubectl of the same version (kubectl.go): invoked through a symlink named kubectl,
// or as `kube-testcluster kubectl ARGS...`.
//
// Ready when DIR/admin.kubeconfig exists and the API server's /readyz answers ok; stops on
// SIGINT or SIGTERM (or when its parent process dies, see --parent-pid), leaving DIR in place
// so that a restart with the same DIR and port finds its data and certificates again.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// repeated collects a flag given several times.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, " ") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

func main() {
	if args, ok := kubectlArguments(os.Args); ok {
		runKubectl(args) // before the control plane's flags: kubectl parses its own
	}
	if args, ok := kubeletArguments(os.Args); ok {
		runKubelet(args) // likewise
	}
	var (
		dir            = flag.String("dir", "", "directory for certificates, etcd data and kubeconfigs (created if missing)")
		port           = flag.Int("port", 0, "the API server's port on 127.0.0.1 (0: a free one)")
		parentPID      = flag.Int("parent-pid", 0, "stop when this process is gone (the test run that started us)")
		printVersion   = flag.Bool("version", false, "print the Kubernetes version and exit")
		apiserverArgs  repeated
		schedulerArgs  repeated
		controllerArgs repeated
	)
	flag.Var(&apiserverArgs, "apiserver-arg", "an extra kube-apiserver flag (repeatable), e.g. --apiserver-arg=--etcd-compaction-interval=10s")
	flag.Var(&schedulerArgs, "scheduler-arg", "an extra kube-scheduler flag (repeatable)")
	flag.Var(&controllerArgs, "controller-manager-arg", "an extra kube-controller-manager flag (repeatable)")
	klog.InitFlags(nil) // -v=N and friends, for all three components
	flag.Parse()
	if *printVersion {
		fmt.Println(kubernetesVersion())
		return
	}
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "kube-testcluster: --dir is required (where certificates, etcd data and kubeconfigs go)")
		os.Exit(2)
	}
	if err := run(*dir, *port, *parentPID, extraArgs{apiserverArgs, schedulerArgs, controllerArgs}); err != nil {
		fmt.Fprintf(os.Stderr, "kube-testcluster: %v\n", err)
		os.Exit(1)
	}
}

// extraArgs are flags a test adds to one component (e.g. a short etcd compaction interval).
type extraArgs struct{ apiserver, scheduler, controllerManager []string }

func run(dir string, port, parentPID int, extra extraArgs) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if parentPID > 0 {
		ctx = stopWhenGone(ctx, parentPID)
	}

	listener, err := listen(port)
	if err != nil {
		return err
	}
	server := fmt.Sprintf("https://%s", listener.Addr().String())
	pki, err := ensurePKI(dir)
	if err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	etcd, err := startEtcd(filepath.Join(dir, "etcd"))
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer etcd.Close()

	controllerManager, err := newControllerManager() // first: see its comment
	if err != nil {
		return err
	}
	gates, err := featureGates()
	if err != nil {
		return err
	}
	components := newComponents(ctx)
	components.start("kube-apiserver", func(ctx context.Context) error {
		return runAPIServer(ctx, listener, etcd.ClientURL(), pki, gates, extra.apiserver)
	})
	// The other components and the tests wait for the API server; the kubeconfigs say where it
	// is only once it answers, so a test that sees admin.kubeconfig can talk to it.
	if err := waitForAPIServer(ctx, server, pki, components.failed()); err != nil {
		components.stop()
		if components.err != nil {
			return components.err
		}
		return err
	}
	for _, identity := range []identity{schedulerIdentity, controllerManagerIdentity} {
		if err := writeKubeconfig(dir, server, pki, identity); err != nil {
			components.stop()
			return err
		}
	}
	components.start("kube-scheduler", func(ctx context.Context) error {
		return runScheduler(ctx, dir, extra.scheduler)
	})
	components.start("kube-controller-manager", func(ctx context.Context) error {
		return controllerManager.run(ctx, dir, pki, extra.controllerManager)
	})
	if err := writeKubeconfig(dir, server, pki, adminIdentity); err != nil {
		components.stop()
		return err
	}
	klog.Infof("kube-testcluster %s: the API server is at %s; admin kubeconfig %s",
		kubernetesVersion(), server, filepath.Join(dir, adminIdentity.kubeconfig))

	err = components.wait()
	stopped := make(chan struct{})
	go func() { etcd.Close(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		klog.Warning("etcd did not stop within 10 s")
	}
	return err
}

// stopWhenGone cancels the returned context once process pid has gone (the run that started
// us was killed): a test run that dies leaves no control plane behind.
func stopWhenGone(parent context.Context, pid int) context.Context {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		defer cancel()
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			if syscall.Kill(pid, 0) == syscall.ESRCH {
				klog.Infof("process %d is gone: stopping", pid)
				return
			}
		}
	}()
	return ctx
}
