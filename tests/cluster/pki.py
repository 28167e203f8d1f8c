"""Certificates signed by the test cluster's CA (made by the control plane in DIR/pki).

The API server authenticates a client certificate's common name as the user and its
organisations as the groups: :func:`client_certificate` makes any identity a test needs (a
user in given groups, a node ``system:node:NAME`` in ``system:nodes``) without a restart.
:func:`serving_certificate` is the simulated kubelets' HTTPS identity (the API server fetches
pod logs from it).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its key, PEM."""

    certificate: bytes
    key: bytes

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        """``name.crt`` and ``name.key`` in ``directory`` (the key readable by its owner only)."""
        directory.mkdir(parents=True, exist_ok=True)
        certificate, key = directory / f"{name}.crt", directory / f"{name}.key"
        certificate.write_bytes(self.certificate)
        key.touch(mode=0o600)
        key.write_bytes(self.key)
        return certificate, key


@dataclass(frozen=True)
class Authority:
    """The cluster's CA, read from the control plane's DIR/pki."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def new(cls, name: str) -> Authority:
        """A CA of its own (the API server's front proxy: what it tells aggregated API servers,
        such as Kueue's visibility server, is signed by another CA than its clients')."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(certificate, key)

    @classmethod
    def load(cls, pki: Path) -> Authority:
        key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise TypeError(f"{pki / 'ca.key'} is not the EC key kube-testcluster makes")
        return cls(x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes()), key)

    @property
    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def _issue(
        self, subject: x509.Name, usage: x509.ObjectIdentifier, names: list[x509.GeneralName] | None = None
    ) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self.key, hashes.SHA256())
        return KeyPair(
            certificate.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )

    def client_certificate(self, user: str, groups: tuple[str, ...] = ()) -> KeyPair:
        """A client certificate for ``user`` in ``groups``, as the API server reads one."""
        subject = [x509.NameAttribute(NameOID.COMMON_NAME, user)]
        subject += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups]
        return self._issue(x509.Name(subject), ExtendedKeyUsageOID.CLIENT_AUTH)

    def serving_certificate(self, host: str = "127.0.0.1") -> KeyPair:
        """A server certificate for ``host`` (an IP address)."""
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
        names: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(host))]
        return self._issue(subject, ExtendedKeyUsageOID.SERVER_AUTH, names)
