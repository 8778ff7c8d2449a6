"""gRPC endpoint (``hwbackends.serve.v1.SignalService``, proto in ``serve/proto/``).

Secure by default: TLS (``grpc.ssl_server_credentials``) and a bearer token checked by a
server interceptor (``authorization: Bearer <token>`` metadata, constant-time compare). Both
can be turned off only with ``insecure_loopback=True``, and then only on a loopback address,
for local development. Requests over ``max_request_bytes`` are refused by gRPC itself
(RESOURCE_EXHAUSTED) before any parsing; malformed payloads get INVALID_ARGUMENT with what was
expected; an unknown strategy NOT_FOUND. The call's gRPC deadline is honoured: the engine
deadline is the smaller of it and the request's ``deadline_us``, and a miss is an
``UNAVAILABLE`` *response* (the strategy skips the tick), not an error.

Connections cannot exhaust the process' file descriptors: the soft ``RLIMIT_NOFILE`` is raised
towards the hard limit at start (:func:`raise_fd_limit`), gRPC accepts at most
``max_connections`` (closing any beyond at once, and never more than the fd limit leaves room
for), closes a connection that has not completed its TLS/HTTP/2 handshake within
``handshake_timeout_s``, and one without a call in flight for ``idle_timeout_s`` (a real client
reconnects by itself). Established connections keep being served throughout.
"""
from __future__ import annotations

import hmac
import ipaddress
import logging
import resource
import socket
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..config import read_small_file, read_text_file
from ..errors import ConfigError, InputError
from .engine import Engine
from .grpc_handlers import add_raw_service, call_budget_us
from .oip import run_rows
from .request import DEADLINE, MIN_DEADLINE_US, Status, Unavailable, check_deadline_us

log = logging.getLogger("hwbackends.serve")


def _grpc() -> Any:
    try:
        import grpc
    except ImportError as exc:  # pragma: no cover
        raise ConfigError("the gRPC endpoint needs grpcio: pip install 'hwbackends[serve]'") from exc
    return grpc


def _pb() -> tuple[Any, Any]:
    from .proto import signal_pb2, signal_pb2_grpc
    return signal_pb2, signal_pb2_grpc


def is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_auth(endpoint: str, host: str, tls: Any, token: str | None, insecure_loopback: bool) -> None:
    """The one policy of a network endpoint (gRPC, HTTP): TLS and a token of at least 16
    characters, unless ``insecure_loopback`` on a loopback ``host``; ConfigError saying what
    to give otherwise."""
    if insecure_loopback:
        if not is_loopback(host):
            raise ConfigError(f"insecure_loopback is for local development only; {host} is "
                              f"not a loopback address. Give TLS files and a token instead.")
    else:
        missing = [w for w, v in (("TLS certificate/key", tls), ("token", token)) if not v]
        if missing:
            raise ConfigError(f"the {endpoint} endpoint needs {' and '.join(missing)} (TLS and token "
                              f"auth are on by default); for loopback development only, pass "
                              f"insecure_loopback=True (hwb serve --insecure-loopback)")
    if token is not None and len(token) < 16:
        raise ConfigError("the token must be at least 16 characters (secrets.token_urlsafe())")


#: File descriptors kept back from the connection cap for everything else the server opens
#: (model files, the shm endpoint, logs, gRPC's own pipes).
FD_RESERVE = 256
#: The soft fd limit :func:`raise_fd_limit` aims for (bounded by the hard limit).
FD_TARGET = 1 << 16


def raise_fd_limit(target: int = FD_TARGET) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to ``min(target, hard)`` if it is lower (a default
    soft limit of 1024 is what ~1,000 idle connections exhausted); returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as exc:  # pragma: no cover - a hard limit lowered meanwhile
            log.warning("could not raise the soft fd limit from %d to %d: %s", soft, want, exc)
    return soft


def connection_cap(max_connections: int, fd_soft_limit: int) -> int:
    """The connections gRPC may hold: ``max_connections``, and never so many that the fd
    limit has less than :data:`FD_RESERVE` left for the rest of the server."""
    return max(1, min(max_connections, fd_soft_limit - FD_RESERVE))


@dataclass(frozen=True)
class TLSFiles:
    cert_pem: bytes
    key_pem: bytes


#: Bounds of the secret files a server reads (a PEM chain is a few KB, a token < 1 KB).
MAX_PEM_BYTES = 1 << 20
MAX_TOKEN_BYTES = 64 << 10


def read_tls_files(cert: str | Path, key: str | Path) -> TLSFiles:
    """The server's certificate chain and private key from PEM files (regular files of at most
    :data:`MAX_PEM_BYTES`; a FIFO, directory or device is a :class:`ConfigError`, never a
    hang)."""
    return TLSFiles(read_small_file(cert, "TLS certificate file", MAX_PEM_BYTES),
                    read_small_file(key, "TLS key file", MAX_PEM_BYTES))


def read_token_file(path: str | Path) -> str:
    """The bearer token from ``path`` (UTF-8, surrounding whitespace stripped; a regular file
    of at most :data:`MAX_TOKEN_BYTES`, else a :class:`ConfigError`)."""
    token = read_text_file(path, "token file", MAX_TOKEN_BYTES).strip()
    if not token:
        raise ConfigError(f"token file {path} is empty; write a token of at least 16 characters "
                          f"(python -c 'import secrets; print(secrets.token_urlsafe())')")
    return token


def self_signed_cert(host: str = "127.0.0.1", days: int = 7) -> TLSFiles:
    """A throwaway self-signed certificate for ``host`` (tests, local development)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.timezone.utc)
    try:
        san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))])
    except ValueError:
        san = x509.SubjectAlternativeName([x509.DNSName(host)])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(san, critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return TLSFiles(cert.public_bytes(serialization.Encoding.PEM),
                    key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))


def bearer_matches(value: str | bytes | None, token: str) -> bool:
    """Whether an ``authorization`` value is ``Bearer <token>``: the scheme case-insensitive,
    the whole value compared in constant time (the gRPC interceptor and the HTTP endpoint)."""
    if value is None:
        return False
    got = value if isinstance(value, str) else value.decode(errors="replace")
    return hmac.compare_digest((got[:7].lower() + got[7:]).encode(), f"bearer {token}".encode())


def _auth_interceptor(token: str) -> Any:
    grpc = _grpc()

    def deny(request: Any, context: Any) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED,
                      "missing or wrong token: send metadata ('authorization', 'Bearer <token>')")

    deny_handler = grpc.unary_unary_rpc_method_handler(deny)

    class Auth(grpc.ServerInterceptor):
        def intercept_service(self, continuation: Any, details: Any) -> Any:
            for k, v in details.invocation_metadata or ():
                if k == "authorization" and bearer_matches(v, token):
                    return continuation(details)
            return deny_handler
    return Auth()


class _Servicer:
    def __init__(self, engines: Mapping[str, Engine]):
        self.engines = dict(engines)
        self.pb, _ = _pb()

    def _engine(self, name: str, context: Any) -> Engine:
        grpc = _grpc()
        if not name and len(self.engines) == 1:
            return next(iter(self.engines.values()))
        eng = self.engines.get(name)
        if eng is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown strategy {name!r}; served: "
                          f"{', '.join(self.engines)}")
        return eng  # type: ignore[return-value]

    def Info(self, request: Any, context: Any) -> Any:
        eng = self._engine(request.strategy, context)
        lay = eng.layout
        fields = [[self.pb.TensorField(name=f.name, shape=f.shape, offset=f.offset, size=f.size)
                   for f in side.fields] for side in lay] if lay is not None else [[], []]
        return self.pb.InfoResponse(input_shape=eng.input_shape, output_shape=eng.output_shape,
                                    model_version=eng.version, variant=eng.variant,
                                    strategies=list(self.engines), inputs=fields[0],
                                    outputs=fields[1])

    def Predict(self, request: Any, context: Any) -> Any:
        grpc = _grpc()
        pb = self.pb
        eng = self._engine(request.strategy, context)
        shape = tuple(request.shape)
        if shape != eng.input_shape:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"shape {list(shape)}: strategy {request.strategy!r} takes samples of "
                          f"shape {list(eng.input_shape)} (float32, little-endian, C order)")
        per = int(np.prod(eng.input_shape)) * 4
        nbytes = len(request.features)
        if nbytes == 0 or nbytes % per:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"features has {nbytes} bytes; expected a positive multiple of {per} "
                          f"(n samples × {list(eng.input_shape)} float32)")
        xs = np.frombuffer(request.features, dtype="<f4").reshape(-1, *eng.input_shape)
        # A deadline that is no deadline (negative, NaN, inf, sub-µs) is the client's mistake:
        # INVALID_ARGUMENT, never a miss that could open the breaker other clients share.
        try:
            asked = check_deadline_us(request.deadline_us or None, "deadline_us")
        except InputError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        deadline_us = call_budget_us(asked, context.time_remaining())
        if deadline_us is not None and deadline_us < MIN_DEADLINE_US:
            # The client's gRPC deadline has (all but) passed: answer at once, count nothing.
            return pb.PredictResponse(status=pb.PredictResponse.UNAVAILABLE, reason=DEADLINE.reason,
                                      code=DEADLINE.status, model_version=eng.version,
                                      variant=eng.variant)
        try:
            out = run_rows(eng, np.ascontiguousarray(xs, dtype=np.float32), deadline_us)
        except InputError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if isinstance(out, Unavailable):
            return pb.PredictResponse(status=pb.PredictResponse.UNAVAILABLE, reason=out.reason,
                                      code=out.status, model_version=eng.version,
                                      variant=eng.variant)
        if not context.is_active():  # the client left (cancelled / vanished): nothing to send
            return pb.PredictResponse()
        return pb.PredictResponse(status=pb.PredictResponse.OK, outputs=out.astype("<f4").tobytes(),
                                  shape=eng.output_shape, model_version=eng.version,
                                  variant=eng.variant)


SERVICE = "hwbackends.serve.v1.SignalService"


def _add_servicer(servicer: _Servicer, server: Any) -> None:
    pb, _ = _pb()
    add_raw_service(server, SERVICE,
                    {"Predict": (servicer.Predict, pb.PredictRequest, pb.PredictResponse),
                     "Info": (servicer.Info, pb.InfoRequest, pb.InfoResponse)},
                    "hwbackends/serve/proto/signal.proto")


class GrpcServer:
    """Serve engines (``{strategy: Engine}``) over gRPC. ``port=0`` picks a free port.
    ``oip``: an :class:`~hwbackends.serve.oip.OipModels` also served as the Open Inference
    Protocol's ``inference.GRPCInferenceService`` (same port, TLS and token)."""

    def __init__(self, engines: Mapping[str, Engine] | Engine, *, host: str = "127.0.0.1",
                 port: int = 0, tls: TLSFiles | None = None, token: str | None = None,
                 insecure_loopback: bool = False, max_request_bytes: int = 1 << 20,
                 workers: int = 8, max_connections: int = 1000,
                 handshake_timeout_s: float = 5.0, idle_timeout_s: float = 300.0,
                 oip: Any = None):
        grpc = _grpc()
        if isinstance(engines, Engine):
            engines = {engines.strategy: engines}
        check_auth("gRPC", host, tls, token, insecure_loopback)
        for what, v in (("max_connections", max_connections),
                        ("handshake_timeout_s", handshake_timeout_s),
                        ("idle_timeout_s", idle_timeout_s)):
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e7):
                raise ConfigError(f"GrpcServer {what} must be a positive number, got {v!r}")
        interceptors = [_auth_interceptor(token)] if token else []
        self.max_request_bytes = max_request_bytes
        self.fd_limit = raise_fd_limit()
        self.max_connections = connection_cap(int(max_connections), self.fd_limit)
        if self.max_connections < max_connections:
            log.warning("gRPC: at most %d connections (the soft fd limit is %d; %d asked)",
                        self.max_connections, self.fd_limit, max_connections)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hwb-grpc"),
            interceptors=interceptors,
            options=[("grpc.max_receive_message_length", max_request_bytes),
                     ("grpc.max_send_message_length", 16 << 20),
                     ("grpc.so_reuseport", 0),
                     # fds: a cap on connections (over it, closed at once), a deadline for the
                     # handshake (a socket that never speaks TLS/HTTP/2 holds no fd for long),
                     # and an idle limit for connections with no call in flight.
                     ("grpc.max_allowed_incoming_connections", self.max_connections),
                     ("grpc.server_handshake_timeout_ms", int(handshake_timeout_s * 1000)),
                     ("grpc.max_connection_idle_ms", int(idle_timeout_s * 1000))])
        _add_servicer(_Servicer(engines), self._server)
        if oip is not None:  # the Open Inference Protocol's service on the same port
            from .oip_grpc import add_oip_service
            add_oip_service(oip, self._server)
        addr = f"{host}:{port}"
        if tls is not None:
            creds = grpc.ssl_server_credentials([(tls.key_pem, tls.cert_pem)])
            self.port = self._server.add_secure_port(addr, creds)
        else:
            self.port = self._server.add_insecure_port(addr)
        if self.port == 0:
            raise ConfigError(f"could not bind {addr}")
        self.host = host
        self.secure = tls is not None
        self._server.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, grace: float = 1.0) -> None:
        self._server.stop(grace).wait(grace + 5)

    def __enter__(self) -> "GrpcServer":
        return self

    def __exit__(self, *a: Any) -> None:
        self.stop()


class GrpcClient:
    """A client for :class:`GrpcServer` (also what the load-test client uses)."""

    def __init__(self, address: str, *, token: str | None = None, root_cert: bytes | None = None,
                 insecure: bool = False, timeout_s: float = 5.0):
        grpc = _grpc()
        pb, pbg = _pb()
        self.pb = pb
        self.timeout_s = timeout_s
        if insecure:
            host = address.rsplit(":", 1)[0]
            if not is_loopback(host):
                raise ConfigError("an insecure channel is only allowed to a loopback address")
            self._channel = grpc.insecure_channel(address)
        else:
            self._channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_cert))
        self._meta = (("authorization", f"Bearer {token}"),) if token else ()
        self.stub = pbg.SignalServiceStub(self._channel)

    def info(self, strategy: str = "") -> Any:
        return self.stub.Info(self.pb.InfoRequest(strategy=strategy), metadata=self._meta,
                              timeout=self.timeout_s)

    def predict(self, strategy: str, x: np.ndarray, *, batch: bool = False,
                timeout_s: float | None = None, deadline_us: float = 0.0) -> np.ndarray | Unavailable:
        """Outputs for one sample (or ``(n, *out)`` for ``batch=True`` and ``x`` of ``(n, ...)``),
        or :class:`Unavailable`. gRPC errors (auth, bad input, limits) raise ``grpc.RpcError``
        carrying the server's status code and message."""
        x = np.ascontiguousarray(x, dtype="<f4")
        single = not batch
        shape = x.shape[1:] if batch else x.shape
        req = self.pb.PredictRequest(strategy=strategy, features=x.tobytes(), shape=shape,
                                     deadline_us=deadline_us)
        resp = self.stub.Predict(req, metadata=self._meta, timeout=timeout_s or self.timeout_s)
        if resp.status != self.pb.PredictResponse.OK:
            return Unavailable(resp.reason, _status_of(resp.code))
        y = np.frombuffer(resp.outputs, dtype="<f4").reshape(-1, *resp.shape)
        return y[0] if single else y

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "GrpcClient":
        return self

    def __exit__(self, *a: Any) -> None:
        self.close()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _status_of(code: int) -> Status:
    """The :class:`Status` of an UNAVAILABLE answer's ``code``: one a server sends, else (0 from
    a server older than the field, a number this version does not know) plain UNAVAILABLE."""
    try:
        st = Status(code)
    except ValueError:
        return Status.UNAVAILABLE
    return st if st > Status.OK else Status.UNAVAILABLE
