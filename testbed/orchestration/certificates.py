"""A lab's TLS material (`testbed provision --tls`): a certificate authority of its own and the
broker's certificate and key, signed by it, for the host name or address the boards connect to.

The CA's private key signs the broker's certificate and is then dropped, never written: nobody,
whoever reads the bundles or the broker's folder, can sign another certificate the boards would
trust. Provisioning again makes a new CA (and new passwords) for the whole lab.

Keys are ECDSA P-256 (what Mosquitto, OpenSSL and Python's ``ssl`` all take); the broker's
certificate carries the name in its subjectAltName (a DNS name, or an IP address for an address:
clients check the name there, not in the CN), is for server authentication only, and is valid
from a day before it was made (a board without a real-time clock boots a little in the past) for
:data:`VALID_DAYS`.

Example::

    >>> tls = make_broker_tls("broker.lan")
    >>> tls.ca_pem.startswith(b"-----BEGIN CERTIFICATE-----"), b"PRIVATE KEY" in tls.key_pem
    (True, True)
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass

from testbed.errors import UserError
from testbed.util.extras import missing_package_message

#: How long the CA and the broker's certificate are valid: 825 days, the longest a server
#: certificate may be valid for Apple's TLS clients, so no client refuses it for its length.
VALID_DAYS = 825
#: How far back a certificate's validity starts (a board's clock after a boot without NTP).
BACKDATE = datetime.timedelta(days=1)
#: X.509's upper bound on a common name (RFC 5280, ub-common-name).
_CN_MAX = 64


@dataclass(frozen=True)
class BrokerTls:
    """PEM bytes: the CA's certificate (what boards and coordinator trust: ``tls_ca``), the broker's
    certificate and its private key (unencrypted PKCS#8: Mosquitto reads it without a passphrase)."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes


def make_broker_tls(host: str, run_id: str = "testbed") -> BrokerTls:
    """A new CA and the broker's certificate for ``host`` (a DNS name or an IP address), signed by it.

    Args:
        host: what the boards connect to (the broker URL's host): the certificate's only name.
        run_id: named in the CA's subject, so a lab's CA says which run's it is.

    Raises:
        UserError: the ``cryptography`` package is not installed (the coordinator's extra).
    """
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ModuleNotFoundError as exc:
        raise UserError(f"provision --tls {missing_package_message(exc) or exc}") from None

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - BACKDATE, now + datetime.timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"testbed lab CA (run {run_id})")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(_key_usage(x509, cert_sign=True), critical=True)
          .add_extension(ca_ski, critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, _common_name(host))]))
            .issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([_general_name(x509, host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(x509, cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return BrokerTls(ca_pem=ca.public_bytes(pem), cert_pem=cert.public_bytes(pem),
                     key_pem=key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def _common_name(host: str) -> str:
    """The certificate's CN: ``host`` where it fits X.509's 64 characters (a DNS name may have 253);
    clients check the subjectAltName, which always holds the whole name."""
    return host if len(host) <= _CN_MAX else "testbed broker"


def _general_name(x509, host: str):  # type: ignore[no-untyped-def]  # cryptography is imported lazily
    """``host`` as a subjectAltName entry: an IP address for an address, else a DNS name."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return x509.DNSName(host)


def _key_usage(x509, *, cert_sign: bool):  # type: ignore[no-untyped-def]
    """A CA signs certificates; a server's ECDSA key signs its TLS handshakes."""
    return x509.KeyUsage(digital_signature=not cert_sign, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign, crl_sign=cert_sign,
                         encipher_only=False, decipher_only=False)
