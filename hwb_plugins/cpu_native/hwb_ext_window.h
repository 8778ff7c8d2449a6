/* hwb_ext_window.h — the sliding window's entries of a cpu.native artifact's CPython
 * extension (CompiledModel.sliding() / streaming(), hwbackends/sliding.py), over the C ABI of
 * hwb_window.h. Included by the generated ext.c after hwb_ext.h, with the artifact's step
 * shape defined first:
 *
 *   #define HWB_EXT_SXSHAPE 8        // one step's shape (input.shape[1:]); 0 for a scalar step
 *   #define HWB_EXT_SXND 1           // its rank
 *   #include "hwb_ext_window.h"
 *   ... {HWB_EXT_METHODS HWB_EXT_WINDOW_METHODS ...}
 *
 * One window (push_into / step_into / prepare / reset, and the stream's): METH_FASTCALL over
 * the buffer protocol, on the library's own window (hwb_model_push, …).
 * Many windows (windows(n, stream) → a capsule of n handles, freed with it): wpush(set, i,
 * x_t, out), wstep(set, i, x_t, out) (push, then that window's prepare), wpush_many(set, ids,
 * xs, outs) and wstep_many (ids an int64 array of distinct ids), wprepare(set) (every window),
 * wreset(set, i) (-1: every window). A wrong argument calls the Python check set by
 * window_check(), which raises the core's InputError naming it; these fast checks only
 * decide whether to call it. */
#ifndef HWB_EXT_WINDOW_H
#define HWB_EXT_WINDOW_H

#if !defined(HWB_EXT_SXSHAPE) || !defined(HWB_EXT_SXND)
#error "define HWB_EXT_SXSHAPE and HWB_EXT_SXND (one step's shape) before including hwb_ext_window.h"
#endif

static const Py_ssize_t SXSHAPE[] = {HWB_EXT_SXSHAPE};
static PyObject *window_check_fn = NULL, *window_err = NULL;

static PyObject *window_fail(PyObject *const *args, Py_ssize_t nargs) {
    if (window_check_fn != NULL) {
        PyObject *r = PyObject_Vectorcall(window_check_fn, args, (size_t)nargs, NULL);
        if (r == NULL) return NULL;
        Py_DECREF(r);
    }
    PyErr_SetString(window_err ? window_err : PyExc_TypeError, "push_into(x_t, out): x_t must be a "
                    "C-contiguous float32 array of one step's shape and out a writeable one of the output's");
    return NULL;
}

/* x_t and out of one tick (the step's shape, one sample's output), or 0 with nothing held. */
static int tick_buffers(PyObject *x, PyObject *y, Py_buffer *xb, Py_buffer *yb) {
    if (PyObject_GetBuffer(x, xb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyErr_Clear();
        return 0;
    }
    if (PyObject_GetBuffer(y, yb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) != 0) {
        PyErr_Clear();
        PyBuffer_Release(xb);
        return 0;
    }
    if (!shape_is(xb, SXSHAPE, HWB_EXT_SXND) || !shape_is(yb, YSHAPE + 1, HWB_EXT_YND - 1)) {
        PyBuffer_Release(xb);
        PyBuffer_Release(yb);
        return 0;
    }
    return 1;
}

static PyObject *window_call(PyObject *const *args, Py_ssize_t nargs, int (*push)(const float *, float *),
                             int (*prepare)(void)) {
    Py_buffer xb, yb;
    if (nargs != 2 || !tick_buffers(args[0], args[1], &xb, &yb)) return window_fail(args, nargs);
    int rc = push((const float *)xb.buf, (float *)yb.buf);
    PyBuffer_Release(&xb);
    PyBuffer_Release(&yb);
    if (rc != 0) {
        PyErr_SetString(PyExc_RuntimeError, "this artifact has no stream form");
        return NULL;
    }
    if (prepare != NULL) prepare();
    Py_RETURN_NONE;
}

static PyObject *w_push(PyObject *m, PyObject *const *a, Py_ssize_t n) { return window_call(a, n, hwb_model_push, NULL); }
static PyObject *w_step(PyObject *m, PyObject *const *a, Py_ssize_t n) {
    return window_call(a, n, hwb_model_push, hwb_model_prepare);
}
static PyObject *s_push(PyObject *m, PyObject *const *a, Py_ssize_t n) { return window_call(a, n, hwb_model_stream_push, NULL); }
static PyObject *s_step(PyObject *m, PyObject *const *a, Py_ssize_t n) {
    return window_call(a, n, hwb_model_stream_push, hwb_model_stream_prepare);
}
static PyObject *w_prepare(PyObject *m, PyObject *u) { hwb_model_prepare(); Py_RETURN_NONE; }
static PyObject *w_reset(PyObject *m, PyObject *u) { hwb_model_reset(); Py_RETURN_NONE; }
static PyObject *s_prepare(PyObject *m, PyObject *u) { hwb_model_stream_prepare(); Py_RETURN_NONE; }
static PyObject *s_reset(PyObject *m, PyObject *u) { hwb_model_stream_reset(); Py_RETURN_NONE; }
static PyObject *window_check(PyObject *m, PyObject *args) {
    PyObject *fn, *err;
    if (!PyArg_ParseTuple(args, "OO", &fn, &err)) return NULL;
    Py_XSETREF(window_check_fn, Py_NewRef(fn));
    Py_XSETREF(window_err, Py_NewRef(err));
    Py_RETURN_NONE;
}

/* ---- many windows: a set of handles in a capsule ---- */
static const char WSET_NAME[] = "hwbackends.cpu_native.windows";

typedef struct {
    uint32_t n;          /* windows */
    uint32_t gen;        /* push_many's call count: seen[i] == gen marks an id met this call */
    uint32_t *seen;      /* n */
    hwb_window **ws;     /* n handles */
    hwb_window **pick;   /* n: one push_many call's handles, in its order */
} wset;

static void wset_release(wset *s) {
    if (s == NULL) return;
    if (s->ws != NULL)
        for (uint32_t i = 0; i < s->n; i++) hwb_model_window_free(s->ws[i]);
    PyMem_RawFree(s->ws);
    PyMem_RawFree(s->pick);
    PyMem_RawFree(s->seen);
    PyMem_RawFree(s);
}

static void wset_destroy(PyObject *cap) { wset_release((wset *)PyCapsule_GetPointer(cap, WSET_NAME)); }

static PyObject *windows_new(PyObject *m, PyObject *args) {
    Py_ssize_t n;
    int stream;
    if (!PyArg_ParseTuple(args, "np", &n, &stream)) return NULL;
    if (n < 1 || n > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError, "windows(n, stream): n must be 1 to 2**20");
        return NULL;
    }
    if (stream && !HWB_MODEL_STREAM) {
        PyErr_SetString(PyExc_RuntimeError, "this artifact has no stream form");
        return NULL;
    }
    wset *s = (wset *)PyMem_RawCalloc(1, sizeof *s);
    if (s == NULL) return PyErr_NoMemory();
    s->n = (uint32_t)n;
    s->ws = (hwb_window **)PyMem_RawCalloc((size_t)n, sizeof *s->ws);
    s->pick = (hwb_window **)PyMem_RawCalloc((size_t)n, sizeof *s->pick);
    s->seen = (uint32_t *)PyMem_RawCalloc((size_t)n, sizeof *s->seen);
    int ok = s->ws && s->pick && s->seen;
    for (Py_ssize_t i = 0; ok && i < n; i++)
        ok = (s->ws[i] = stream ? hwb_model_stream_new() : hwb_model_window_new()) != NULL;
    if (!ok) {
        wset_release(s);
        return PyErr_NoMemory();
    }
    PyObject *cap = PyCapsule_New(s, WSET_NAME, wset_destroy);
    if (cap == NULL) wset_release(s);
    return cap;
}

/* Window `o` of set `s`: 1 and *i set, or 0 (not an int, a bool, or out of range). */
static int wset_id(const wset *s, PyObject *o, uint32_t *i) {
    if (PyBool_Check(o)) return 0;
    const long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (v < 0 || (unsigned long)v >= s->n) return 0;
    *i = (uint32_t)v;
    return 1;
}

static PyObject *wset_call(PyObject *const *a, Py_ssize_t nargs, int prepare) {
    wset *s;
    uint32_t i;
    Py_buffer xb, yb;
    if (nargs != 4) return window_fail(a, nargs);
    if ((s = (wset *)PyCapsule_GetPointer(a[0], WSET_NAME)) == NULL) return NULL;
    if (!wset_id(s, a[1], &i) || !tick_buffers(a[2], a[3], &xb, &yb)) return window_fail(a, nargs);
    hwb_window *w = s->ws[i];
    const int rc = hwb_model_window_push(w, (const float *)xb.buf, (float *)yb.buf);
    PyBuffer_Release(&xb);
    PyBuffer_Release(&yb);
    if (rc != 0) {
        PyErr_Format(PyExc_RuntimeError, "the model's window push returned %d", rc);
        return NULL;
    }
    if (prepare) hwb_model_window_prepare(w);
    Py_RETURN_NONE;
}

/* ids (int64, 1-D), xs (k × step), outs (k × output): 1 with the buffers held and s->pick
 * filled with k distinct handles, or 0 with nothing held. */
static int many_buffers(wset *s, PyObject *const *a, Py_buffer *ib, Py_buffer *xb, Py_buffer *yb) {
    if (PyObject_GetBuffer(a[1], ib, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyErr_Clear();
        return 0;
    }
    const int ids_ok = ib->ndim == 1 && ib->itemsize == 8 && ib->format != NULL &&
                       (ib->format[0] == 'l' || ib->format[0] == 'q') && !ib->format[1];
    if (!ids_ok || PyObject_GetBuffer(a[2], xb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyErr_Clear();
        PyBuffer_Release(ib);
        return 0;
    }
    if (PyObject_GetBuffer(a[3], yb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) != 0) {
        PyErr_Clear();
        PyBuffer_Release(ib);
        PyBuffer_Release(xb);
        return 0;
    }
    const Py_ssize_t k = ib->shape[0];
    int ok = k <= (Py_ssize_t)s->n && xb->ndim == HWB_EXT_SXND + 1 && yb->ndim == HWB_EXT_YND &&
             xb->shape[0] == k && yb->shape[0] == k;
    if (ok) {
        Py_buffer xr = *xb, yr = *yb; /* the rows' shapes: the buffers' after their first axis */
        xr.ndim--, xr.shape++, yr.ndim--, yr.shape++;
        ok = shape_is(&xr, SXSHAPE, HWB_EXT_SXND) && shape_is(&yr, YSHAPE + 1, HWB_EXT_YND - 1);
    }
    if (ok && ++s->gen == 0) { /* the counter wrapped: forget every mark */
        memset(s->seen, 0, s->n * sizeof *s->seen);
        s->gen = 1;
    }
    const int64_t *ids = (const int64_t *)ib->buf;
    for (Py_ssize_t j = 0; ok && j < k; j++) {
        const int64_t v = ids[j];
        ok = v >= 0 && v < (int64_t)s->n && s->seen[v] != s->gen;
        if (ok) {
            s->seen[v] = s->gen;
            s->pick[j] = s->ws[v];
        }
    }
    if (!ok) {
        PyBuffer_Release(ib);
        PyBuffer_Release(xb);
        PyBuffer_Release(yb);
    }
    return ok;
}

static PyObject *wset_many(PyObject *const *a, Py_ssize_t nargs, int prepare) {
    wset *s;
    Py_buffer ib, xb, yb;
    if (nargs != 4) return window_fail(a, nargs);
    if ((s = (wset *)PyCapsule_GetPointer(a[0], WSET_NAME)) == NULL) return NULL;
    if (!many_buffers(s, a, &ib, &xb, &yb)) return window_fail(a, nargs);
    const uint32_t k = (uint32_t)ib.shape[0];
    const int rc = hwb_model_window_push_many(s->pick, k, (const float *)xb.buf, (float *)yb.buf);
    PyBuffer_Release(&ib);
    PyBuffer_Release(&xb);
    PyBuffer_Release(&yb);
    if (rc != 0) {
        PyErr_Format(PyExc_RuntimeError, "the model's window push_many returned %d", rc);
        return NULL;
    }
    if (prepare)
        for (uint32_t j = 0; j < k; j++) hwb_model_window_prepare(s->pick[j]);
    Py_RETURN_NONE;
}

static PyObject *ws_push(PyObject *m, PyObject *const *a, Py_ssize_t n) { return wset_call(a, n, 0); }
static PyObject *ws_step(PyObject *m, PyObject *const *a, Py_ssize_t n) { return wset_call(a, n, 1); }
static PyObject *ws_push_many(PyObject *m, PyObject *const *a, Py_ssize_t n) { return wset_many(a, n, 0); }
static PyObject *ws_step_many(PyObject *m, PyObject *const *a, Py_ssize_t n) { return wset_many(a, n, 1); }

static PyObject *ws_prepare(PyObject *m, PyObject *cap) {
    wset *s = (wset *)PyCapsule_GetPointer(cap, WSET_NAME);
    if (s == NULL) return NULL;
    for (uint32_t i = 0; i < s->n; i++) hwb_model_window_prepare(s->ws[i]);
    Py_RETURN_NONE;
}

static PyObject *ws_count(PyObject *m, PyObject *cap) {
    wset *s = (wset *)PyCapsule_GetPointer(cap, WSET_NAME);
    return s == NULL ? NULL : PyLong_FromUnsignedLong(s->n);
}

static PyObject *ws_reset(PyObject *m, PyObject *args) {
    PyObject *cap;
    long i;
    if (!PyArg_ParseTuple(args, "Ol", &cap, &i)) return NULL;
    wset *s = (wset *)PyCapsule_GetPointer(cap, WSET_NAME);
    if (s == NULL) return NULL;
    if (i < -1 || i >= (long)s->n) {
        PyErr_SetString(PyExc_IndexError, "wreset(set, i): i must name a window, or -1 for all");
        return NULL;
    }
    for (uint32_t j = i < 0 ? 0 : (uint32_t)i; j < (i < 0 ? s->n : (uint32_t)i + 1); j++)
        hwb_model_window_reset(s->ws[j]);
    Py_RETURN_NONE;
}

#define HWB_FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL
#define HWB_EXT_WINDOW_METHODS                                                                    \
    {"push_into", HWB_FASTCALL(w_push), "the window: push one step"},                            \
    {"step_into", HWB_FASTCALL(w_step), "the window: push, then prepare"},                       \
    {"stream_push_into", HWB_FASTCALL(s_push), "the stream: push one step"},                     \
    {"stream_step_into", HWB_FASTCALL(s_step), "the stream: push, then prepare"},                \
    {"prepare", w_prepare, METH_NOARGS, "the window: prepare the next tick"},                    \
    {"reset", w_reset, METH_NOARGS, "the window: empty it"},                                     \
    {"stream_prepare", s_prepare, METH_NOARGS, "the stream: prepare the next step"},             \
    {"stream_reset", s_reset, METH_NOARGS, "the stream: zero its state"},                        \
    {"window_check", window_check, METH_VARARGS, "window_check(check, InputError)"},             \
    {"windows", windows_new, METH_VARARGS, "windows(n, stream) -> a set of n windows"},          \
    {"wpush", HWB_FASTCALL(ws_push), "wpush(set, i, x_t, out)"},                                 \
    {"wstep", HWB_FASTCALL(ws_step), "wstep(set, i, x_t, out): push, then prepare"},             \
    {"wpush_many", HWB_FASTCALL(ws_push_many), "wpush_many(set, ids, xs, outs)"},                \
    {"wstep_many", HWB_FASTCALL(ws_step_many), "wstep_many(set, ids, xs, outs): then prepare"},  \
    {"wprepare", ws_prepare, METH_O, "wprepare(set): prepare every window"},                     \
    {"wreset", ws_reset, METH_VARARGS, "wreset(set, i): empty window i (-1: all)"},               \
    {"wcount", ws_count, METH_O, "wcount(set): its number of windows"},

#endif /* HWB_EXT_WINDOW_H */
