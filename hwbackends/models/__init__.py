"""Source models: load Keras 3, PyTorch or ONNX; specs, a stable fingerprint, the reference.

One type (:mod:`.model`), a reader per format (:mod:`.keras`, :mod:`.onnx`, :mod:`.torch`,
as hls4ml's ``converters/{keras,onnx,pytorch}_to_hls``), other toolchains' old formats
(:mod:`.legacy`), and :mod:`.load`, which picks the reader.

Frameworks are imported only when a model of their kind is loaded, so ``import hwbackends``
stays light.
"""
from __future__ import annotations

from .keras import keras_call_input
from .load import SOURCES, load_model, load_saved, register_source
from .model import FORMATS, KERAS_SUFFIXES, Model

__all__ = ["FORMATS", "KERAS_SUFFIXES", "Model", "SOURCES", "keras_call_input", "load_model",
           "load_saved", "register_source"]
