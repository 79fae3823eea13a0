"""Certificates, keys and kubeconfigs for the local cluster (one CA, one client cert per component)."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class Identity:
    """A client identity: the user name (CN) and groups (O) the apiserver will see."""

    file_stem: str
    user: str
    groups: tuple[str, ...] = ()


# Each control-plane component authenticates as the user upstream's RBAC bootstrap policy expects.
IDENTITIES = (
    Identity("admin", "sandfleet-admin", ("system:masters",)),
    Identity("controller-manager", "system:kube-controller-manager"),
    Identity("scheduler", "system:kube-scheduler"),
    Identity("kwok", "kwok-controller", ("system:masters",)),
    Identity("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)),
)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common_name: str, groups: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _sign(
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    ca_cert: x509.Certificate | None,
    ca_key: ec.EllipticCurvePrivateKey,
    *,
    is_ca: bool = False,
    server_names: tuple[str, ...] = (),
    server_ips: tuple[str, ...] = (),
    client: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject if ca_cert else subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if is_ca:
        builder = builder.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        usages = []
        if server_names or server_ips:
            usages.append(x509.oid.ExtendedKeyUsageOID.SERVER_AUTH)
            sans: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
            sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        if client:
            usages.append(x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


@dataclass(frozen=True)
class Pki:
    """Paths of everything generated into one directory."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "service-account.key"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "service-account.pub"

    def client_cert(self, stem: str) -> Path:
        return self.directory / f"{stem}.crt"

    def client_key(self, stem: str) -> Path:
        return self.directory / f"{stem}.key"

    def kubeconfig(self, stem: str) -> Path:
        return self.directory.parent / f"{stem}.kubeconfig"


def generate(
    pki: Pki,
    server_url: str,
    extra_ips: tuple[str, ...] = (),
    extra_identities: tuple[Identity, ...] = (),
) -> None:
    """Create the CA, the apiserver's serving cert, the SA signing key and a kubeconfig per identity.

    `extra_ips` join the serving cert's SANs (the real node's IP and the `kubernetes` Service IP);
    `extra_identities` get a client cert and kubeconfig each (the real node's components).
    """
    pki.directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _sign(_name("sandfleet-local-ca"), ca_key.public_key(), None, ca_key, is_ca=True)
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.ca_cert, ca_cert)

    serving_key = ec.generate_private_key(ec.SECP256R1())
    serving = _sign(
        _name("kube-apiserver"),
        serving_key.public_key(),
        ca_cert,
        ca_key,
        server_names=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        server_ips=("127.0.0.1", *extra_ips),
    )
    _write_key(pki.serving_key, serving_key)
    _write_cert(pki.serving_cert, serving)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.service_account_key, sa_key)
    pki.service_account_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )

    for identity in (*IDENTITIES, *extra_identities):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _sign(_name(identity.user, identity.groups), key.public_key(), ca_cert, ca_key, client=True)
        _write_key(pki.client_key(identity.file_stem), key)
        _write_cert(pki.client_cert(identity.file_stem), cert)
        write_kubeconfig(pki, identity.file_stem, server_url)


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(pki: Pki, stem: str, server_url: str) -> Path:
    """A self-contained kubeconfig (certificates inlined) for one identity."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "sandfleet-local",
                "cluster": {
                    "server": server_url,
                    "certificate-authority-data": _b64(pki.ca_cert),
                },
            }
        ],
        "users": [
            {
                "name": stem,
                "user": {
                    "client-certificate-data": _b64(pki.client_cert(stem)),
                    "client-key-data": _b64(pki.client_key(stem)),
                },
            }
        ],
        "contexts": [{"name": "sandfleet-local", "context": {"cluster": "sandfleet-local", "user": stem}}],
        "current-context": "sandfleet-local",
    }
    path = pki.kubeconfig(stem)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
