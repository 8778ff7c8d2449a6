"""The Keras 3 reader: a ``keras.Model`` as a :class:`~.model.Model` (specs from its layers,
fingerprint from its config and weights, the reference its own call)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .. import batchdim, cost
from ..specs import TensorSpec
from .common import digest, static_shape, unique_names
from .model import Model


def _keras_names(km: Any, kind: str) -> list[str]:
    """Tensor names: ``input``/``output`` for a single tensor (the names every single-tensor
    model shares, whatever its framework called them), else the
    Keras layer names (``keras.Input(name=...)``, the output layers' names)."""
    tensors = km.inputs if kind == "input" else km.outputs
    if len(tensors) == 1:
        return [kind]
    names = list(getattr(km, f"{kind}_names", None) or [])
    if len(names) != len(tensors):
        names = [getattr(t, "name", "") or f"{kind}_{i}" for i, t in enumerate(tensors)]
    return [str(n) for n in names]


def keras_call_input(km: Any, flat: Sequence[Any]) -> Any:
    """``flat`` (one tensor per ``km.inputs``, in order) in the structure of ``km.input``.

    A Keras model keeps the structure it was built with: one tensor (``keras.Model(x, y)``),
    a list of one (a Keras 2 functional JSON: ``"input_layers": [[name, 0, 0]]``), several,
    or a dict. ``clone_model(input_tensors=…)`` refuses any other structure ("input_tensors
    must have the same structure as model.input") and a call warns, so both follow it. A
    ``Sequential`` has no ``input`` until called; it takes one tensor."""
    import keras

    flat = list(flat)
    if isinstance(km, keras.Sequential):
        return flat[0] if len(flat) == 1 else flat
    return keras.tree.pack_sequence_as(km.input, flat)


def from_keras(km: Any, name: str, path: Path | None, lim: cost.Limits | None = None) -> Model:
    unique_names("input", _keras_names(km, "input"), name)
    c = cost.keras_cost(km)
    (lim or cost.Limits.from_env()).check(c, name)
    ins = [TensorSpec(n, static_shape(t.shape[1:], "input", name))
           for n, t in zip(_keras_names(km, "input"), km.inputs, strict=True)]
    outs = [TensorSpec(n, static_shape(t.shape[1:], "output", name))
            for n, t in zip(_keras_names(km, "output"), km.outputs, strict=True)]
    arch = json.dumps(km.get_config(), sort_keys=True, default=str).encode()
    weights = [np.ascontiguousarray(w).tobytes() for w in km.get_weights()]
    fp = digest(b"keras", arch, *weights)

    def ref(*xs: np.ndarray, km: Any = km) -> tuple[np.ndarray, ...]:  # one array per output
        y = km(keras_call_input(km, xs), training=False)
        return tuple(np.asarray(t) for t in (y if isinstance(y, (list, tuple)) else [y]))

    if len(ins) > 1 or len(outs) > 1:
        meta = {} if km.inputs[0].shape[0] is None else {"fixed_batch": int(km.inputs[0].shape[0])}
    else:
        meta = _keras_batch(km, ins[0], ref)
    meta["cost"] = c.to_dict()
    return Model(km, "keras", ins, outs, fp, name, path, meta=meta, _ref=ref)


def _keras_batch(km: Any, inp: TensorSpec, ref: Callable[..., tuple[np.ndarray, ...]]) -> dict[str, Any]:
    """A Keras model built with ``keras.Input(..., batch_size=N)`` usually still runs at any
    batch (Keras layers take the batch from the data); check that rather than assume it."""
    b = km.inputs[0].shape[0]
    if b is None:
        return {}
    b = int(b)
    try:
        ok = ref(np.zeros((b + 1, *inp.shape), np.float32))[0].shape[0] == b + 1
    except Exception:  # noqa: BLE001 - any failure means it runs only at its batch
        ok = False
    if ok:
        return {"batch": batchdim.BatchInfo(b, batchdim.SYMBOLIC, f"built with batch_size={b}; "
                                            f"the Keras model runs at any batch").to_dict()}
    return {"fixed_batch": b, "batch": batchdim.BatchInfo(
        b, batchdim.FIXED, f"built with batch_size={b} and runs only at it").to_dict()}
