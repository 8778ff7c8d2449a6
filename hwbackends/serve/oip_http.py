"""The Open Inference Protocol over HTTP/REST (KServe v2, as Triton serves it), on the
standard library's ``http.server``.

Routes (``{m}`` a served name, optionally followed by ``/versions/{v}``):
``GET /v2/health/live``, ``GET /v2/health/ready``, ``GET /v2`` (server metadata),
``GET /v2/models/{m}`` (model metadata), ``GET /v2/models/{m}/ready``,
``POST /v2/models/{m}/infer`` (JSON tensors, or the binary-tensor extension:
``Inference-Header-Content-Length`` bytes of JSON, then each input's raw little-endian bytes
in the order of its ``binary_data_size`` parameter), and Triton's extensions
``GET /v2/models/{m}/config``, ``GET /v2/models/{m}/stats`` (``/v2/models/stats``: all) and
``POST /v2/repository/index``. Outputs come back as JSON ``data``, or binary when the request
asks (``binary_data`` on an output, or ``binary_data_output`` on the request). Errors are the
protocol's ``{"error": "..."}`` with the status of :data:`hwbackends.serve.oip.HTTP_STATUS`.

Secure as the gRPC endpoint is: TLS and a bearer token (``Authorization: Bearer <token>``,
constant-time compare, on every route) unless ``insecure_loopback=True`` on a loopback
address. Hostile input is bounded before it is parsed: a body needs a ``Content-Length`` of
at most ``max_request_bytes`` (413 otherwise, without reading it; chunked bodies are 411),
the JSON must be an object whose parts have the expected types (JSON nested deeper than the
decoder's recursion limit is a 400), every tensor is checked against the model (name,
``FP32``, shape, element count) and carries no NaN/Inf. Each connection is served by its own
thread, at most ``max_connections`` at once (more are closed at once); a connection that sends
nothing for ``timeout_s`` (its TLS handshake included) is closed.
"""
from __future__ import annotations

import json
import logging
import math
import os
import ssl
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

import numpy as np

from ..errors import ConfigError
from .grpc_server import TLSFiles, bearer_matches, check_auth
from .oip import HTTP_STATUS, InTensor, OipError, OipModels

log = logging.getLogger("hwbackends.serve")

#: The most dimensions a request tensor's shape may have.
MAX_RANK = 16


def _tls_context(tls: TLSFiles) -> ssl.SSLContext:
    """A server context from PEM bytes (``load_cert_chain`` reads files: written to a private
    temporary directory and removed at once)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="hwb-tls-") as d:
        os.chmod(d, 0o700)
        cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
        for path, data in ((cert, tls.cert_pem), (key, tls.key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        try:
            ctx.load_cert_chain(cert, key)
        except ssl.SSLError as exc:
            raise ConfigError(f"the TLS certificate/key do not load ({exc}); give a PEM "
                              f"certificate chain and its private key") from None
    return ctx


def _shape(v: Any, where: str) -> tuple[int, ...]:
    if not isinstance(v, list) or len(v) > MAX_RANK or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 31 for d in v):
        raise OipError(f"{where}: shape must be a list of at most {MAX_RANK} whole numbers ≥ 0")
    return tuple(v)


def _params(v: Any, where: str) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise OipError(f"{where}: parameters must be a JSON object")
    return v


def _input(k: int, t: Any, rest: bytes, offset: int) -> tuple[InTensor, int]:
    """Input ``k`` of a request: the tensor, and the binary bytes it took from ``rest`` at
    ``offset``."""
    if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not isinstance(t.get("datatype"), str):
        raise OipError(f"inputs[{k}] must be an object with string 'name' and 'datatype'")
    where = f"input {t['name'][:100]!r}"
    shape = _shape(t.get("shape"), where)
    tp = _params(t.get("parameters"), where)
    count = math.prod(shape)  # exact: a hostile shape cannot wrap around
    used = 0
    if t["datatype"] != "FP32":  # the model check names it; other types are not decoded
        data = np.empty(0, np.float32)
    elif "binary_data_size" in tp:
        size = tp["binary_data_size"]
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= len(rest) - offset:
            raise OipError(f"{where}: binary_data_size {size!r:.40} is not within the "
                           f"{len(rest) - offset} binary bytes left")
        if size != 4 * count:
            raise OipError(f"{where}: binary_data_size is {size} bytes; shape {list(shape)} of "
                           f"FP32 needs {4 * count}")
        data = np.frombuffer(rest, "<f4", count, offset).astype(np.float32, copy=False)
        used = size
    else:
        raw = t.get("data")
        if not isinstance(raw, list):
            raise OipError(f"{where}: 'data' must be a list of numbers (or send it binary "
                           f"with parameters.binary_data_size)")
        try:
            data = np.asarray(raw, dtype=np.float32).ravel()
        except (TypeError, ValueError, OverflowError):
            raise OipError(f"{where}: 'data' must be numbers (a flat list, or nested as the "
                           f"shape)") from None
    if data.size and not np.isfinite(data).all():
        raise OipError(f"{where} holds NaN or Inf; send finite float32 features")
    return InTensor(t["name"], t["datatype"], shape, data), used


def _outputs(outs: Any) -> tuple[list[str] | None, dict[str, bool]]:
    """The requested output names (None: all) and which of them asked for binary data."""
    binary: dict[str, bool] = {}
    if outs is None:
        return None, binary
    if not isinstance(outs, list) or len(outs) > 64:
        raise OipError("'outputs' must be a list of at most 64 {name, parameters} objects")
    requested = []
    for k, o in enumerate(outs):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise OipError(f"outputs[{k}] must be an object with a string 'name'")
        op = _params(o.get("parameters"), f"output {o['name'][:100]!r}")
        requested.append(o["name"])
        if "binary_data" in op:
            binary[o["name"]] = op["binary_data"] is True
    return requested, binary


def parse_infer(body: bytes, header_len: int | None) -> tuple[list[InTensor], list[str] | None, dict[str, Any], dict[str, bool], str | None]:
    """Decode an infer body: ``(inputs, requested output names or None, request parameters,
    {output name: binary?}, request id)``; OipError for anything malformed."""
    if header_len is None:
        head, rest = body, b""
    else:
        if not 0 <= header_len <= len(body):
            raise OipError(f"Inference-Header-Content-Length {header_len} is beyond the body's "
                           f"{len(body)} bytes")
        head, rest = body[:header_len], body[header_len:]
    try:
        req = json.loads(head)
    except RecursionError:
        raise OipError("the request JSON is nested too deeply") from None
    except ValueError as exc:
        raise OipError(f"the request body is not JSON ({exc})") from None
    if not isinstance(req, dict):
        raise OipError("the request JSON must be an object with an 'inputs' list")
    params = _params(req.get("parameters"), "request")
    rid = req.get("id")
    if rid is not None and not isinstance(rid, str):
        raise OipError("the request id must be a string")
    ins = req.get("inputs")
    if not isinstance(ins, list) or not ins:
        raise OipError("the request needs 'inputs': a non-empty list of tensors")
    if len(ins) > 64:
        raise OipError("a request may carry at most 64 input tensors")
    inputs: list[InTensor] = []
    offset = 0
    for k, t in enumerate(ins):
        tensor, used = _input(k, t, rest, offset)
        inputs.append(tensor)
        offset += used
    if offset != len(rest):
        raise OipError(f"the body has {len(rest) - offset} binary bytes that no input's "
                       f"binary_data_size claims")
    requested, binary = _outputs(req.get("outputs"))
    return inputs, requested, params, binary, rid


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"
    protocol_version = "HTTP/1.1"
    # One segment per reply, sent at once: the status line, headers and body are buffered and
    # flushed together at the end of the request (http.server flushes wfile then), and Nagle's
    # algorithm is off. Unbuffered, the body is a second small write that waits for the
    # client's delayed ACK (measured: 22 requests/s, p99 56 ms under perf_analyzer).
    wbufsize = 1 << 16
    disable_nagle_algorithm = True
    server_version = "hwbackends-oip"
    sys_version = ""

    def setup(self) -> None:
        self.timeout = self.server.timeout_s
        super().setup()
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()  # under the socket timeout, in this thread

    def log_message(self, format: str, *args: Any) -> None:  # no log line per request
        pass

    # -- replies ---------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, ctype: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode())

    def _error(self, exc: OipError, close: bool = False) -> None:
        if close:
            self.close_connection = True
        self._send(HTTP_STATUS.get(exc.kind, 400), json.dumps({"error": str(exc)}).encode(),
                   headers={"Connection": "close"} if close else None)

    # -- routing ---------------------------------------------------------------------------
    def _authorised(self) -> bool:
        token = self.server.token
        if token is None or bearer_matches(self.headers.get("Authorization"), token):
            return True
        self._error(OipError("missing or wrong token: send the header 'Authorization: Bearer "
                             "<token>'", "unauthenticated"), close=True)
        return False

    def _route(self, method: str) -> None:
        if not self._authorised():
            return
        path = self.path.split("?", 1)[0]
        parts = [unquote(p) for p in path.split("/") if p]
        try:
            if method == "POST":
                body = self._body()
                if body is None:
                    return
            else:
                body = b""
                if self.headers.get("Content-Length") not in (None, "0"):
                    self.close_connection = True  # the unread body cannot start the next request
                    raise OipError("a GET takes no body")
            self._dispatch(method, parts, body)
        except OipError as exc:
            self._error(exc, close=self.close_connection)
        except Exception as exc:  # a fault of ours, not the client's: 500, and say so in the log
            log.exception("HTTP %s %s failed", method, self.path[:200])
            self._send(500, json.dumps({"error": f"internal error ({type(exc).__name__}); the "
                                                 f"server log has the details"}).encode())

    def _body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding"):
            self._send(411, json.dumps({"error": "send the body with a Content-Length (chunked "
                                                 "transfer encoding is not accepted)"}).encode(),
                       headers={"Connection": "close"})
            self.close_connection = True
            return None
        if self.headers.get("Content-Encoding", "identity").lower() != "identity":
            raise OipError("compressed request bodies are not accepted; send identity encoding",
                           "unsupported")
        raw = self.headers.get("Content-Length")
        try:
            n = int(raw) if raw is not None else -1
        except ValueError:
            n = -1
        if n < 0:
            self._error(OipError("a POST needs a Content-Length header (a whole number of "
                                 "bytes)"), close=True)
            return None
        cap = self.server.max_request_bytes
        if n > cap:
            self._error(OipError(f"the request body is {n} bytes; this endpoint takes at most "
                                 f"{cap} (hwb serve --max-request-bytes)", "too_large"), close=True)
            return None
        return self.rfile.read(n)

    def _dispatch(self, method: str, parts: list[str], body: bytes) -> None:
        models = self.server.models
        if parts[:1] != ["v2"]:
            raise OipError(f"no route {self.path[:200]!r}; the protocol's routes start with /v2",
                           "not_found")
        rest = parts[1:]
        if method == "GET" and rest == []:
            return self._json(200, models.server_metadata())
        if method == "GET" and rest[:1] == ["health"] and len(rest) == 2 and rest[1] in ("live", "ready"):
            ok = models.live() if rest[1] == "live" else models.ready()
            return self._send(200 if ok else 503, b"")
        if rest == ["repository", "index"] and method == "POST":
            return self._json(200, models.repository_index())
        if rest == ["models", "stats"] and method == "GET":
            return self._json(200, models.model_stats())
        if rest[:1] == ["models"] and len(rest) >= 2:
            name, tail = rest[1], rest[2:]
            version = ""
            if tail[:1] == ["versions"] and len(tail) >= 2:
                version, tail = tail[1], tail[2:]
            if method == "GET" and tail == []:
                return self._json(200, models.model_metadata(name, version))
            if method == "GET" and tail == ["ready"]:
                ok = models.model_ready(name, version)
                return self._send(200 if ok else 400, b"")
            if method == "GET" and tail == ["config"]:
                return self._json(200, models.model_config(name, version))
            if method == "GET" and tail == ["stats"]:
                return self._json(200, models.model_stats(name, version))
            if method == "POST" and tail == ["infer"]:
                return self._infer(name, version, body)
        raise OipError(f"no route {method} {self.path[:200]!r}", "not_found")

    def _infer(self, name: str, version: str, body: bytes) -> None:
        raw = self.headers.get("Inference-Header-Content-Length")
        header_len = None
        if raw is not None:
            try:
                header_len = int(raw)
            except ValueError:
                raise OipError("Inference-Header-Content-Length must be a whole number") from None
        inputs, requested, params, binary, rid = parse_infer(body, header_len)
        served, outs = self.server.models.infer(name, version, inputs, requested, params)
        all_binary = params.get("binary_data_output") is True
        reply: dict[str, Any] = {"model_name": served.name, "model_version": served.versions[0]}
        if rid is not None:
            reply["id"] = rid
        tensors, blobs = [], []
        for o in outs:
            t: dict[str, Any] = {"name": o.name, "datatype": "FP32", "shape": list(o.shape)}
            if binary.get(o.name, all_binary):
                blob = np.ascontiguousarray(o.data, "<f4").tobytes()
                t["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:
                t["data"] = o.data.ravel().tolist()
            tensors.append(t)
        reply["outputs"] = tensors
        head = json.dumps(reply).encode()
        if blobs:
            self._send(200, head + b"".join(blobs), "application/octet-stream",
                       {"Inference-Header-Content-Length": str(len(head))})
        else:
            self._send(200, head)

    def do_GET(self) -> None:  # noqa: N802 (http.server's names)
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._error(OipError(f"no route {self.command} {self.path[:200]!r}: the protocol uses GET "
                             f"and POST", "not_found"), close=True)

    do_DELETE = do_PATCH = do_PUT


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 64

    models: OipModels
    token: str | None
    max_request_bytes: int
    timeout_s: float
    ssl_context: ssl.SSLContext | None

    def __init__(self, addr: tuple[str, int], max_connections: int):
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(addr, _Handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = self.socket.accept()
        if self.ssl_context is not None:  # the handshake runs in the connection's thread
            sock = self.ssl_context.wrap_socket(sock, server_side=True,
                                                do_handshake_on_connect=False)
        return sock, addr

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):  # over the cap: closed at once
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a peer that hung up, timed out or failed its handshake: nothing to report


class OipHttpServer:
    """Serve :class:`~hwbackends.serve.oip.OipModels` over HTTP/REST (see the module
    docstring). ``port=0`` picks a free port; the server runs in a background thread."""

    def __init__(self, models: OipModels, *, host: str = "127.0.0.1", port: int = 0,
                 tls: TLSFiles | None = None, token: str | None = None,
                 insecure_loopback: bool = False, max_request_bytes: int = 1 << 20,
                 max_connections: int = 64, timeout_s: float = 30.0):
        check_auth("HTTP", host, tls, token, insecure_loopback)
        for what, v in (("max_request_bytes", max_request_bytes), ("max_connections", max_connections),
                        ("timeout_s", timeout_s)):
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e10):
                raise ConfigError(f"OipHttpServer {what} must be a positive number, got {v!r}")
        try:
            srv = _Server((host, port), int(max_connections))
        except OSError as exc:
            raise ConfigError(f"could not bind {host}:{port} for HTTP ({exc})") from None
        srv.models = models
        srv.token = token
        srv.max_request_bytes = int(max_request_bytes)
        srv.timeout_s = float(timeout_s)
        srv.ssl_context = _tls_context(tls) if tls is not None else None
        self._srv = srv
        self.host = host
        self.port = srv.server_address[1]
        self.secure = tls is not None
        self._thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="hwb-oip-http", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"{'https' if self.secure else 'http'}://{self.host}:{self.port}"

    def stop(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()
        self._thread.join(5)

    def __enter__(self) -> "OipHttpServer":
        return self

    def __exit__(self, *a: Any) -> None:
        self.stop()
