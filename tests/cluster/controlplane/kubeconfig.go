package main

// Kubeconfigs, one per identity, each self-contained (certificates inline) so that it can be
// copied or handed to a process of another user.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// writeKubeconfig writes DIR/<identity's file> for server, with a client certificate made for it
// (once: a restart keeps the file, and the certificate stays valid).
func writeKubeconfig(dir, server string, p pkiFiles, who identity) error {
	path := filepath.Join(dir, who.kubeconfig)
	if existing, err := clientcmd.LoadFromFile(path); err == nil {
		if cluster := existing.Clusters["kube-testcluster"]; cluster != nil && cluster.Server == server {
			return nil
		}
	}
	ca, caKey, err := loadCA(p)
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := sign(clientTemplate(who), ca, caKey)
	if err != nil {
		return err
	}
	config := clientcmdapi.NewConfig()
	config.Clusters["kube-testcluster"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: encodeCert(ca)}
	config.AuthInfos[who.commonName] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	config.Contexts["kube-testcluster"] = &clientcmdapi.Context{Cluster: "kube-testcluster", AuthInfo: who.commonName}
	config.CurrentContext = "kube-testcluster"
	// Written aside and renamed: whoever waits for the file never reads half of it.
	partial := path + ".partial"
	if err := clientcmd.WriteToFile(*config, partial); err != nil {
		return err
	}
	return os.Rename(partial, path)
}

// restConfig is the admin's client configuration, before any kubeconfig is written.
func restConfig(server string, p pkiFiles) (*rest.Config, error) {
	ca, caKey, err := loadCA(p)
	if err != nil {
		return nil, err
	}
	certPEM, keyPEM, err := sign(clientTemplate(adminIdentity), ca, caKey)
	if err != nil {
		return nil, err
	}
	return &rest.Config{
		Host:            server,
		TLSClientConfig: rest.TLSClientConfig{CAData: encodeCert(ca), CertData: certPEM, KeyData: keyPEM},
		Timeout:         5 * time.Second,
	}, nil
}

// waitForAPIServer waits until /readyz answers ok (or the API server failed, or ctx ended).
func waitForAPIServer(ctx context.Context, server string, p pkiFiles, failed <-chan struct{}) error {
	config, err := restConfig(server, p)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	last := "no answer yet"
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case <-failed:
			return false, fmt.Errorf("the API server failed")
		default:
		}
		body, err := client.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			last = fmt.Sprintf("%v: %s", err, body)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("the API server did not become ready (%s): %w", last, err)
	}
	return nil
}
