package main

// The kubelet, from Kubernetes' own code at the version go.mod pins (cmd/kubelet/app, in this
// program's module graph already): `kube-testcluster kubelet ARGS...` is the kubelet binary, run
// by tests/cluster/real_node.py beside containerd for the test cluster's real node. One binary
// for the whole cluster: it shares the compiled apiserver, client and API packages with the
// control plane, so it adds little to a cold build and nothing to a second download.

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register" // as the kubelet's main: --logging-format=json
	"k8s.io/kubernetes/cmd/kubelet/app"
)

// kubeletArguments says whether args (os.Args) ask for the kubelet, and gives its arguments.
func kubeletArguments(args []string) ([]string, bool) {
	if len(args) > 1 && args[1] == "kubelet" {
		return append([]string{"kubelet"}, args[2:]...), true
	}
	return nil, false
}

// runKubelet does what the kubelet's main (k8s.io/kubernetes/cmd/kubelet) does, with args as its
// command line; it does not return.
func runKubelet(args []string) {
	os.Args = args // cobra reads the command line from os.Args
	command := app.NewKubeletCommand(context.Background())
	os.Exit(cli.Run(command))
}
