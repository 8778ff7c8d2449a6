/* hwb_ext.h — the fixed part of a cpu.native artifact's CPython extension: predict_into(x, out)
 * as a METH_FASTCALL builtin over the buffer protocol, bind(), info(), and the native entry
 * (hwbackends/serve/include/hwb_native.h) the shm server's C loop calls without the GIL.
 *
 * Included once, by the extension's generated ext.c (hwb_plugins/cpu_native/build.py
 * extension_source), which first defines the artifact's shapes and afterwards adds the sliding
 * window's entries (hwb_plugins/cpu_native/sliding.py), the method table and PyInit:
 *
 *   #define HWB_EXT_XSHAPE 1, 16, 8   // (batch, *input shape)
 *   #define HWB_EXT_YSHAPE 1, 1       // (batch, *output shape)
 *   #include "hwb_ext.h"
 *   ... static PyMethodDef methods[] = {HWB_EXT_METHODS ..., {NULL, NULL, 0, NULL}};
 *   PyMODINIT_FUNC PyInit_<module>(void) { return hwb_ext_module(&moddef); }
 *
 * It needs the artifact's generated hwb_model.h (the model's C ABI) on the include path, and
 * hwb_native.h (build.py passes -I to both). Its definitions are static: one artifact, one
 * translation unit. The names XSHAPE, YSHAPE and shape_is are read by the sliding window's
 * entries too. */
#ifndef HWB_EXT_H
#define HWB_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "hwb_model.h"
#include "hwb_native.h"

#if !defined(HWB_EXT_XSHAPE) || !defined(HWB_EXT_YSHAPE)
#error "define HWB_EXT_XSHAPE and HWB_EXT_YSHAPE (batch, then the shape) before including hwb_ext.h"
#endif

static const Py_ssize_t XSHAPE[] = {HWB_EXT_XSHAPE};
static const Py_ssize_t YSHAPE[] = {HWB_EXT_YSHAPE};
#define HWB_EXT_XND ((int)(sizeof XSHAPE / sizeof XSHAPE[0]))
#define HWB_EXT_YND ((int)(sizeof YSHAPE / sizeof YSHAPE[0]))

/* Whether buffer b is float32 ('f') of exactly this shape (nd dimensions). */
static int shape_is(const Py_buffer *b, const Py_ssize_t *shape, int nd) {
    if (b->ndim != nd || b->itemsize != 4 || b->format == NULL || b->format[0] != 'f' || b->format[1])
        return 0;
    for (int i = 0; i < nd; i++)
        if (b->shape[i] != shape[i]) return 0;
    return 1;
}

/* The one error path: the executor's Python check (hwbackends.target.check_io) raises the
 * core's InputError; it is reached only when the fast checks below fail. `self` is the
 * (check, ndarray type, InputError) tuple bind() made. */
static PyObject *fail(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *check = PyTuple_GET_ITEM(self, 0);
    PyObject *r = PyObject_Vectorcall(check, args, (size_t)nargs, NULL);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    PyErr_SetString(PyTuple_GET_ITEM(self, 2), "predict_into(x, out): x must be a C-contiguous "
                    "float32 numpy array of the compiled shape and out a writeable one");
    return NULL;
}

static PyObject *predict_into(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) return fail(self, args, nargs);
    PyTypeObject *nd = (PyTypeObject *)PyTuple_GET_ITEM(self, 1);
    if (!PyObject_TypeCheck(args[0], nd) || !PyObject_TypeCheck(args[1], nd))
        return fail(self, args, nargs);
    Py_buffer xb, yb;
    if (PyObject_GetBuffer(args[0], &xb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyErr_Clear();
        return fail(self, args, nargs);
    }
    if (PyObject_GetBuffer(args[1], &yb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) != 0) {
        PyErr_Clear();
        PyBuffer_Release(&xb);
        return fail(self, args, nargs);
    }
    if (!shape_is(&xb, XSHAPE, HWB_EXT_XND) || !shape_is(&yb, YSHAPE, HWB_EXT_YND)) {
        PyBuffer_Release(&xb);
        PyBuffer_Release(&yb);
        return fail(self, args, nargs);
    }
    hwb_model_predict_n((const float *)xb.buf, (float *)yb.buf, HWB_MODEL_BATCH);
    PyBuffer_Release(&xb);
    PyBuffer_Release(&yb);
    Py_RETURN_NONE;
}

static PyMethodDef predict_def = {"predict_into", (PyCFunction)(void (*)(void))predict_into,
    METH_FASTCALL, "predict_into(x, out): run the model on x into out (no allocation)."};

/* bind(check, ndarray_type, InputError) -> predict_into bound to this executor's state */
static PyObject *bind(PyObject *mod, PyObject *args) {
    PyObject *check, *nd, *err;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OOO", &check, &nd, &err)) return NULL;
    if (!PyType_Check(nd) || !PyCallable_Check(check)) {
        PyErr_SetString(PyExc_TypeError, "bind(check, numpy.ndarray, InputError)");
        return NULL;
    }
    PyObject *state = PyTuple_Pack(3, check, nd, err);
    if (state == NULL) return NULL;
    PyObject *f = PyCFunction_NewEx(&predict_def, state, NULL);
    Py_DECREF(state);
    return f;
}

static PyObject *info(PyObject *mod, PyObject *unused) {
    (void)mod;
    (void)unused;
    return Py_BuildValue("{s:s,s:s,s:i,s:i}", "fingerprint", hwb_model_fingerprint(),
                         "isa", hwb_model_isa(), "abi", HWB_MODEL_ABI,
                         "native_entry_abi", (int)HWB_NATIVE_ENTRY_ABI);
}

/* The raw entry (hwb_native.h), in the module's `entry` capsule. Static: valid as long as this
 * shared object is loaded, which for a CPython extension is the life of the process. Every
 * cpu.native build has the sliding window's functions (the recompute form at least), declared
 * by hwb_model.h with HWB_MODEL_WINDOW; a header without them gives an entry without a window. */
static const hwb_native_entry ENTRY = {
    .abi = HWB_NATIVE_ENTRY_ABI,
    .struct_bytes = (uint32_t)sizeof(hwb_native_entry),
    .predict = hwb_model_predict,
    .in_count = HWB_MODEL_INPUT_SIZE,
    .out_count = HWB_MODEL_OUTPUT_SIZE,
    .batch = HWB_MODEL_BATCH,
    .reserved = 0u,
#ifdef HWB_MODEL_WINDOW
    .push = hwb_model_push,
    .prepare = hwb_model_prepare,
    .reset = hwb_model_reset,
    .step_count = HWB_MODEL_STEP_SIZE,
    .window = HWB_MODEL_WINDOW,
    .window_new = hwb_model_window_new,
    .window_push = hwb_model_window_push,
    .window_push_many = hwb_model_window_push_many,
    .window_prepare = hwb_model_window_prepare,
    .window_reset = hwb_model_window_reset,
    .window_free = hwb_model_window_free,
    .stream_new = HWB_MODEL_STREAM ? hwb_model_stream_new : NULL,
    .stream = HWB_MODEL_STREAM,
#endif
};

/* The method-table entries every artifact has (the generated table adds the window's). */
#define HWB_EXT_METHODS                                                                            \
    {"bind", bind, METH_VARARGS, "bind(check, ndarray, InputError) -> predict_into"},             \
    {"info", info, METH_NOARGS, "the artifact's fingerprint, ISA and C ABI versions"},

/* PyInit's body: the module of `def` with its `entry` capsule. */
static PyObject *hwb_ext_module(PyModuleDef *def) {
    PyObject *m = PyModule_Create(def), *cap;
    if (m == NULL) return NULL;
    cap = PyCapsule_New((void *)&ENTRY, HWB_NATIVE_ENTRY_NAME, NULL);
    if (cap == NULL || PyModule_AddObject(m, "entry", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

#endif /* HWB_EXT_H */
