"""Per-variant check: every wrong ``x``/``out`` raises ``InputError`` (the guard of
:class:`~hwbackends.target.Executor`), and the executor keeps working after."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..compiled import CompiledModel
from ..errors import InputError
from ..target import Target
from .context import Conformance, ConformanceError, Variant, io_arrays


def bad_input_cases(cm: CompiledModel, target: Target) -> dict[str, tuple[Any, Any]]:
    """Wrong calls of ``predict_into`` that must raise :class:`InputError`."""
    b = cm.batch_size
    xs, os_ = cm.input.batched(b), cm.output.batched(b)
    f32 = np.float32
    x, out = np.zeros(xs, f32), np.zeros(os_, f32)
    cases: dict[str, tuple[Any, Any]] = {
        "x with one feature too many": (np.zeros((*xs[:-1], xs[-1] + 1), f32), out),
        "x without the batch dimension": (np.zeros(xs[1:], f32), out),
        "x with batch_size+1 rows (out has batch_size)": (np.zeros((b + 1, *xs[1:]), f32), out),
        "x float64": (np.zeros(xs, np.float64), out),
        "x int32": (np.zeros(xs, np.int32), out),
        "x non-contiguous": (np.zeros((*xs[:-1], 2 * xs[-1]), f32)[..., ::2], out),
        "x a list": (x.tolist(), out),
        "out with the wrong shape": (x, np.zeros((*os_[:-1], os_[-1] + 1), f32)),
        "out float64": (x, np.zeros(os_, np.float64)),
        "out non-contiguous": (x, np.zeros((*os_[:-1], 2 * os_[-1]), f32)[..., ::2]),
        "out read-only": (x, np.zeros(os_, f32)),
    }
    cases["out read-only"][1].flags.writeable = False
    if xs[-1] != 1:  # broadcastable into the input buffer: silently wrong if not refused
        cases["x with last dimension 1 (broadcastable)"] = (np.zeros((*xs[:-1], 1), f32), out)
    if target.static_batch:
        cases["x and out with batch_size+1 rows on a static-batch variant"] = (
            np.zeros((b + 1, *xs[1:]), f32), np.zeros((b + 1, *os_[1:]), f32))
    return cases


#: Cases an executor may either refuse with InputError or serve correctly: a buffered
#: executor copies a strided array into its own buffer (or out of it) correctly; one that
#: hands raw pointers to a device must refuse it.
STRIDED = ("x non-contiguous", "out non-contiguous")


def check_strided(cm: CompiledModel, label: str, x: np.ndarray, ref: np.ndarray) -> str | None:
    """None if the strided call was refused with InputError or served correctly, else what
    went wrong."""
    bx = np.zeros((*x.shape[:-1], 2 * x.shape[-1]), np.float32)[..., ::2]
    bx[...] = x
    bo = np.zeros((*ref.shape[:-1], 2 * ref.shape[-1]), np.float32)[..., ::2]
    if label == "x non-contiguous":
        bo = np.zeros_like(ref)
    else:
        bx = x
    try:
        cm.predict_into(bx, bo)
    except InputError:
        return None
    except Exception as exc:
        return f"{label}: raised {type(exc).__name__} ({exc!s:.120}), not InputError"
    if not np.array_equal(np.asarray(bo), ref):
        return f"{label}: accepted, but the result differs from the contiguous call"
    return None


def check_bad_inputs(ctx: Conformance, v: Variant) -> str:
    """Every wrong ``x``/``out`` raises :class:`~hwbackends.errors.InputError` with a message
    (a strided array may instead be served correctly, see :data:`STRIDED`), the process
    survives, and the next correct call gives the same result as before."""
    cm = ctx.compiled(v)
    x, ref = io_arrays(cm, seed=5)
    cm.predict_into(x, ref)
    wrong = []
    for label, (bx, bo) in bad_input_cases(cm, ctx.target).items():
        if label in STRIDED:
            err = check_strided(cm, label, x, ref)
            if err:
                wrong.append(err)
            continue
        try:
            cm.predict_into(bx, bo)
        except InputError as exc:
            if not str(exc).strip():
                wrong.append(f"{label}: InputError without a message")
        except Exception as exc:
            wrong.append(f"{label}: raised {type(exc).__name__} ({exc!s:.120}), not InputError")
        else:
            wrong.append(f"{label}: accepted")
    for label, bad_x in (("predict() with a wrong shape", np.zeros((3, 999), np.float32)),
                         ("predict() with NaN", np.full(cm.input.batched(1), np.nan, np.float32))):
        try:
            cm.predict(bad_x)
            wrong.append(f"{label}: accepted")
        except InputError:
            pass
        except Exception as exc:
            wrong.append(f"{label}: raised {type(exc).__name__}, not InputError")
    out = np.full_like(ref, np.nan)
    cm.predict_into(x, out)
    if not np.array_equal(out, ref):
        wrong.append("after the wrong calls, a correct call gives a different result")
    if wrong:
        raise ConformanceError(
            f"{cm.variant}: predict_into must raise hwbackends.errors.InputError for a wrong "
            f"array (check shape, dtype and C-contiguity of x and out before touching the "
            f"library; call hwbackends.target.check_io in the error path):\n  - " + "\n  - ".join(wrong))
    return f"{len(bad_input_cases(cm, ctx.target)) + 2} wrong calls refused with InputError"
