"""cpu.native's C for a model with several inputs or outputs (a layer IR
:class:`~hwbackends.layer_ir.multi.MultiNetwork`): each input's chain, the merge, the trunk
and one head per output, in one function over fixed shapes, with every chain emitted by the
single-chain :class:`~.emit.Emitter` (so each layer is the same C as in a one-input model).

**The C ABI** (docs/targets.md, "cpu.native with several inputs or outputs"): two forms of the
same computation, both in ``libhwb_model.so`` and declared by ``hwb_model.h``:

* ``hwb_model_predict_multi_n(xs, ys, n)``: one C-contiguous float32 buffer per tensor
  (``xs[i]`` holds ``n`` samples of input ``i``, ``ys[k]`` of output ``k``, the model's order)
  — what the CPython extension's ``predict_into(xs, outs)`` calls on the caller's arrays, no
  copies;
* ``hwb_model_predict(x, y)`` / ``hwb_model_predict_n``: one *packed record* per sample each
  way, the tensors flattened in C order one after another in the model's order — exactly
  :class:`hwbackends.packing.Layout` (the record the serving engine, the shared-memory
  endpoint and gRPC move). ``HWB_MODEL_INPUT_SIZE`` / ``HWB_MODEL_OUTPUT_SIZE`` are the
  records' sizes, and ``HWB_MODEL_INPUT_<i>_OFFSET`` / ``_SIZE`` / ``_SHAPE`` / ``_NAME``
  place each tensor in them.

The NaN rule holds per sample over all inputs: a NaN or ±Inf anywhere in any input gives NaN
in every output. fp32 only: int8 calibrates one input tensor and ``fixed`` is hls4ml's
single-chain graph, so both refuse such a model by name. There is no sliding window (it
slides one input's time axis)."""
from __future__ import annotations

import numpy as np

from hwbackends import layer_ir as ir
from hwbackends.contract import UnsupportedError, c_string
from hwbackends.layer_ir.multi import MultiNetwork

from .emit import MAX_STACK_BYTES, Emitter, Source, assemble, vector_shape


def _prod(s: tuple[int, ...]) -> int:
    return int(np.prod(s, dtype=np.int64)) if s else 1


def offsets(sizes: list[int]) -> list[int]:
    """Each tensor's offset in the packed record (packing.Layout's)."""
    return [int(v) for v in np.concatenate([[0], np.cumsum(sizes)[:-1]])] if sizes else []


def emit_multi(net: MultiNetwork, requires: list[str], precision: str = "fp32",
               conv_algorithm: str = "auto") -> Source:
    """``net`` as C (see the module's doc): ``hwb_model_predict[_n]`` over packed records and
    ``hwb_model_predict_multi[_n]`` over one buffer per tensor; ``conv_algorithm`` as
    :func:`.emit.emit`'s."""
    if precision != "fp32":
        raise UnsupportedError(f"cpu.native compiles models with several inputs or outputs at "
                               f"precision 'fp32'; {precision!r} is for one input and one output "
                               f"(int8 calibrates one input tensor, fixed follows hls4ml's "
                               f"single-chain graph)")
    vw, acc = vector_shape(requires)
    e = Emitter(ir.Network(net.name, net.merged_shape, net.trunk), vw, acc, conv_algorithm)
    n_in = [_prod(s) for s in net.input_shapes]
    n_out = [_prod(s) for s in net.output_shapes]
    parts = []
    for b in net.branches:
        e.line(f"/* input {b.input}: {len(b.layers)} layer(s), {b.input_shape} -> {b.output_shape} */")
        parts.append(e.chain(b.layers, f"x{b.input}", b.input_shape))
    merged = _merge(e, net, parts)
    e.line(f"/* trunk: {len(net.trunk)} layer(s), {net.merged_shape} -> {net.trunk_shape} */")
    trunk = e.chain(net.trunk, merged, net.merged_shape)
    for k, (h, size) in enumerate(zip(net.heads, n_out, strict=True)):
        e.line(f"/* output {k}: {len(h.layers)} layer(s) -> {net.output_shapes[k]} */")
        o = e.chain(h.layers, trunk, net.trunk_shape)
        e.line(f"for (int i = 0; i < {size}; i++) y{k}[i] = {o}[i];")
    if e.stack > MAX_STACK_BYTES:
        raise UnsupportedError(f"cpu.native: model {net.name!r} needs {e.stack >> 10} KiB of "
                               f"intermediate tensors (at most {MAX_STACK_BYTES >> 10} KiB on the "
                               f"stack); use cpu.litert or cpu.onnxruntime for a model this size")
    xs = ", ".join(f"const float *restrict x{i}" for i in range(len(n_in)))
    ys = ", ".join(f"float *restrict y{k}" for k in range(len(n_out)))
    multi_one = ["/* One sample, one buffer per tensor (inputs and outputs must not overlap). */",
                 f"HWB_INLINE void hwb_multi_one({xs}, {ys}) {{", *e.body, "}", ""]
    # hwb_one (emit._assemble's per-sample function) is the packed record's view of it
    oi, oo = offsets(n_in), offsets(n_out)
    e.consts += multi_one
    e.body = ["    hwb_multi_one(" + ", ".join([*(f"x + {o}" for o in oi), *(f"y + {o}" for o in oo)]) + ");"]
    src = assemble(e, sum(n_in), sum(n_out))
    src.code += _multi_entry(n_in, n_out)
    return src


def _merge(e: Emitter, net: MultiNetwork, parts: list[str]) -> str:
    """The branches' outputs ``parts`` merged into a new buffer (or the one branch's)."""
    shape = net.merged_shape
    if net.merge == "none":
        return parts[0]
    o = e.buf(_prod(shape))
    if net.merge == "add":
        e.line(f"/* merge: add of {len(parts)} inputs' chains */")
        e.line(f"for (int i = 0; i < {_prod(shape)}; i++) {o}[i] = " + " + ".join(f"{p}[i]" for p in parts) + ";")
        return o
    e.line(f"/* merge: concatenation of {len(parts)} inputs' chains on the last axis */")
    rows, width, off = _prod(shape[:-1]), shape[-1], 0
    for b, p in zip(net.branches, parts, strict=True):
        c = b.output_shape[-1]
        e.line(f"for (int r = 0; r < {rows}; r++) for (int i = 0; i < {c}; i++) "
               f"{o}[r * {width} + {off} + i] = {p}[r * {c} + i];")
        off += c
    return o


def _multi_entry(n_in: list[int], n_out: list[int]) -> str:
    """``hwb_model_predict_multi[_n]``: the same samples, one buffer per tensor."""
    xs = ", ".join(f"xs[{i}] + s * {n}" for i, n in enumerate(n_in))
    ys = ", ".join(f"ys[{k}] + s * {n}" for k, n in enumerate(n_out))
    check = "\n".join(f"        for (int j = 0; j < {n}; j++) bad |= !(__builtin_fabsf(xs[{i}][s * {n} + j]) <= 3.40282347e38f);"
                      for i, n in enumerate(n_in))
    nan = "\n".join(f"            for (int j = 0; j < {n}; j++) ys[{k}][s * {n} + j] = __builtin_nanf(\"\");"
                    for k, n in enumerate(n_out))
    return f"""
/* several inputs and outputs, one buffer per tensor (hwb_model.h) */
int hwb_model_predict_multi_n(const float *const *xs, float *const *ys, long n) {{
    for (long s = 0; s < n; s++) hwb_multi_one({xs}, {ys});
    for (long s = 0; s < n; s++) {{ /* the NaN rule, over every input of the sample */
        int bad = 0;
{check}
        if (__builtin_expect(bad, 0)) {{
{nan}
        }}
    }}
    return 0;
}}

int hwb_model_predict_multi(const float *const *xs, float *const *ys) {{
    return hwb_model_predict_multi_n(xs, ys, HWB_MODEL_BATCH);
}}
"""


def header_extra(names_in: list[str], shapes_in: list[tuple[int, ...]], names_out: list[str],
                 shapes_out: list[tuple[int, ...]]) -> str:
    """``hwb_model.h``'s lines for several tensors: their count, names, shapes, sizes and
    offsets in the packed records, and the one-buffer-per-tensor calls."""
    lines = ["/* Several inputs and outputs. hwb_model_predict[_n] take one packed record per sample",
             "   each way: the tensors flattened in C order one after another, in the model's order, at",
             "   HWB_MODEL_INPUT_<i>_OFFSET / HWB_MODEL_OUTPUT_<k>_OFFSET (hwbackends.packing.Layout's",
             "   record; HWB_MODEL_INPUT_SIZE / HWB_MODEL_OUTPUT_SIZE are the records' sizes).",
             "   hwb_model_predict_multi[_n] take one C-contiguous float32 buffer per tensor instead:",
             "   xs[i] holds the samples of input i, ys[k] of output k; none may overlap. A NaN or",
             "   Inf in any input of a sample gives NaN in every output of it. Return 0. */",
             "#define HWB_MODEL_MULTI_IO 1",
             f"#define HWB_MODEL_INPUTS {len(shapes_in)}", f"#define HWB_MODEL_OUTPUTS {len(shapes_out)}"]
    for side, names, shapes in (("INPUT", names_in, shapes_in), ("OUTPUT", names_out, shapes_out)):
        sizes = [_prod(s) for s in shapes]
        for i, (name, s, n, o) in enumerate(zip(names, shapes, sizes, offsets(sizes), strict=True)):
            lines += [f"#define HWB_MODEL_{side}_{i}_NAME {c_string(name)}",
                      f"#define HWB_MODEL_{side}_{i}_RANK {len(s)}",
                      f"#define HWB_MODEL_{side}_{i}_SHAPE {{{', '.join(str(d) for d in s)}}}",
                      f"#define HWB_MODEL_{side}_{i}_SIZE {n}",
                      f"#define HWB_MODEL_{side}_{i}_OFFSET {o}"]
    lines += ["int hwb_model_predict_multi(const float *const *xs, float *const *ys);",
              "int hwb_model_predict_multi_n(const float *const *xs, float *const *ys, long n);", ""]
    return "\n".join(lines) + "\n"


def ext_parts(batch: int, shapes_in: list[tuple[int, ...]], shapes_out: list[tuple[int, ...]]) -> tuple[str, str]:
    """The extension's ``predict_into(xs, outs)`` over one array per tensor (checked in C as
    hwb_ext.h checks one: ndarray, float32, C-contiguous, the compiled shape, outputs
    writeable; anything else goes to the executor's Python check, which names the tensor) and
    ``bind_multi``: (definitions, method-table entries) for build.extension_source."""
    def table(shapes: list[tuple[int, ...]]) -> tuple[str, str, str]:
        nd = ", ".join(str(len(s) + 1) for s in shapes)
        dims = ", ".join(str(d) for s in shapes for d in (batch, *s))
        at = ", ".join(str(v) for v in offsets([len(s) + 1 for s in shapes]))
        return nd, dims, at

    nin, nout = len(shapes_in), len(shapes_out)
    (ind, idims, iat), (ond, odims, oat) = table(shapes_in), table(shapes_out)
    defs = f"""
/* several inputs and outputs (hwb_plugins/cpu_native/emit_multi.py) */
#define MIO_NIN {nin}
#define MIO_NOUT {nout}
static const int MIO_IND[] = {{{ind}}}, MIO_IAT[] = {{{iat}}};
static const int MIO_OND[] = {{{ond}}}, MIO_OAT[] = {{{oat}}};
static const Py_ssize_t MIO_IDIMS[] = {{{idims}}}, MIO_ODIMS[] = {{{odims}}};

static PyObject *mio_fail(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {{
    PyObject *r = PyObject_Vectorcall(PyTuple_GET_ITEM(self, 0), args, (size_t)nargs, NULL);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    PyErr_SetString(PyTuple_GET_ITEM(self, 2), "predict_into(xs, outs): xs and outs must be tuples of "
                    "C-contiguous float32 numpy arrays of the compiled shapes, outs writeable");
    return NULL;
}}

static PyObject *mio_predict(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {{
    if (nargs != 2 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1]) ||
        PyTuple_GET_SIZE(args[0]) != MIO_NIN || PyTuple_GET_SIZE(args[1]) != MIO_NOUT)
        return mio_fail(self, args, nargs);
    PyTypeObject *nd = (PyTypeObject *)PyTuple_GET_ITEM(self, 1);
    Py_buffer b[MIO_NIN + MIO_NOUT];
    const float *xp[MIO_NIN];
    float *yp[MIO_NOUT];
    int got = 0, ok = 1;
    for (; got < MIO_NIN + MIO_NOUT && ok; got++) {{
        const int out = got >= MIO_NIN, i = out ? got - MIO_NIN : got;
        PyObject *a = PyTuple_GET_ITEM(args[out], i);
        if (!PyObject_TypeCheck(a, nd) ||
            PyObject_GetBuffer(a, &b[got], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (out ? PyBUF_WRITABLE : 0)) != 0) {{
            PyErr_Clear();
            ok = 0;
            break;
        }}
        if (!shape_is(&b[got], out ? MIO_ODIMS + MIO_OAT[i] : MIO_IDIMS + MIO_IAT[i],
                      out ? MIO_OND[i] : MIO_IND[i])) {{
            ok = 0;
            got++;
            break;
        }}
        if (out) yp[i] = (float *)b[got].buf;
        else xp[i] = (const float *)b[got].buf;
    }}
    if (ok) hwb_model_predict_multi_n(xp, yp, HWB_MODEL_BATCH);
    for (int j = 0; j < got; j++) PyBuffer_Release(&b[j]);
    if (!ok) return mio_fail(self, args, nargs);
    Py_RETURN_NONE;
}}

static PyMethodDef mio_predict_def = {{"predict_into", (PyCFunction)(void (*)(void))mio_predict,
    METH_FASTCALL, "predict_into(xs, outs): run the model on the tuple xs into the tuple outs."}};

/* bind_multi(check, ndarray_type, InputError) -> predict_into(xs, outs) bound to the executor */
static PyObject *bind_multi(PyObject *mod, PyObject *args) {{
    PyObject *check, *ndt, *err;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OOO", &check, &ndt, &err)) return NULL;
    if (!PyType_Check(ndt) || !PyCallable_Check(check)) {{
        PyErr_SetString(PyExc_TypeError, "bind_multi(check, numpy.ndarray, InputError)");
        return NULL;
    }}
    PyObject *state = PyTuple_Pack(3, check, ndt, err);
    if (state == NULL) return NULL;
    PyObject *f = PyCFunction_NewEx(&mio_predict_def, state, NULL);
    Py_DECREF(state);
    return f;
}}
"""
    methods = ('\n    {"bind_multi", bind_multi, METH_VARARGS, '
               '"bind_multi(check, ndarray, InputError) -> predict_into(xs, outs)"},')
    return defs, methods
