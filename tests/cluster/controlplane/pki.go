package main

// The cluster's certificates and keys, made on first start and kept in DIR/pki so that a
// restarted control plane (same DIR) keeps every kubeconfig valid:
//
//	ca.crt, ca.key                      the one CA: it signs the API server's serving
//	                                    certificate and every client certificate (tests mint
//	                                    theirs for users and nodes with it, see tests/cluster/pki.py)
//	apiserver.crt, apiserver.key        serving, for 127.0.0.1, localhost and kubernetes.default…
//	apiserver-kubelet-client.crt/.key   the API server's identity towards kubelets (pod logs)
//	sa.key, sa.pub                      the ServiceAccount token signer and its public key
//
// Keys are ECDSA P-256: quick to make, accepted everywhere Kubernetes takes a key.

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

type pkiFiles struct {
	dir string
}

func (p pkiFiles) path(name string) string { return filepath.Join(p.dir, name) }

// identity is a client of the API server with a certificate of its own.
type identity struct {
	commonName string   // the user name
	groups     []string // the certificate's organisations
	kubeconfig string   // file name in DIR
}

var (
	adminIdentity             = identity{"kubernetes-admin", []string{"system:masters"}, "admin.kubeconfig"}
	schedulerIdentity         = identity{"system:kube-scheduler", nil, "scheduler.kubeconfig"}
	controllerManagerIdentity = identity{"system:kube-controller-manager", nil, "controller-manager.kubeconfig"}
	kubeletClientIdentity     = identity{"kube-apiserver-kubelet-client", nil, ""}
)

// ensurePKI makes what is missing under dir/pki and returns where it is.
func ensurePKI(dir string) (pkiFiles, error) {
	p := pkiFiles{filepath.Join(dir, "pki")}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return p, err
	}
	if _, err := os.Stat(p.path("ca.crt")); err == nil {
		return p, nil // made by an earlier start
	}
	caKey, err := newKey()
	if err != nil {
		return p, err
	}
	ca, err := cert.NewSelfSignedCACert(cert.Config{CommonName: "kube-testcluster-ca"}, caKey)
	if err != nil {
		return p, err
	}
	serving := x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.ParseIP(serviceIP)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if err := issue(p, "apiserver", serving, ca, caKey); err != nil {
		return p, err
	}
	if err := issue(p, "apiserver-kubelet-client", clientTemplate(kubeletClientIdentity), ca, caKey); err != nil {
		return p, err
	}
	saKey, err := newKey()
	if err != nil {
		return p, err
	}
	if err := writeKey(p.path("sa.key"), saKey); err != nil {
		return p, err
	}
	publicDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return p, err
	}
	publicKey := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: publicDER})
	if err := os.WriteFile(p.path("sa.pub"), publicKey, 0o600); err != nil {
		return p, err
	}
	if err := writeKey(p.path("ca.key"), caKey); err != nil {
		return p, err
	}
	// ca.crt last: its presence says the set is complete.
	return p, os.WriteFile(p.path("ca.crt"), encodeCert(ca), 0o600)
}

func clientTemplate(who identity) x509.Certificate {
	return x509.Certificate{
		Subject:     pkix.Name{CommonName: who.commonName, Organization: who.groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
}

// issue signs template with the CA and writes name.crt and name.key.
func issue(p pkiFiles, name string, template x509.Certificate, ca *x509.Certificate, caKey crypto.Signer) error {
	certPEM, keyPEM, err := sign(template, ca, caKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(p.path(name+".key"), keyPEM, 0o600); err != nil {
		return err
	}
	return os.WriteFile(p.path(name+".crt"), certPEM, 0o600)
}

// sign makes a key and a certificate for it from template, signed by the CA (valid ten years:
// a test cluster's directory may be kept and restarted).
func sign(template x509.Certificate, ca *x509.Certificate, caKey crypto.Signer) (certPEM, keyPEM []byte, err error) {
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, err
	}
	template.SerialNumber = serial
	template.NotBefore = time.Now().Add(-time.Hour).UTC()
	template.NotAfter = time.Now().Add(10 * 365 * 24 * time.Hour).UTC()
	template.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	der, err := x509.CreateCertificate(rand.Reader, &template, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: cert.CertificateBlockType, Bytes: der}), keyPEM, nil
}

// loadCA reads the CA back (to sign the components' client certificates).
func loadCA(p pkiFiles) (*x509.Certificate, crypto.Signer, error) {
	certs, err := cert.CertsFromFile(p.path("ca.crt"))
	if err != nil {
		return nil, nil, err
	}
	key, err := keyutil.PrivateKeyFromFile(p.path("ca.key"))
	if err != nil {
		return nil, nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, nil, errors.New("ca.key is not a signing key")
	}
	return certs[0], signer, nil
}

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func writeKey(path string, key *ecdsa.PrivateKey) error {
	encoded, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	return os.WriteFile(path, encoded, 0o600)
}

func encodeCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: cert.CertificateBlockType, Bytes: c.Raw})
}
