package main

// The three components, each configured by the flags its own command takes and started through
// its cmd/*/app package, as the kube-apiserver, kube-scheduler and kube-controller-manager
// binaries start them.

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	apiserveroptions "k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	controllermanageroptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	scheduleroptions "k8s.io/kubernetes/cmd/kube-scheduler/app/options"
)

const (
	serviceRange = "10.96.0.0/16"
	serviceIP    = "10.96.0.1" // the kubernetes Service's address: the first of serviceRange
	issuer       = "https://kubernetes.default.svc.cluster.local"
)

// schedulerNames: one kube-scheduler profile per scheduler a preset names (presets.py), so that
// a HAMi, Volcano or KAI pod is placed by the real scheduler's plugins too.
var schedulerNames = []string{"default-scheduler", "hami-scheduler", "volcano", "kai-scheduler"}

func parse(named cliflag.NamedFlagSets, args []string) error {
	fs := pflag.NewFlagSet("component", pflag.ContinueOnError)
	for _, set := range named.FlagSets {
		fs.AddFlagSet(set)
	}
	return fs.Parse(args)
}

func runAPIServer(ctx context.Context, listener net.Listener, etcdURL string, p pkiFiles, gates string, extra []string) error {
	s := apiserveroptions.NewServerRunOptions()
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--tls-cert-file=" + p.path("apiserver.crt"),
		"--tls-private-key-file=" + p.path("apiserver.key"),
		"--client-ca-file=" + p.path("ca.crt"),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=" + issuer,
		"--service-account-key-file=" + p.path("sa.pub"),
		"--service-account-signing-key-file=" + p.path("sa.key"),
		"--service-cluster-ip-range=" + serviceRange,
		"--kubelet-client-certificate=" + p.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + p.path("apiserver-kubelet-client.key"),
		// The simulated kubelets serve pod logs with certificates from the cluster's CA.
		"--kubelet-certificate-authority=" + p.path("ca.crt"),
		// A node's address, not its name: nothing resolves node names here (the real node's
		// kubelet serves on its InternalIP, tests/cluster/real_node.py).
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		// One API server on loopback: no endpoints to reconcile for the kubernetes Service.
		"--endpoint-reconciler-type=none",
		"--advertise-address=127.0.0.1",
		"--profiling=false",
		// On SIGTERM, drain the requests in flight, then give the open watches (a kubelet's
		// among them) 2 s to go, not the 60 s of the request timeout: a test cluster stops in
		// seconds with a real node attached.
		"--shutdown-send-retry-after=true",
		"--feature-gates=" + gates,
	}
	if err := parse(s.Flags(), append(args, extra...)); err != nil {
		return fmt.Errorf("flags: %w", err)
	}
	if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return err
	}
	s.SecureServing.Listener = listener
	s.SecureServing.BindPort = listener.Addr().(*net.TCPAddr).Port
	completed, err := s.Complete(ctx)
	if err != nil {
		return err
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return utilerrors.NewAggregate(errs)
	}
	return apiserver.Run(ctx, completed)
}

func runScheduler(ctx context.Context, dir string, extra []string) error {
	config := filepath.Join(dir, "scheduler-config.yaml")
	if err := os.WriteFile(config, []byte(schedulerConfig(filepath.Join(dir, schedulerIdentity.kubeconfig))), 0o600); err != nil {
		return err
	}
	opts := scheduleroptions.NewOptions()
	// --secure-port=0: no serving of its own (health and metrics); the tests watch what it does.
	args := []string{"--config=" + config, "--secure-port=0"}
	if err := parse(*opts.Flags, append(args, extra...)); err != nil {
		return fmt.Errorf("flags: %w", err)
	}
	completed, sched, err := scheduler.Setup(ctx, opts)
	if err != nil {
		return err
	}
	return scheduler.Run(ctx, completed, sched)
}

func schedulerConfig(kubeconfig string) string {
	var profiles strings.Builder
	for _, name := range schedulerNames {
		fmt.Fprintf(&profiles, "  - schedulerName: %s\n", name)
	}
	return fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %s
leaderElection:
  leaderElect: false
profiles:
%s`, kubeconfig, profiles.String())
}

// controllerManager holds kube-controller-manager's options from before any other component
// parses a flag: making its flags turns on the WatchListClient gate by default, which feature
// gates allow only until some flag set holds them.
type controllerManager struct {
	options                *controllermanageroptions.KubeControllerManagerOptions
	flags                  cliflag.NamedFlagSets
	all, disabledByDefault []string
	aliases                map[string]string
}

func newControllerManager() (*controllerManager, error) {
	s, err := controllermanageroptions.NewKubeControllerManagerOptions()
	if err != nil {
		return nil, err
	}
	c := &controllerManager{
		options:           s,
		all:               controllermanager.KnownControllers(),
		disabledByDefault: controllermanager.ControllersDisabledByDefault(),
		aliases:           controllermanager.ControllerAliases(),
	}
	c.flags = s.Flags(c.all, c.disabledByDefault, c.aliases)
	return c, nil
}

func (c *controllerManager) run(ctx context.Context, dir string, p pkiFiles, extra []string) error {
	args := []string{
		"--kubeconfig=" + filepath.Join(dir, controllerManagerIdentity.kubeconfig),
		"--secure-port=0",
		"--leader-elect=false",
		// Each controller acts as its own ServiceAccount, as in kubeadm's clusters: RBAC's
		// bootstrap roles then decide what the garbage collector or the claim controller may do.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + p.path("sa.key"),
		"--root-ca-file=" + p.path("ca.crt"),
		// Certificate signing requests for kube-apiserver-client certificates are signed too.
		"--cluster-signing-cert-file=" + p.path("ca.crt"),
		"--cluster-signing-key-file=" + p.path("ca.key"),
	}
	if err := parse(c.flags, append(args, extra...)); err != nil {
		return fmt.Errorf("flags: %w", err)
	}
	c.options.ParsedFlags = &c.flags
	config, err := c.options.Config(ctx, c.all, c.disabledByDefault, c.aliases)
	if err != nil {
		return err
	}
	return controllermanager.Run(ctx, config.Complete())
}

// kubernetesVersion is the version this binary was built from (set at link time by
// tests/cluster/build.py, from go.mod).
func kubernetesVersion() string { return version.Get().GitVersion }
