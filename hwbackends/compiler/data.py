"""Data selection: which calibration and validation inputs a compile uses, checked, with
where each came from (:mod:`hwbackends.samples`)."""
from __future__ import annotations

import dataclasses
from typing import Any

from ..models import Model


def select_data(m: Model, calibration_data: Any, validation_data: Any,
          uses_calib: bool) -> tuple[Any, Any, dict[str, Any]]:
    """Calibration inputs, validation inputs, and where each came from (hwbackends/samples.py;
    tuples, one array per input, for a multi-input model).

    Validation data is ``validation_data``, else the model's own. With explicit calibration
    data it is all validation data (or, without any, the calibration data itself, labelled
    *not held out*); without, calibration and validation are the two disjoint halves of the
    validation data (at most 256/512 samples of a model's own data, enough for a stable
    correlation while a compile stays quick; up to
    :data:`~hwbackends.samples.MAX_CALIBRATION`/``MAX_VALIDATION`` of data given here). No
    data at all: seeded synthetic N(0,1), and the label says so."""
    from .. import samples as S

    cal = S.as_samples(calibration_data, m.inputs, "calibration_data") if calibration_data is not None else None
    val = S.as_samples(validation_data, m.inputs, "validation_data") if validation_data is not None else None
    if val is None and m.validation_data is not None:
        val = S.Samples(m.validation_data, S.own_source(m.meta, S.count(m.validation_data)))

    def capped(x: S.Samples, limit: int) -> tuple[Any, S.DataSource]:
        n = S.count(x.arrays)
        if n <= limit:
            return S.head(x.arrays, n), x.source
        return S.head(x.arrays, limit), x.source.part(f"the first {limit} samples", limit)

    if cal is not None:
        calib, csrc = capped(cal, S.MAX_CALIBRATION)
        if val is not None:
            v, vsrc = capped(val, S.MAX_VALIDATION)
        else:
            v, vsrc = capped(cal, S.MAX_VALIDATION)
            vsrc = dataclasses.replace(vsrc, label=f"{vsrc.label}: the calibration data itself, "
                                                   f"not held out (give validation data for a "
                                                   f"held-out check)")
    elif val is not None and S.count(val.arrays) >= 2:
        n = S.count(val.arrays)
        half = n // 2
        own = val.source.kind == "model"
        kc, kv = (256, 512) if own else (S.MAX_CALIBRATION, S.MAX_VALIDATION)
        calib = S.rows(val.arrays, 0, min(half, kc))
        v = S.rows(val.arrays, half, half + min(n - half, kv))
        nc, nv = S.count(calib), S.count(v)
        csrc = val.source.part(f"samples 0–{nc - 1}", nc)
        vsrc = val.source.part(f"samples {half}–{half + nv - 1} (held out from calibration)", nv)
    else:
        # Noise is generated only where it is used: calibration only for a calibrated
        # precision, and each set within S.SYNTHETIC_BYTES.
        calib, csrc = _synthetic(m, 256, 0) if uses_calib else (None, None)
        if val is not None:
            v, vsrc = capped(val, S.MAX_VALIDATION)
        else:
            v, vsrc = _synthetic(m, 512, 1)
    data = {"validation": vsrc.to_dict(), "calibration": csrc.to_dict() if uses_calib else None}
    return calib, v, data


def _synthetic(m: Model, n: int, seed: int) -> tuple[Any, Any]:
    """Up to ``n`` seeded N(0,1) samples (the first rows of the ``n`` the seed gives) and
    their source."""
    from .. import samples as S

    k = S.synthetic_count(m.inputs, n)
    return m.synthetic(k, seed), S.synthetic(k, seed)
