"""Native entries of our own making, for tests that hand the shm loop an entry the executor
would not: a failing one, one of the wrong sizes, a newer ABI, a struct shorter than its ABI,
an ABI 1 copy of a real entry (predict only, the model's own function), and an ABI 3 entry
with window handles of real per-handle state (:func:`windowed_sum`: a weighted sum over the
window, prepared incrementally, so every answer is checkable). Built as a CPython extension
from C that includes hwbackends/serve/include/hwb_native.h, the struct's one definition (no
copy of it here)."""
from __future__ import annotations

import importlib.util
import subprocess
import sysconfig
from pathlib import Path
from types import ModuleType

import numpy as np

from hwbackends.serve.shm import INCLUDE_DIR

MODULE = "hwb_test_entries"

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "hwb_native.h"

static int fails(const float *x, float *y) { (void)x; y[0] = 42.0f; return 7; }
static int zeros(const float *x, float *y) { (void)x; y[0] = 0.0f; return 0; }
static int nothing(void) { return 0; }

/* an ABI 1 producer: its struct ends at ABI 1's last field */
static const hwb_native_entry FAILS = {.abi = 1, .struct_bytes = HWB_NATIVE_ENTRY_V1_BYTES,
    .predict = fails, .in_count = 32, .out_count = 1, .batch = 1};
static const hwb_native_entry WRONG = {.abi = HWB_NATIVE_ENTRY_ABI, .struct_bytes = sizeof(hwb_native_entry),
    .predict = zeros, .in_count = 31, .out_count = 1, .batch = 1};
static const hwb_native_entry NEWER = {.abi = HWB_NATIVE_ENTRY_ABI + 1, .struct_bytes = sizeof(hwb_native_entry),
    .predict = zeros, .in_count = 32, .out_count = 1, .batch = 1};
/* claims ABI 2 but is only ABI 1's size: its window fields would be read past its end */
static const hwb_native_entry SHORT = {.abi = 2, .struct_bytes = HWB_NATIVE_ENTRY_V1_BYTES,
    .predict = zeros, .in_count = 32, .out_count = 1, .batch = 1};
/* ABI 2 with a window whose functions are missing */
static const hwb_native_entry NO_PUSH = {.abi = 2, .struct_bytes = sizeof(hwb_native_entry),
    .predict = zeros, .in_count = 32, .out_count = 1, .batch = 1, .prepare = nothing,
    .reset = nothing, .step_count = 1, .window = 32};

/* abi1_of(entry): an ABI 1 entry (static; one per process) with the real entry's predict and
   sizes, as an artifact built before ABI 2 offers */
static hwb_native_entry V1;
static PyObject *abi1_of(PyObject *m, PyObject *cap) {
    (void)m;
    const hwb_native_entry *e = PyCapsule_GetPointer(cap, HWB_NATIVE_ENTRY_NAME);
    if (!e) return NULL;
    V1 = (hwb_native_entry){.abi = 1, .struct_bytes = HWB_NATIVE_ENTRY_V1_BYTES, .predict = e->predict,
                            .in_count = e->in_count, .out_count = e->out_count, .batch = e->batch};
    return PyCapsule_New(&V1, HWB_NATIVE_ENTRY_NAME, NULL);
}

/* fields(entry) -> dict of the entry's fields (function pointers as bools) */
static PyObject *fields(PyObject *m, PyObject *cap) {
    (void)m;
    const hwb_native_entry *e = PyCapsule_GetPointer(cap, HWB_NATIVE_ENTRY_NAME);
    if (!e) return NULL;
    if (e->abi < 2) return Py_BuildValue("{s:I,s:I,s:O,s:I,s:I,s:I}", "abi", e->abi, "struct_bytes",
        e->struct_bytes, "predict", e->predict ? Py_True : Py_False, "in_count", e->in_count,
        "out_count", e->out_count, "batch", e->batch);
    return Py_BuildValue("{s:I,s:I,s:O,s:I,s:I,s:I,s:O,s:O,s:O,s:I,s:I}", "abi", e->abi,
        "struct_bytes", e->struct_bytes, "predict", e->predict ? Py_True : Py_False,
        "in_count", e->in_count, "out_count", e->out_count, "batch", e->batch,
        "push", e->push ? Py_True : Py_False, "prepare", e->prepare ? Py_True : Py_False,
        "reset", e->reset ? Py_True : Py_False, "step_count", e->step_count, "window", e->window);
}

/* ---- an ABI 3 entry: windows as handles, each with its own state ----
   The model: y[o] = (o + 1) * sum_t sum_j (t + 1) * (j + 1) * x[t][j] over the window's ticks
   t = 0 (oldest) .. W-1 (newest). A handle keeps its last W ticks in a ring and, prepared,
   the sum of the W-1 newest at their places in the next window (`base`): push adds only the
   new tick's term (weight W). A push on a window not prepared prepares it first (`late`). */
static uint32_t W_ = 4, S_ = 2, O_ = 1;
static unsigned long long MADE, FREED, PUSHES, PREPARES, LATE;
static long long UNPREPARED; /* windows pushed and not prepared since */
static long long PREPARE_NS; /* each prepare's extra busy time (a slow prepare, for ordering tests) */
static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}
struct hwb_window { float *ring; uint32_t k, prepared; double base; };

static double tick_term(const float *x, uint32_t weight) {
    double a = 0;
    for (uint32_t j = 0; j < S_; j++) a += (double)(j + 1) * x[j];
    return a * weight;
}
static hwb_window *ws_new(void) {
    hwb_window *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->ring = calloc((size_t)W_ * S_, sizeof(float));
    if (!w->ring) { free(w); return NULL; }
    w->prepared = 1; /* an empty window: base 0 */
    __atomic_fetch_add(&MADE, 1, __ATOMIC_RELAXED);
    return w;
}
static int ws_prepare(hwb_window *w) {
    if (w->prepared) return 0;
    double b = 0;
    for (uint32_t i = 0; i + 1 < W_; i++) { /* i-th newest tick: place W-2-i next time */
        uint32_t at = (w->k + W_ - 1 - i) % W_;
        b += tick_term(w->ring + (size_t)at * S_, W_ - 1 - i);
    }
    w->base = b;
    w->prepared = 1;
    if (PREPARE_NS > 0) for (long long until = now_ns() + PREPARE_NS; now_ns() < until;) {}
    __atomic_fetch_add(&PREPARES, 1, __ATOMIC_RELAXED);
    __atomic_fetch_sub(&UNPREPARED, 1, __ATOMIC_RELAXED);
    return 0;
}
static int ws_push(hwb_window *w, const float *x, float *y) {
    if (!w->prepared) { __atomic_fetch_add(&LATE, 1, __ATOMIC_RELAXED); ws_prepare(w); }
    double a = w->base + tick_term(x, W_);
    memcpy(w->ring + (size_t)w->k * S_, x, S_ * sizeof(float));
    w->k = (w->k + 1) % W_;
    w->prepared = 0;
    __atomic_fetch_add(&UNPREPARED, 1, __ATOMIC_RELAXED);
    for (uint32_t o = 0; o < O_; o++) y[o] = (float)(a * (o + 1));
    __atomic_fetch_add(&PUSHES, 1, __ATOMIC_RELAXED);
    return 0;
}
static int ws_push_many(hwb_window *const *ws, uint32_t k, const float *xs, float *ys) {
    for (uint32_t i = 0; i < k; i++) ws_push(ws[i], xs + (size_t)i * S_, ys + (size_t)i * O_);
    return 0;
}
static int ws_reset(hwb_window *w) {
    if (!w->prepared) __atomic_fetch_sub(&UNPREPARED, 1, __ATOMIC_RELAXED);
    memset(w->ring, 0, (size_t)W_ * S_ * sizeof(float));
    w->k = 0;
    w->base = 0;
    w->prepared = 1;
    return 0;
}
static void ws_free(hwb_window *w) {
    if (!w) return;
    if (!w->prepared) __atomic_fetch_sub(&UNPREPARED, 1, __ATOMIC_RELAXED);
    free(w->ring);
    free(w);
    __atomic_fetch_add(&FREED, 1, __ATOMIC_RELAXED);
}
static int ws_predict(const float *x, float *y) {
    double a = 0;
    for (uint32_t t = 0; t < W_; t++) a += tick_term(x + (size_t)t * S_, t + 1);
    for (uint32_t o = 0; o < O_; o++) y[o] = (float)(a * (o + 1));
    return 0;
}
/* the ABI 2 single window (required beside the handles): one handle of its own */
static hwb_window *ONE;
static int one_push(const float *x, float *y) { return ws_push(ONE, x, y); }
static int one_prepare(void) { return ws_prepare(ONE); }
static int one_reset(void) { return ws_reset(ONE); }

static hwb_native_entry SUM;
/* windowed_sum(window, step, out) -> the entry (static: one geometry per process at a time) */
static PyObject *windowed_sum(PyObject *m, PyObject *args) {
    (void)m;
    unsigned w, s, o;
    if (!PyArg_ParseTuple(args, "III", &w, &s, &o)) return NULL;
    if (!w || !s || !o) { PyErr_SetString(PyExc_ValueError, "sizes must be > 0"); return NULL; }
    if (ONE) ws_free(ONE);
    W_ = w; S_ = s; O_ = o;
    ONE = ws_new();
    SUM = (hwb_native_entry){.abi = 3, .struct_bytes = sizeof(hwb_native_entry), .predict = ws_predict,
        .in_count = w * s, .out_count = o, .batch = 1, .push = one_push, .prepare = one_prepare,
        .reset = one_reset, .step_count = s, .window = w, .window_new = ws_new,
        .window_push = ws_push, .window_push_many = ws_push_many, .window_prepare = ws_prepare,
        .window_reset = ws_reset, .window_free = ws_free};
    return PyCapsule_New(&SUM, HWB_NATIVE_ENTRY_NAME, NULL);
}
/* counts() -> the ABI 3 entry's handles made and freed, pushes, prepares (late: run by a push
   on a window nobody prepared), windows pushed and not prepared since */
static PyObject *counts(PyObject *m, PyObject *unused) {
    (void)m; (void)unused;
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:L}", "made", MADE, "freed", FREED, "pushes", PUSHES,
                         "prepares", PREPARES, "late", LATE, "unprepared", UNPREPARED);
}

/* slow_prepare(ns): every later prepare of the ABI 3 entry spins ns longer (0: none) */
static PyObject *slow_prepare(PyObject *m, PyObject *arg) {
    (void)m;
    PREPARE_NS = PyLong_AsLongLong(arg);
    if (PREPARE_NS == -1 && PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"abi1_of", abi1_of, METH_O, "an ABI 1 copy of a native entry"},
    {"fields", fields, METH_O, "a native entry's fields"},
    {"windowed_sum", windowed_sum, METH_VARARGS, "an ABI 3 entry with window handles"},
    {"counts", counts, METH_NOARGS, "the ABI 3 entry's counters"},
    {"slow_prepare", slow_prepare, METH_O, "make every prepare spin this many ns longer"},
    {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, .m_name = "hwb_test_entries", .m_size = -1,
                                 .m_methods = methods};

static int add(PyObject *m, const char *name, const hwb_native_entry *e) {
    PyObject *cap = PyCapsule_New((void *)e, HWB_NATIVE_ENTRY_NAME, NULL);
    if (!cap || PyModule_AddObject(m, name, cap) < 0) { Py_XDECREF(cap); return -1; }
    return 0;
}

PyMODINIT_FUNC PyInit_hwb_test_entries(void) {
    PyObject *m = PyModule_Create(&mod);
    if (!m) return NULL;
    if (add(m, "fails", &FAILS) || add(m, "wrong_size", &WRONG) || add(m, "newer_abi", &NEWER) ||
        add(m, "short_struct", &SHORT) || add(m, "no_push", &NO_PUSH)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
"""


def build(directory: Path, cc: str = "cc") -> ModuleType:
    """Compile :data:`SOURCE` in ``directory`` (warnings are errors) and import it."""
    (directory / "entries.c").write_text(SOURCE)
    so = directory / (MODULE + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run([cc, "-O1", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                    f"-I{INCLUDE_DIR}", f"-I{sysconfig.get_paths()['include']}",
                    str(directory / "entries.c"), "-o", str(so)], check=True, timeout=120)
    spec = importlib.util.spec_from_file_location(MODULE, so)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def windowed_sum_reference(window: int, ticks, resets=()) -> "np.ndarray":
    """What a ``windowed_sum(window, step, 1)`` window answers for ``ticks`` (n × step) pushed
    into it (emptied before the ticks whose index is in ``resets``), computed afresh from each
    whole window, as its predict does."""
    ticks = np.asarray(ticks, np.float64)
    step = ticks.shape[1]
    wt = np.arange(1, window + 1)[:, None] * np.arange(1, step + 1)[None, :]
    ring = np.zeros((window, step))
    out = np.empty(len(ticks), np.float32)
    for i, x in enumerate(ticks):
        if i in resets:
            ring[:] = 0
        ring = np.vstack([ring[1:], x[None]])
        out[i] = np.float32((ring * wt).sum())
    return out
