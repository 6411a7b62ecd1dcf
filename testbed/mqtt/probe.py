"""Before a client hands its connection to paho: one raw connection to the broker that says at once
what paho would only time out on.

paho retries a failed connect until the caller's deadline, whatever the failure: an untrusted or
expired certificate, `mqtt://` to a TLS port (the server resets the connection on a cleartext
CONNECT), `mqtts://` to a plain port (it resets on a ClientHello), a broker that closes an MQTT v5
CONNECT without a CONNACK (RabbitMQ's MQTT plugin speaks 3.1.1 only). `negotiate` opens a socket
itself, does the TLS handshake, sends a bare CONNECT and reads what comes back, so each of these is
one line within a second, and it picks the protocol version ("auto": v5 if the broker answers a v5
CONNECT with anything but "unsupported protocol version", 3.1.1 if it refuses or closes it).

Outcomes that may pass are retried, each for as long as it can pass: a broker that accepts but does
not answer yet (or a SYN nobody answers: a firewall that drops it) until the caller's deadline, and
the "not reachable" error then says what the last attempt saw; a connection refused (nothing listens
on the port) or a network the machine has no route to only for :data:`FAST_FAILURE_GRACE_S`, the
time a broker being (re)started takes to listen; a host name that does not resolve not at all. A
lab engineer who mistyped a port or a host learns so in one line within seconds, not after a
minute of silence.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import logging
import socket
import ssl
import time

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from testbed.errors import ConfigError, UserError
from testbed.mqtt.broker import BrokerUrl, parse_broker_url

log = logging.getLogger(__name__)

#: CONNACK codes meaning "not this protocol version": 3.1.1's 0x01 (what a v3 broker answers a v5
#: CONNECT with) and v5's 0x84.
_WRONG_VERSION = (0x01, 0x84)
_ATTEMPT_TIMEOUT_S = 5.0
#: The first TLS handshake waits this long only: a TLS server answers a ClientHello at once, while a
#: plain MQTT broker may sit on it (amqtt does) and is then recognised by a plain CONNECT.
_FIRST_HANDSHAKE_S = 1.0
#: OpenSSL verify codes of an issuer the client does not know (the only case where giving the CA
#: helps): unable to get issuer (2, 20), self-signed leaf or chain (18, 19), leaf not verifiable (21).
_UNKNOWN_ISSUER = frozenset({2, 18, 19, 20, 21})
_EXPIRED, _NOT_YET_VALID = 10, 9
_HOST_MISMATCH = frozenset({62, 64})  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
#: How long a refused connection (or no route to the host) is retried before it is reported: a
#: broker being started or restarted listens within this, a mistyped port or host never does.
FAST_FAILURE_GRACE_S = 3.0
#: What ``_Answer.seen`` says for the outcomes that :data:`FAST_FAILURE_GRACE_S` bounds.
_FAST_FAILURES = ("refused", "unreachable")
#: getaddrinfo's errors that no retry changes (EAI_AGAIN, a DNS server that did not answer, may pass).
_NO_SUCH_HOST = frozenset(code for code in (getattr(socket, name, None) for name in ("EAI_NONAME", "EAI_NODATA",
                                                                                     "EAI_ADDRFAMILY"))
                          if code is not None)


def check_tls_ca_use(broker_url: str | None, tls_ca: str | None, key: str = "mqtt.tls_ca") -> None:
    """Refuse a CA file with a plain broker: it would run in cleartext while looking protected.

    Args:
        broker_url: the broker URL; None is the embedded broker (plain mqtt://).
        tls_ca: the CA file, or None.
        key: the setting's name in the message.

    Raises:
        ConfigError: `tls_ca` is set and the URL is not mqtts://.
    """
    if tls_ca is None:
        return
    if broker_url is None:
        raise ConfigError(key, "is set but no mqtt.broker_url is: the embedded broker is plain MQTT, without TLS")
    url = parse_broker_url(broker_url)
    if not url.tls:
        raise ConfigError(key, f"is set but broker {url} is plain mqtt://, which would run in cleartext; "
                               "use an mqtts:// URL, or drop tls_ca")


def tls_context(tls_ca: str | None) -> ssl.SSLContext:
    """A verifying client context trusting `tls_ca` (a PEM file), or the system CAs for None.

    Raises:
        UserError: one line naming the file if it is missing, unreadable or holds no PEM certificate.
    """
    return _load_ca(None if tls_ca is None else str(tls_ca))


@functools.lru_cache(maxsize=16)  # one context per file for all the clients of a process
def _load_ca(tls_ca: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if tls_ca is None:
        return context  # the system's CAs
    try:
        context.load_verify_locations(cafile=tls_ca)
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        raise UserError(f"tls_ca {tls_ca}: cannot read the CA file ({exc.strerror})") from None
    except ssl.SSLError:
        raise UserError(f"tls_ca {tls_ca}: holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)") from None
    return context


@dataclasses.dataclass(frozen=True)
class _Answer:
    """What one raw CONNECT got back: a CONNACK code, or the reason there was none."""

    connack: int | None = None
    seen: str = ""  # for no CONNACK: "closed", "tls", "silent", "refused", "unreachable", or "bytes <hex>"
    detail: str = ""  # the operating system's words for a connection that failed
    shared_subscriptions: bool | None = None  # what a v5 CONNACK says (absent: yes, MQTT 5 §3.2.2.3.15)


@dataclasses.dataclass(frozen=True)
class Negotiated:
    """What the probe learnt of a broker.

    Attributes:
        protocol: the MQTT version to connect with, "5" or "3.1.1".
        shared_subscriptions: whether it serves shared subscriptions (``$share/...``), as its MQTT 5
            CONNACK says; None on 3.1.1, which cannot say.
    """

    protocol: str
    shared_subscriptions: bool | None


def negotiate(url: BrokerUrl | str, *, tls_ca: str | None, protocol: str, client_id: str,
              username: str | None, password: str | None, deadline: float, timeout_s: float) -> Negotiated:
    """The MQTT version to connect with ("5" or "3.1.1") and what the broker serves, after one raw
    connection that shows the broker is there, speaks TLS if and only if the URL says so, trusts
    our CA and answers CONNECTs.

    Args:
        url: the broker.
        tls_ca: the CA file for mqtts:// (None: the system's CAs); refused with mqtt://.
        protocol: "auto", "5" or "3.1.1".
        client_id: the probe's client id (a broker that binds client ids to usernames replaces it).
        username, password: credentials (a refusal is still an answer: paho's connect reports it).
        deadline: time.monotonic() by which to give up; `timeout_s` is for the message.

    Raises:
        UserError: at once for an untrusted, expired or wrong-name certificate, a TLS/plain mismatch,
            a server that is no MQTT broker, a forced v5 the broker closes, a host name that does
            not resolve; within :data:`FAST_FAILURE_GRACE_S` for a connection refused or a host
            without a route; at the deadline for a broker that accepts but does not answer (saying
            what the last attempt saw).
    """
    url = parse_broker_url(url) if isinstance(url, str) else url
    if tls_ca is not None and not url.tls:
        check_tls_ca_use(str(url), tls_ca)
    context = tls_context(tls_ca) if url.tls else None
    first = "3.1.1" if protocol == "3.1.1" else "5"
    backoff_s, handshake_s = 0.1, _FIRST_HANDSHAKE_S
    fast_deadline = min(deadline, time.monotonic() + FAST_FAILURE_GRACE_S)
    while True:
        answer = _ask(url, context, first, client_id, username, password, deadline, handshake_s)
        chosen = _decide(url, context, protocol, first, answer, client_id, username, password, deadline)
        if chosen is not None:
            return Negotiated(chosen, answer.shared_subscriptions if chosen == first == "5" else None)
        now = time.monotonic()
        if answer.seen in _FAST_FAILURES and now >= fast_deadline:
            raise UserError(_fast_failure(url, answer, min(timeout_s, FAST_FAILURE_GRACE_S)))
        left = (fast_deadline if answer.seen in _FAST_FAILURES else deadline) - now
        if left <= 0:
            raise UserError(f"broker {url} not reachable within {timeout_s:g} s ({_describe(answer)})")
        time.sleep(min(backoff_s, left))
        backoff_s, handshake_s = min(backoff_s * 2, 1.0), _ATTEMPT_TIMEOUT_S


def _decide(url: BrokerUrl, context: ssl.SSLContext | None, protocol: str, first: str, answer: _Answer,
            client_id: str, username: str | None, password: str | None, deadline: float) -> str | None:
    """The version to use, None to try again, or UserError for what no retry will change."""
    if answer.connack is not None:
        if first == "5" and answer.connack in _WRONG_VERSION:
            if protocol == "5":
                raise UserError(f"broker {url} does not speak MQTT v5 (its CONNACK: unsupported protocol "
                                'version); set mqtt.protocol / --protocol to "3.1.1" or "auto"')
            return "3.1.1"
        return first
    if answer.seen == "tls":
        raise UserError(f"broker {url}: the server answered an MQTT CONNECT with a TLS record: it is a TLS "
                        "port; use mqtts:// (and mqtt.tls_ca / --tls-ca for its CA)")
    if answer.seen.startswith("bytes"):
        raise UserError(f"broker {url}: the server answered an MQTT CONNECT with {answer.seen[6:]}: not an "
                        "MQTT broker on this port")
    if answer.seen in ("tls-closed", "tls-silent"):  # mqtts:// to a server that dropped or sat on a ClientHello
        # Anonymous: the user asked for TLS, so no password goes out in cleartext; any CONNACK,
        # "not authorised" included, shows a plain MQTT broker.
        plain = _ask(dataclasses.replace(url, tls=False), None, "3.1.1", client_id, None, None, deadline)
        if plain.connack is not None:
            what = "closed the connection on" if answer.seen == "tls-closed" else "did not answer"
            raise UserError(f"broker {url}: the server {what} a TLS ClientHello and answers plain MQTT: it is "
                            "not a TLS port; use mqtt://")
        return None
    if answer.seen == "closed":
        if first == "5":
            # RabbitMQ's MQTT plugin closes a v5 CONNECT without a CONNACK; ask in 3.1.1.
            retry = _ask(url, context, "3.1.1", client_id, username, password, deadline)
            if retry.connack is not None:
                if protocol == "5":
                    raise UserError(f"broker {url} closed an MQTT v5 CONNECT without a CONNACK but answers 3.1.1: "
                                    'it does not speak v5; set mqtt.protocol / --protocol to "3.1.1" or "auto"')
                log.info("broker %s closed an MQTT v5 CONNECT without a CONNACK; using MQTT 3.1.1", url)
                return "3.1.1"
            answer = retry
        if answer.seen == "closed" and not url.tls and _speaks_tls(url, deadline):
            raise UserError(f"broker {url}: the server closes MQTT CONNECTs without a CONNACK and completes a TLS "
                            "handshake: it is a TLS port; use mqtts:// (and mqtt.tls_ca / --tls-ca for its CA)")
    return None


def _fast_failure(url: BrokerUrl, answer: _Answer, waited_s: float) -> str:
    """One line for a connection refused, or a host without a route, for ``waited_s`` seconds."""
    if answer.seen == "refused":
        return (f"broker {url} not reachable: connection refused for {waited_s:g} s (nothing listens on port "
                f"{url.port} of {url.host}): is the broker running, and is the port right?")
    return (f"broker {url} not reachable: {answer.detail} for {waited_s:g} s: check the host and this machine's "
            "network")


def _describe(answer: _Answer) -> str:
    return {"closed": "the server closed the connection without a CONNACK",
            "tls-closed": "the server closed the connection during the TLS handshake",
            "tls-silent": "the server did not answer a TLS ClientHello",
            "silent": "the server accepted the connection but did not answer an MQTT CONNECT",
            "refused": "connection refused"}.get(answer.seen, answer.seen)


def _ask(url: BrokerUrl, context: ssl.SSLContext | None, version: str, client_id: str,
         username: str | None, password: str | None, deadline: float,
         handshake_s: float = _ATTEMPT_TIMEOUT_S) -> _Answer:
    """One raw connection: TLS handshake if mqtts:// (waiting `handshake_s` at most), a bare
    CONNECT, the answer."""
    timeout = max(0.05, min(_ATTEMPT_TIMEOUT_S, deadline - time.monotonic()))
    try:
        raw = socket.create_connection((url.host, url.port), timeout=timeout)
    except ConnectionRefusedError:
        return _Answer(seen="refused")
    except socket.gaierror as exc:
        if exc.errno in _NO_SUCH_HOST:
            raise UserError(f"broker {url} not reachable: unknown host {url.host!r} ({exc.strerror}): check the "
                            "broker URL's host name") from None
        return _Answer(seen=f"cannot resolve {url.host}: {exc.strerror or exc}")
    except OSError as exc:
        if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return _Answer(seen="unreachable", detail=exc.strerror or str(exc))
        return _Answer(seen=f"cannot connect: {exc.strerror or exc}")
    sock: socket.socket = raw
    try:
        if url.tls:
            assert context is not None
            raw.settimeout(min(timeout, handshake_s))
            try:
                sock = context.wrap_socket(raw, server_hostname=url.host)
            except ssl.SSLCertVerificationError as exc:
                raise UserError(_certificate_error(url, exc)) from None
            except (ssl.SSLEOFError, ConnectionError):
                return _Answer(seen="tls-closed")
            except ssl.SSLError as exc:
                if exc.reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG",
                                  "UNKNOWN_PROTOCOL", "HTTP_REQUEST"):
                    raise UserError(f"broker {url}: the server answered a TLS ClientHello with non-TLS bytes "
                                    f"({exc.reason}): it is not a TLS port; use mqtt://") from None
                raise UserError(f"broker {url}: TLS handshake failed ({exc.reason or exc})") from None
            except TimeoutError:
                return _Answer(seen="tls-silent")
            sock.settimeout(timeout)
        sock.sendall(_connect_packet(version, client_id, username, password))
        answer = _read_connack(sock, v5=version == "5")
        if answer.connack is not None:
            try:
                sock.sendall(b"\xe0\x00")  # DISCONNECT, normal: no will, no noise in the broker's log
            except OSError:
                pass
        return answer
    except TimeoutError:
        return _Answer(seen="silent")
    except (ConnectionError, ssl.SSLEOFError):
        return _Answer(seen="closed")
    finally:
        sock.close()


def _read_connack(sock: socket.socket, *, v5: bool) -> _Answer:
    """Read a CONNACK (fixed header 0x20) and return its code (and with ``v5``, whether its
    properties say the broker serves shared subscriptions); else what came instead."""
    data = b""
    while len(data) < 4:
        chunk = sock.recv(4 - len(data))
        if not chunk:
            return _Answer(seen="closed") if not data else _odd(data)
        data += chunk
        if data[0] != 0x20:
            return _odd(data)
    # CONNACK: 0x20, remaining length (2 in 3.1.1; 2 + properties in v5), flags, code. Read the
    # rest (v5 properties), so that closing does not reset the connection under the DISCONNECT.
    rest = data[1] - 2 if data[1] < 128 else 0
    properties = b""
    try:
        while len(properties) < rest and (chunk := sock.recv(rest - len(properties))):
            properties += chunk
    except OSError:
        pass
    shared = None
    if v5 and properties and len(properties) == rest:
        try:
            shared = getattr(Properties(PacketTypes.CONNACK).unpack(properties)[0], "SharedSubscriptionAvailable", 1) != 0
        except Exception:  # noqa: BLE001  paho raises bare Exceptions on malformed properties
            log.info("unreadable CONNACK properties %s: shared subscriptions unknown", properties.hex(" "))
    return _Answer(connack=data[3], shared_subscriptions=shared)


def _odd(data: bytes) -> _Answer:
    if data[0] in (0x15, 0x16) and (len(data) < 2 or data[1] == 0x03):  # TLS alert or handshake record
        return _Answer(seen="tls")
    return _Answer(seen=f"bytes {data.hex(' ')}")


def _speaks_tls(url: BrokerUrl, deadline: float) -> bool:
    """Whether the port completes a TLS handshake (any certificate: only the protocol matters)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    timeout = max(0.05, min(_ATTEMPT_TIMEOUT_S, deadline - time.monotonic()))
    try:
        with socket.create_connection((url.host, url.port), timeout=timeout) as raw, \
                context.wrap_socket(raw, server_hostname=url.host):
            return True
    except ssl.SSLError as exc:
        return "ALERT" in (exc.reason or "")  # a TLS alert is TLS too
    except OSError:
        return False


def _certificate_error(url: BrokerUrl, exc: ssl.SSLCertVerificationError) -> str:
    """One line for a certificate that failed verification; the CA hint only where a CA helps."""
    why = (exc.verify_message or str(exc)).rstrip(".")
    if exc.verify_code in _UNKNOWN_ISSUER:
        return (f"broker {url}: TLS certificate not trusted ({why}); give the CA that signed it with "
                "mqtt.tls_ca / --tls-ca")
    if exc.verify_code == _EXPIRED:
        return f"broker {url}: TLS certificate has expired; the broker needs a renewed certificate"
    if exc.verify_code == _NOT_YET_VALID:
        return f"broker {url}: TLS certificate is not valid yet; check this machine's clock, or the certificate's dates"
    if exc.verify_code in _HOST_MISMATCH:
        return (f"broker {url}: TLS certificate is not issued for {url.host} ({why}); connect with a host name "
                "or address the certificate names")
    return f"broker {url}: TLS certificate rejected ({why})"


def _utf8(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(2, "big") + data


def _connect_packet(version: str, client_id: str, username: str | None, password: str | None) -> bytes:
    """A bare CONNECT (clean start, keepalive 10 s, no will, no properties): what amqtt 0.12
    refuses cleanly in v5 (it misparses a v5 CONNECT with a will and never answers)."""
    flags = 0x02
    payload = _utf8(client_id)
    if username is not None:
        flags |= 0x80
        payload += _utf8(username)
        if password is not None:
            flags |= 0x40
            payload += _utf8(password)
    variable = _utf8("MQTT") + bytes([5 if version == "5" else 4, flags]) + (10).to_bytes(2, "big")
    if version == "5":
        variable += b"\x00"  # no properties
    body = variable + payload
    length, encoded = len(body), b""
    while True:  # MQTT variable-length integer
        byte, length = length % 128, length // 128
        encoded += bytes([byte | (0x80 if length else 0)])
        if not length:
            break
    return b"\x10" + encoded + body
