"""Plain data shared by the core and the plugins: tensor specs, modes, availability."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Sequence

#: Target families: the first part of a target's dotted name (``cpu.litert``).
FAMILIES: tuple[str, ...] = ("cpu", "gpu", "tpu", "fpga", "ref")


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model, *per sample*: the batch dimension is not in ``shape``."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    def batched(self, batch: int) -> tuple[int, ...]:
        """The array shape for a batch of ``batch`` samples: ``(batch, *shape)``."""
        return (batch, *self.shape)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (artifact manifests)."""
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TensorSpec":
        """Inverse of :meth:`to_dict`."""
        return cls(d["name"], tuple(int(s) for s in d["shape"]), d.get("dtype", "float32"))

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}[batch, {', '.join(map(str, self.shape))}]"


class Mode(str, Enum):
    """Where a target's artifact runs.

    ``hardware``: on the real device. ``emulated``: the same artifact on a stand-in (hls4ml
    C-simulation, XLA on the CPU instead of a TPU, Edge TPU int8 on the CPU interpreter).
    ``unavailable``: it cannot run here; :attr:`Availability.reason` says why.
    """

    HARDWARE = "hardware"
    EMULATED = "emulated"
    UNAVAILABLE = "unavailable"

    def __str__(self) -> str:
        return self.value


#: Label of figures computed from a model of the hardware (RTL simulation + open synthesis:
#: ``fpga.da4ml``'s ``hardware_estimate``), never measured on it. Reports and the router
#: (``allow_modelled``) show it wherever such a figure appears.
MODELLED = "modelled"


@dataclass(frozen=True)
class Availability:
    """The answer of ``Target.probe()``: can this target run here, how, and why not."""

    mode: Mode
    reason: str = ""
    device: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        """Whether the target can compile and run here (hardware or emulated)."""
        return self.mode is not Mode.UNAVAILABLE

    @classmethod
    def hardware(cls, device: str, reason: str = "", **details: Any) -> "Availability":
        """Runs on the real device; ``device`` names it (``"CPU (AMD EPYC)"``, ``"NVIDIA H100"``)."""
        return cls(Mode.HARDWARE, reason, device, details)

    @classmethod
    def emulated(cls, device: str, reason: str, **details: Any) -> "Availability":
        """The artifact runs on a stand-in: ``device`` names it, ``reason`` says what is
        missing and what stands in (reports and the router never show it as hardware)."""
        return cls(Mode.EMULATED, reason, device, details)

    @classmethod
    def unavailable(cls, reason: str, **details: Any) -> "Availability":
        """Cannot run here; ``reason`` is what a person can act on
        (``"tensorrt not importable (pip install tensorrt)"``)."""
        return cls(Mode.UNAVAILABLE, reason, "", details)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (``hwb targets --json``, reports)."""
        return {"mode": self.mode.value, "reason": self.reason, "device": self.device,
                "details": self.details}


def several(inputs: Sequence[Any], outputs: Sequence[Any]) -> bool:
    """Whether a model with these input and output specs has several tensors either way: the
    one test of "multi-IO" (``Artifact.multi_io``, ``Model.multi_io``, ``Executor.single``)."""
    return len(inputs) > 1 or len(outputs) > 1
