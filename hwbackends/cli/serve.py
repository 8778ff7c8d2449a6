"""``hwb serve MODEL --target T [--grpc-port P --tls-cert C --tls-key K --token-file F]
[--shm NAME] [--metrics-port M]``: serve one compiled variant (or a router strategy with
``--config strategies.toml --strategy S``) until Ctrl-C or ``--duration``."""
from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import threading
from typing import Any

from ..units import parse_port, parse_seconds, parse_us
from . import EXIT_INTERRUPTED, count, number, stderr_progress
from .bench import parse_pin
from .compile import add_model_args, compile_from_args


def parse_batch_sizes(text: str) -> list[int]:
    """``--batch-sizes 1,2,4``: distinct batch sizes (1..``MAX_BATCH``, at most 32 of them,
    each compiled), in ascending order."""
    from ..errors import ConfigError
    from ..units import MAX_BATCH, parse_count

    parts = text.split(",")
    try:
        if len(parts) > 32:
            raise ConfigError("more than 32 sizes")
        sizes = sorted({parse_count(s, 1, MAX_BATCH, "a batch size") for s in parts})
    except ConfigError as exc:
        raise ConfigError(f"{text[:40]!r}: expected batch sizes ≥ 1 separated by commas, e.g. "
                          f"1,2,4 (each at most {MAX_BATCH}, at most 32 of them): {exc}") from None
    return sizes


def parse_serve_pin(text: str) -> list[int] | None:
    """``--pin``: CPU numbers (``1``, ``0,1``, ``2-3``), ``none`` (an empty list: pin nothing,
    the shm serving loop included) or ``auto`` (None: the default)."""
    t = text.strip().lower()
    if t == "auto":
        return None
    if t == "none":
        return []
    return parse_pin(text) or []


def parse_loop_pin(text: str) -> int | str:
    """``--shm-pin``: a CPU number, ``auto`` or ``none``."""
    from ..errors import ConfigError

    t = text.strip().lower()
    if t in ("auto", "none"):
        return t
    from ..units import parse_count
    from .bench import MAX_CPU
    try:
        return parse_count(t, 0, MAX_CPU, "a CPU number")
    except ConfigError:
        raise ConfigError(f"{text[:40]!r}: expected a CPU number 0..{MAX_CPU}, 'auto' or "
                          f"'none'") from None


class _PrintInclude(argparse.Action):
    """Like --version: print the header directory (``-I$(hwb serve --print-include)``), exit."""

    def __call__(self, parser: argparse.ArgumentParser, *a: object, **k: object) -> None:
        from ..serve.shm import INCLUDE_DIR  # no model, no heavy imports
        print(INCLUDE_DIR)
        parser.exit(0)


def add(sub: argparse._SubParsersAction) -> None:
    from ..serve.request import MAX_DEADLINE_US, MIN_DEADLINE_US  # the engine's own bounds
    from ..sliding import MAX_STREAMS

    p = sub.add_parser("serve", help="serve a model over shared memory and/or gRPC, with metrics")
    add_model_args(p)
    for act in p._actions:  # MODEL is optional here: --config serves a router strategy instead
        if act.dest == "model":
            act.nargs, act.default = "?", None
            act.help = "model file or zoo:NAME (omit with --config)"
    p.add_argument("--config", help="strategies.toml: serve a router strategy instead of MODEL "
                                     "(default: serve MODEL)")
    p.add_argument("--strategy", default=None,
                   help="strategy name (with --config), else a label (default: 'default')")
    p.add_argument("--preset", default=None, choices=("single", "latency", "balanced", "throughput"),
                   help="batching policy; default: 'single' for one batch-1 program (nothing to "
                        "batch into: the shm endpoint then answers in its polling thread), "
                        "'latency' with --batch-sizes")
    p.add_argument("--batch-sizes", default=None, type=number(parse_batch_sizes, "batch sizes"),
                   help="comma-separated allowed batch sizes, compiled one variant each (e.g. "
                        "1,2,4; default: one variant at --batch-size)")
    p.add_argument("--deadline-us", type=number(parse_us, "deadline", lo=MIN_DEADLINE_US,
                                                   hi=MAX_DEADLINE_US, lo_open=False), default=None, help="per-call deadline in µs (default: none)")
    p.add_argument("--cache-entries", type=count("cache size", 0, 1 << 20), default=0,
                   help="inference cache size (default 0: off)")
    p.add_argument("--pin", default=None, metavar="CPUS|none|auto", type=number(parse_serve_pin, "pin"),
                   help="cores for the serving thread, e.g. 1 or 0,1 or 2-3; the shm serving loop "
                        "takes the first. 'none': pin nothing (default 'auto': the engine's thread "
                        "not pinned, the shm loop on the last allowed core when there are 2+)")
    p.add_argument("--shm", default=None, metavar="NAME",
                   help="shared-memory endpoint name (default: no shm endpoint)")
    p.add_argument("--shm-slots", type=count("slot count", 1, 1024), default=8,
                   help="client slots of the shm endpoint: clients attached at once (default 8)")
    p.add_argument("--sliding", action="store_true",
                   help="with --shm: serve the model's sliding windows: each request is one tick "
                        "(input shape[1:]) for one of the client's streams, the server keeps "
                        "the windows; a request flagged reset (hwb_shm_reset_stream) empties one")
    p.add_argument("--streams", type=count("stream count", 1, MAX_STREAMS), default=None, metavar="N",
                   help="with --sliding: windows per client, stream ids 0..N-1 (one per symbol; "
                        "each client's own, made on first use, freed when it detaches; default 1)")
    p.add_argument("--shm-mode", default="auto", choices=("auto", "direct", "batch"),
                   help="direct: the shm polling thread runs each request (batch 1, no hand-off); "
                        "batch: through the engine's micro-batching; auto: direct for --preset single")
    p.add_argument("--shm-spin-us", type=number(parse_us, "spin budget", lo_open=False, hi=1e6), default=50.0,
                   help="busy-poll budget of the shm polling thread before it sleeps on a futex")
    p.add_argument("--shm-pin", type=number(parse_loop_pin, "shm pin"), default=None,
                   metavar="CORE|auto|none",
                   help="pin the shm polling thread (default: --pin's first CPU, else auto: the "
                        "last allowed core when there are 2+, printed on start)")
    p.add_argument("--shm-group", default=None,
                   help="open the shm endpoint to this group (default: owner-only)")
    p.add_argument("--print-include", action=_PrintInclude, nargs=0,
                   help="print the directory of hwb_shm.h (the C/C++ shm client) and exit")
    p.add_argument("--grpc-port", type=number(parse_port, "port"), default=None,
                   help="serve gRPC on this port, 0 for any free one (default: no gRPC)")
    p.add_argument("--http", type=number(parse_port, "port"), default=None, metavar="PORT",
                   help="serve the Open Inference Protocol (KServe v2 / Triton HTTP/REST) on this "
                        "port, 0 for any free one (default: no HTTP); the gRPC port speaks it too")
    p.add_argument("--sequences", type=count("sequence count", 1, MAX_STREAMS), default=None,
                   metavar="N",
                   help="with --http/--grpc-port: also serve NAME.window, N windows of "
                        "cm.sliding(streams=N), one per live sequence_id; each request is one "
                        "tick (default: no sequences)")
    p.add_argument("--sequence-form", default="sliding", choices=("sliding", "streaming"),
                   help="sliding: windows with zero state at their start (NAME.window); "
                        "streaming: state kept across ticks (NAME.stream); default sliding")
    p.add_argument("--sequence-idle-s", type=number(parse_seconds, "idle time"), default=None,
                   help="a sequence silent this long may be reclaimed by a new START when all "
                        "windows are live (default 60)")
    p.add_argument("--max-request-bytes", type=count("byte count", 1, 1 << 30), default=1 << 20,
                   help="largest request body/message accepted over HTTP and gRPC (default 1 MiB)")
    p.add_argument("--host", default="127.0.0.1",
                   help="gRPC and HTTP bind address (default loopback)")
    p.add_argument("--tls-cert", help="PEM certificate file (default: none)")
    p.add_argument("--tls-key", help="PEM private key file (default: none)")
    p.add_argument("--token-file",
                   help="file holding the bearer token clients must send (default: none)")
    p.add_argument("--insecure-loopback", action="store_true",
                   help="no TLS and no token (loopback development only)")
    p.add_argument("--metrics-port", type=number(parse_port, "port"), default=None,
                   help="Prometheus /metrics port (default: no metrics endpoint)")
    p.add_argument("--metrics-host", default="127.0.0.1", help="metrics bind address")
    p.add_argument("--duration", type=number(parse_seconds, "duration"), default=None,
                   help="stop after this many seconds (default: until Ctrl-C/SIGTERM)")
    p.set_defaults(func=run)


def _backends(args: argparse.Namespace, strategy_cls: Any) -> Any:
    """What the engine serves: a router strategy (--config), one compiled model per batch size
    (--batch-sizes), or one compiled model."""
    from ..errors import ConfigError

    if args.config:
        from ..context import RunContext
        from ..router import Router
        if not args.strategy:
            raise ConfigError("--config needs --strategy NAME")
        router = Router.from_config(args.config,
                                    context=RunContext.at(args.cache_dir, progress=stderr_progress),
                                    strategies=[args.strategy],
                                    calibration_data=args.calibration_data,
                                    validation_data=args.validation_data)
        return strategy_cls(router, args.strategy)
    if args.batch_sizes:
        backends = {}
        for s in args.batch_sizes:
            args.batch_size = s
            backends[s] = compile_from_args(args, fidelity=False)
        return backends
    return compile_from_args(args, fidelity=False)


def _preset(args: argparse.Namespace, backends: Any) -> str:
    """The batching preset: the one asked for, else chosen from what is served. One program at
    batch 1 has nothing to batch into (a gathered batch runs as that many single calls), so a
    batching window only adds its wait and a thread hand-off per request: measured here, the shm
    p50 was 191 µs under 'latency' against 2 µs with 'single' (direct). An explicit batching
    preset over such a program is kept, with a warning saying so."""
    one_b1 = not isinstance(backends, dict) and int(getattr(backends, "batch_size", 1)) == 1
    if args.preset is None:
        return "single" if one_b1 else "latency"
    if one_b1 and args.preset != "single":
        where = (" and --shm answers through the engine's queue instead of its polling thread"
                 if args.shm and args.shm_mode == "auto" else "")
        print(f"hwb serve: warning: --preset {args.preset} over one batch-1 program batches "
              f"nothing (a gathered batch runs as single calls): each request waits for the "
              f"batching window{where}. Give --batch-sizes 1,2,4 to batch, or use --preset "
              f"single (the default here) for the lowest latency.", file=sys.stderr)
    return args.preset


def run(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..serve import Engine, EngineConfig, RouterStrategy
    from ..serve.metrics import PromMetrics
    if args.grpc_port is None and args.shm is None and args.http is None:
        raise ConfigError("nothing to serve on: give --shm NAME and/or --grpc-port PORT and/or --http PORT")
    if args.sequences is not None and args.grpc_port is None and args.http is None:
        raise ConfigError("--sequences serves over the Open Inference Protocol: give --http PORT "
                          "and/or --grpc-port PORT")
    if not args.config and not args.model:
        raise ConfigError("give a MODEL (file or zoo:NAME) or --config strategies.toml --strategy NAME")
    if args.sliding:
        _check_sliding_args(args)
    elif args.streams is not None:
        raise ConfigError("--streams counts the windows of a sliding endpoint: add --sliding "
                          "(with --shm NAME)")
    backends = _backends(args, RouterStrategy)
    args.preset = _preset(args, backends)
    pin = tuple(args.pin) if args.pin else None  # [] (--pin none): not pinned
    cfg = EngineConfig.preset(args.preset, deadline_us=args.deadline_us,
                              cache_entries=args.cache_entries, pin_cores=pin)
    if args.batch_sizes:
        sizes = sorted(backends)
        cfg = cfg.with_policy(max_batch_size=sizes[-1], allowed_batch_sizes=tuple(sizes))
    prom = PromMetrics() if args.metrics_port is not None else None
    name = args.strategy or "default"
    eng = Engine(backends, cfg, strategy=name, prom=prom).start()
    stops = [eng.stop]
    info: dict = {"strategy": name, "variant": eng.variant, "preset": args.preset,
                  "input_size": math.prod(eng.input_shape),
                  "output_size": math.prod(eng.output_shape)}
    if eng.layout is not None:  # several tensors: where each sits in the float32 record
        info["layout"] = {"inputs": eng.layout[0].to_dict(), "outputs": eng.layout[1].to_dict()}
    try:
        if prom is not None:
            srv, port = prom.serve_http(args.metrics_port, args.metrics_host)
            stops.insert(0, srv.shutdown)
            info["metrics"] = f"http://{args.metrics_host}:{port}/metrics"
        if args.shm:
            _serve_shm(args, eng, stops, info)
        _serve_network(args, name, eng, backends, stops, info)
        done = threading.Event()
        # before the endpoints are printed: a supervisor that stops the server as soon as it
        # reads them (SIGTERM) gets a clean stop, not the default SIGTERM death
        signal.signal(signal.SIGTERM, lambda *a: done.set())
        print(json.dumps(info), flush=True)
        interrupted = _serve_until(done, args.duration)
        if args.json:
            print(json.dumps(eng.stats(), default=str))
    finally:
        for s in stops:
            s()
    if interrupted:
        print("hwb serve: interrupted; endpoints stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def _serve_until(done: threading.Event, duration: float | None) -> bool:
    """Wait for SIGTERM (``done``), ``duration`` seconds or Ctrl-C; whether it was Ctrl-C (a
    clean stop all the same, reported as an interrupt: exit 130)."""
    try:
        done.wait(duration) if duration else done.wait()
    except KeyboardInterrupt:
        return True
    return False


def _serve_network(args: argparse.Namespace, name: str, eng: Any, backends: Any, stops: list,
                   info: dict) -> None:
    """The network endpoints: gRPC (own SignalService and the Open Inference Protocol's
    service) and the protocol's HTTP/REST, with one TLS setting and one token."""
    from ..errors import ConfigError
    from ..serve.grpc_server import GrpcServer, read_tls_files, read_token_file

    tls = token = oip = None
    if args.grpc_port is not None or args.http is not None:
        if args.tls_cert or args.tls_key:
            if not (args.tls_cert and args.tls_key):
                raise ConfigError("give both --tls-cert and --tls-key")
            tls = read_tls_files(args.tls_cert, args.tls_key)
        token = read_token_file(args.token_file) if args.token_file else None
        oip = _oip_models(args, name, eng, backends, info)
    if args.grpc_port is not None:
        g = GrpcServer(eng, host=args.host, port=args.grpc_port, tls=tls, token=token,
                       insecure_loopback=args.insecure_loopback, oip=oip,
                       max_request_bytes=args.max_request_bytes)
        stops.insert(0, g.stop)
        info["grpc"] = g.address
        info["grpc_tls"] = g.secure
    if args.http is not None:
        from ..serve.oip_http import OipHttpServer
        h = OipHttpServer(oip, host=args.host, port=args.http, tls=tls, token=token,
                          insecure_loopback=args.insecure_loopback,
                          max_request_bytes=args.max_request_bytes)
        stops.insert(0, h.stop)
        info["http"] = h.url


def _oip_models(args: argparse.Namespace, name: str, eng: Any, backends: Any, info: dict) -> Any:
    """What the Open Inference Protocol serves: the engine under the strategy's name and the
    model's, and with --sequences, ``NAME.window`` (or ``.stream``) over the compiled model's
    windows. The names go into the start-up JSON (``oip_models``)."""
    from ..errors import ConfigError
    from ..serve.oip import OipModels
    from ..serve.sequences import DEFAULT_IDLE_S, Sequences

    first = backends[min(backends)] if isinstance(backends, dict) else backends
    cm = first.lane.cms[0] if hasattr(first, "lane") else first
    names = [name]
    model_name = str(getattr(cm, "model_name", "") or "")
    if model_name and model_name != name and not any(c in model_name for c in "/?#% \t\r\n"):
        names.append(model_name)
    sequences = {}
    if args.sequences is not None:
        if args.config:
            raise ConfigError("--sequences keeps windows of one compiled model: give MODEL -t "
                              "TARGET, not --config (a router strategy chooses per call)")
        streaming = args.sequence_form == "streaming"
        windows = (cm.streaming if streaming else cm.sliding)(streams=args.sequences)
        seq = Sequences(windows, cm, idle_s=args.sequence_idle_s or DEFAULT_IDLE_S)
        suffix = ".stream" if streaming else ".window"
        sequences = {f"{n}{suffix}": (eng, seq) for n in names}
        info["sequences"] = seq.stats()
        print(f"hwb serve: {args.sequences} sequence windows ({windows.form} form) as "
              f"{', '.join(sequences)}: one tick of {list(seq.step_shape)} per request",
              file=sys.stderr)
    oip = OipModels({n: eng for n in names}, sequences)
    info["oip_models"] = oip.names
    return oip


def _check_sliding_args(args: argparse.Namespace) -> None:
    """``--sliding``: one compiled model behind one shm endpoint, answered in its loop."""
    from ..errors import ConfigError

    if not args.shm:
        raise ConfigError("--sliding serves over shared memory: give --shm NAME")
    if args.grpc_port is not None or args.http is not None:
        raise ConfigError("--sliding serves its windows over --shm only (the gRPC endpoint takes "
                          "whole inputs); drop --grpc-port/--http (over those, --sequences N "
                          "serves a window per sequence id), or run them from another `hwb "
                          "serve` without --sliding")
    if args.config or args.batch_sizes:
        raise ConfigError("--sliding serves one compiled model: give MODEL -t TARGET (no "
                          "--config router strategy, no --batch-sizes)")
    if args.shm_mode == "batch" or args.preset not in (None, "single"):
        raise ConfigError("--sliding answers each tick in the shm polling thread: drop --shm-mode "
                          "batch / a batching --preset")
    if args.streams is not None:
        from ..sliding import check_streams
        check_streams(args.streams)  # before the compile: InputError saying the range


def _loop_pin(args: argparse.Namespace) -> int | str:
    """The shm loop's pin: --shm-pin, else --pin's first CPU ('none' for --pin none), else auto."""
    if args.shm_pin is not None:
        return args.shm_pin  # type: ignore[no-any-return]
    if args.pin is not None:
        return args.pin[0] if args.pin else "none"
    return "auto"


def _serve_shm(args: argparse.Namespace, eng: object, stops: list, info: dict) -> None:
    from ..serve.shm import ShmServer, choose_loop_core, deny_same_user_inspection

    core, line = choose_loop_core(_loop_pin(args))
    # clients' slots are mapped in this process: no other process of the user may read it
    info["shm_non_dumpable"] = deny_same_user_inspection()
    shm = ShmServer(eng, args.shm, slots=args.shm_slots, mode=args.shm_mode,  # type: ignore[arg-type]
                    spin_us=args.shm_spin_us, pin_core=core, group=args.shm_group,
                    sliding=args.sliding,
                    streams=args.streams if args.streams is not None else 1)
    stops.insert(0, shm.close)
    info["shm"] = shm.name
    info["shm_mode"] = shm.mode
    info["shm_pin"] = core
    if shm.window is not None:
        info["shm_sliding"] = shm.window.describe()
        info["tick_size"] = math.prod(shm.window.step_shape)
        print(f"hwb serve: sliding windows of {shm.window.length} ticks, {shm.window.streams} per "
              f"client, one tick of {info['tick_size']} float32 per request ({shm.window.form} "
              f"form, {'C loop calls window_push' if shm.native else 'Python Windows: ' + shm.native_reason})",
              file=sys.stderr)
    print(f"hwb serve: {line}", file=sys.stderr, flush=True)
