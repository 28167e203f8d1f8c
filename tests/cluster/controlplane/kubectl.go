package main

// kubectl, from Kubernetes' own code at the version go.mod pins (k8s.io/kubectl, already in this
// program's module graph through k8s.io/kubernetes): the binary is kubectl when invoked under
// that name (a symlink called kubectl) or as `kube-testcluster kubectl ARGS...`. The tests run the
// docs' kubectl commands with it, as written, against the control plane of the same version,
// with nothing to download.

import (
	"os"
	"path/filepath"

	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

// kubectlArguments says whether args (os.Args) ask for kubectl, and gives kubectl's own
// arguments (its name first, as kubectl's plugin lookup reads them).
func kubectlArguments(args []string) ([]string, bool) {
	if len(args) > 0 && filepath.Base(args[0]) == "kubectl" {
		return args, true
	}
	if len(args) > 1 && args[1] == "kubectl" {
		return append([]string{"kubectl"}, args[2:]...), true
	}
	return nil, false
}

// runKubectl does what kubectl's main (k8s.io/kubernetes/cmd/kubectl) does, with args as its
// command line; it does not return.
func runKubectl(args []string) {
	os.Args = args                                // kubectl and cobra read the command line from os.Args
	logs.GlogSetter(cmd.GetLogVerbosity(os.Args)) // nolint:errcheck // as kubectl's main
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err) // prints the error as kubectl does and exits non-zero
	}
	os.Exit(0)
}
