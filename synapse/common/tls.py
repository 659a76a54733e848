"""TLS for the API, mTLS for workers, and a development CA.

    synapse-master gen-certs --out DIR --hosts 127.0.0.1,localhost,m1.example --workers w1,w2

writes `ca.pem` (+ `ca-key.pem`), `server.pem` / `server-key.pem` (valid for every --hosts name
or IP, used by every master), `client.pem` / `client-key.pem` (for synctl, optional), for each
worker `worker-<id>.pem` / `worker-<id>-key.pem` whose common name (and DNS name) is the node id
(it is also the worker's log-service certificate), and with `--users` a `user-<name>.pem` per user
whose common name is the user name (for `tls.user_certs`).

With `tls.require_worker_certs`, every caller must present a certificate signed by the CA (gRPC
for Python cannot ask for a client certificate without requiring one), and a worker's calls are
accepted only for the node its certificate names. synctl then uses `client.pem`.

A master's HTTP port (the dashboard, /metrics, health) serves HTTPS with the same server
certificate when `tls` is on; whatever reads it verifies against the CA (`http_base`).
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc


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


def peer_common_name(context: grpc.ServicerContext) -> str:
    """The verified client certificate's common name, or '' when the peer presented none."""
    names = context.auth_context().get("x509_common_name") or []
    return names[0].decode() if names else ""


def generate(out: Path, hosts: list[str], workers: list[str], days: int = 365,
             users: tuple[str, ...] = ()) -> list[Path]:
    """A development CA plus server, client and per-worker certificates (see the module docstring)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    written: list[Path] = []

    def save(name: str, data: bytes, private: bool = False) -> None:
        path = out / name
        path.write_bytes(data)
        if private:
            path.chmod(0o600)
        written.append(path)

    def key_pem(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Synapse development CA")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now)
               .not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .sign(ca_key, hashes.SHA256()))
    save("ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM))
    save("ca-key.pem", key_pem(ca_key), private=True)

    def leaf(name: str, common_name: str, usages, sans: list[str]) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
                   .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=days))
                   .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False))
        if sans:
            entries = []
            for host in sans:
                try:
                    entries.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    entries.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(entries), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        save(f"{name}.pem", cert.public_bytes(serialization.Encoding.PEM))
        save(f"{name}-key.pem", key_pem(key), private=True)

    # A master also presents its certificate as a client, to the leader's API (its link shard's
    # liveness digests), which with require_worker_certs asks for one: it must allow client auth too.
    leaf("server", hosts[0] if hosts else "synapse-master",
         [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], hosts)
    leaf("client", "synctl", [ExtendedKeyUsageOID.CLIENT_AUTH], [])
    for worker in workers:
        # A worker's certificate is also its log service's: clients check it names the node.
        leaf(f"worker-{worker}", worker, [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH],
             [worker])
    for user in users:
        leaf(f"user-{user}", user, [ExtendedKeyUsageOID.CLIENT_AUTH], [])
    return written
