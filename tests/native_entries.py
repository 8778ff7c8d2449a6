"""Native entries of our own making, for tests that hand the shm loop an entry the executor
would not: a failing one, one of the wrong sizes, a newer ABI, a struct shorter than its ABI,
and an ABI 1 copy of a real entry (predict only, the model's own function). Built as a
CPython extension from C that includes hwbackends/serve/include/hwb_native.h, the struct's
one definition (no copy of it here)."""
from __future__ import annotations

import importlib.util
import subprocess
import sysconfig
from pathlib import Path
from types import ModuleType

from hwbackends.serve.shm import INCLUDE_DIR

MODULE = "hwb_test_entries"

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
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

static PyMethodDef methods[] = {
    {"abi1_of", abi1_of, METH_O, "an ABI 1 copy of a native entry"},
    {"fields", fields, METH_O, "a native entry's fields"},
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
