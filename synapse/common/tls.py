"""TLS for the API, mTLS for workers, and a development CA.

    synapse-master gen-certs --out DIR --hosts 127.0.0.1,localhost,m1.example --workers w1,w2

writes `ca.pem` (+ `ca-key.pem`), `server.pem` / `server-key.pem` (valid for every --hosts name
or IP, used by every master, for serving and for calling each other), `client.pem` /
`client-key.pem` (for synctl, optional), for each worker `worker-<id>.pem` /
`worker-<id>-key.pem` whose common name (and DNS name) is the node id (it is also the worker's
log-service certificate), and with `--users` a `user-<name>.pem` per user whose common name is
the user name (for `tls.user_certs`). With `--add`, it signs only the --workers and --users
certificates, with the CA already in DIR (a node or user that joins later).

With `tls.require_worker_certs`, every caller must present a certificate signed by the CA (gRPC
for Python cannot ask for a client certificate without requiring one), and a worker's calls are
accepted only for the node its certificate names. synctl then uses `client.pem`.

A master's HTTP port (the dashboard, /metrics, health) serves HTTPS with the same server
certificate when `tls` is on; whatever reads it verifies against the CA (`http_base`).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import grpc

if TYPE_CHECKING:  # cryptography is imported where certificates are made, not by every process
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """PEM files a process uses: the CA that signs its peers, and optionally its own cert and key."""

    ca: str = ""
    cert: str = ""
    key: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.ca)

    def read(self) -> tuple[bytes, bytes | None, bytes | None]:
        ca = Path(self.ca).read_bytes()
        cert = Path(self.cert).read_bytes() if self.cert else None
        key = Path(self.key).read_bytes() if self.key else None
        return ca, cert, key


def server_credentials(files: TLSFiles, require_client_certs: bool) -> grpc.ServerCredentials:
    """Server TLS; with `require_client_certs`, every caller needs a certificate signed by the CA."""
    ca, cert, key = files.read()
    if cert is None or key is None:
        raise ValueError("tls: a master needs both cert and key")
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=require_client_certs)


def channel_credentials(files: TLSFiles) -> grpc.ChannelCredentials:
    ca, cert, key = files.read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def http_server_context(files: TLSFiles) -> ssl.SSLContext:
    """HTTPS for a master's HTTP port, with its own certificate. It asks for no client certificate:
    browsers, Prometheus and load balancers present none, and the dashboard signs people in itself."""
    if not (files.cert and files.key):
        raise ValueError("tls: a master needs both cert and key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(files.cert, files.key)
    context.set_alpn_protocols(["http/1.1"])
    return context


def http_base(address: str, ca: str = "") -> tuple[str, ssl.SSLContext | None]:
    """The URL prefix of a master's HTTP port (host:port) and the TLS context to open it with:
    https verified against the cluster's CA file when there is one, else plain http and None."""
    if not ca:
        return f"http://{address}", None
    return f"https://{address}", ssl.create_default_context(cafile=ca)


class _Peer(Protocol):
    """What a servicer context, sync or asyncio, tells of its peer."""

    def auth_context(self) -> Mapping[str, object]: ...


def peer_common_name(context: _Peer) -> str:
    """The verified client certificate's common name, or '' when the peer presented none."""
    # Each property is a list of values (typeshed's stub for the sync context says a single bytes value).
    properties = cast("Mapping[str, list[bytes]]", context.auth_context())
    names = properties.get("x509_common_name") or []
    return names[0].decode() if names else ""


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _save(path: Path, data: bytes, private: bool = False) -> Path:
    """Write a PEM file; a private key is readable by its owner only, from its first byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    if private:
        os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _key_usage(ca: bool) -> x509.KeyUsage:
    """A CA signs certificates (and revocation lists); a leaf signs its TLS handshakes."""
    from cryptography import x509

    return x509.KeyUsage(digital_signature=not ca, key_cert_sign=ca, crl_sign=ca, content_commitment=False,
                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                         encipher_only=False, decipher_only=False)


def issue(out: Path, name: str, common_name: str, roles: tuple[str, ...], sans: Sequence[str] = (),
          days: int = 365) -> list[Path]:
    """Sign `NAME.pem` / `NAME-key.pem` with the CA in `out` (ca.pem, ca-key.pem) for `roles`
    ("server", "client"); how `generate` makes every leaf, and how a node added later gets its own."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate((out / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((out / "ca-key.pem").read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError(f"tls: {out / 'ca-key.pem'} is a {type(ca_key).__name__}; a CA key is EC or RSA")
    usages = {"server": ExtendedKeyUsageOID.SERVER_AUTH, "client": ExtendedKeyUsageOID.CLIENT_AUTH}
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
               .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.ExtendedKeyUsage([usages[r] for r in roles]), critical=False)
               # What strict verifiers (Python 3.13's default context: VERIFY_X509_STRICT) require.
               .add_extension(_key_usage(ca=False), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if sans:
        entries: list[x509.GeneralName] = []
        for host in sans:
            try:
                entries.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                entries.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(entries), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return [_save(out / f"{name}.pem", cert.public_bytes(serialization.Encoding.PEM)),
            _save(out / f"{name}-key.pem", _key_pem(key), private=True)]


def issue_worker(out: Path, node_id: str, days: int = 365) -> list[Path]:
    """`worker-ID.pem` for node `node_id`, signed by the CA in `out`. It is also the worker's log
    service's certificate: clients check that it names the node."""
    return issue(out, f"worker-{node_id}", node_id, ("client", "server"), [node_id], days)


def generate(out: Path, hosts: list[str], workers: list[str], days: int = 365,
             users: tuple[str, ...] = ()) -> list[Path]:
    """A development CA plus server, client and per-worker certificates (see the module docstring)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Synapse development CA")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now)
               .not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(_key_usage(ca=True), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
               .sign(ca_key, hashes.SHA256()))
    written = [_save(out / "ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM)),
               _save(out / "ca-key.pem", _key_pem(ca_key), private=True)]
    # Masters serve the API and call each other's (a follower sends its link shard's digest to the
    # leader, presenting this same certificate), so theirs is both a server and a client certificate.
    written += issue(out, "server", hosts[0] if hosts else "synapse-master", ("server", "client"), hosts, days)
    written += issue(out, "client", "synctl", ("client",), [], days)
    for worker in workers:
        written += issue_worker(out, worker, days)
    for user in users:
        written += issue(out, f"user-{user}", user, ("client",), [], days)
    return written
