/* _shmloop: the native request loop of the shared-memory endpoint (see hwb_shm.h for the
 * protocol, and hwbackends/serve/shm.py for the Python side).
 *
 * serve(): the server's poll loop. It scans the slots with the GIL released, busy-polling for
 * spin_ns after the last request and then sleeping on the header's doorbell futex (clients
 * ring it only when server_sleeping is set). Requests are checked in C (size, deadline,
 * NaN/Inf: refused and counted without touching Python); a valid request takes the GIL just
 * for the model call, in this very thread: no hand-off to another thread.
 * Client: hwb_shm.h's client as a Python type; call() releases the GIL for the whole round
 * trip (copy in, publish, spin/futex wait, copy out).
 *
 * A plain C extension built by setuptools (setup.py ext_modules): no build dependency beyond
 * the compiler `pip install` already needs, no binding generator; the hot loop has nothing to
 * bind but a callable and a few buffers. */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <math.h>

#include "include/hwb_shm.h"

#define MAX_SLOTS 1024
#define RC_BAD_BUFFER (-100) /* call(): x/out are not float32 C-contiguous of the right size */
#define RC_BUSY (-102)       /* call(): the client is in use by another thread */

/* ---- server ------------------------------------------------------------------------- */

static void reply(hwb_shm_header *h, hwb_shm_slot *s, uint32_t seq, uint32_t status,
                  const char *msg) {
    if (msg && *msg) {
        size_t n = strlen(msg);
        if (n > HWB_SHM_MSG) n = HWB_SHM_MSG;
        memcpy(s->msg, msg, n);
        HWB_STORE_RLX(&s->msg_len, (uint32_t)n);
    } else {
        HWB_STORE_RLX(&s->msg_len, 0u);
    }
    HWB_STORE_RLX(&s->status, status);
    HWB_STORE_REL(&s->resp, seq); /* publishes status, message and outputs */
    HWB_FENCE();                  /* pairs with the client's fence after client_waiting = 1 */
    if (HWB_LOAD_RLX(&s->client_waiting)) hwb_futex_wake(&s->resp, INT_MAX);
    (void)h;
}

/* A request the server refuses without running the model; NULL if it is acceptable. */
static const char *precheck(hwb_shm_header *h, hwb_shm_slot *s, int64_t now, uint32_t *status,
                            char *buf, size_t n) {
    uint32_t got = HWB_LOAD_RLX(&s->in_count);
    int64_t dl = HWB_LOAD_RLX(&s->deadline_ns);
    const float *x = hwb_shm_slot_in(s);
    if (got != h->in_count) {
        snprintf(buf, n, "wrong payload size: this endpoint takes %u float32 features, the "
                 "request carried %u", h->in_count, got);
        *status = HWB_SHM_BAD_INPUT;
        return buf;
    }
    if (dl > 0 && now > dl) {
        *status = HWB_SHM_DEADLINE;
        return "deadline";
    }
    for (uint32_t i = 0; i < h->in_count; i++) {
        if (!isfinite(x[i])) {
            snprintf(buf, n, "input has NaN or Inf (feature %u); the endpoint refuses "
                     "non-finite features: clean them in the strategy", i);
            *status = HWB_SHM_BAD_INPUT;
            return buf;
        }
    }
    return NULL;
}

/* Status and message of one Python result (None: ok; str: unavailable reason) or of the
 * pending exception (res == NULL). Writes the reply. Needs the GIL. */
static void reply_py(hwb_shm_header *h, hwb_shm_slot *s, uint32_t seq, PyObject *res,
                     PyObject *input_error) {
    char buf[HWB_SHM_MSG + 1];
    if (res == NULL) {
        PyObject *type, *val, *tb;
        PyObject *str;
        int bad = PyErr_ExceptionMatches(input_error);
        PyErr_Fetch(&type, &val, &tb);
        PyErr_NormalizeException(&type, &val, &tb);
        str = val ? PyObject_Str(val) : NULL;
        snprintf(buf, sizeof buf, "%s%s: %s", bad ? "" : "server error: ",
                 type ? ((PyTypeObject *)type)->tp_name : "?",
                 str ? PyUnicode_AsUTF8(str) : "?");
        PyErr_Clear();
        Py_XDECREF(str);
        Py_XDECREF(type);
        Py_XDECREF(val);
        Py_XDECREF(tb);
        __atomic_fetch_add(bad ? &h->bad_payloads : &h->errors, 1, __ATOMIC_RELAXED);
        reply(h, s, seq, bad ? HWB_SHM_BAD_INPUT : HWB_SHM_UNAVAILABLE, buf);
    } else if (res == Py_None) {
        __atomic_fetch_add(&h->served, 1, __ATOMIC_RELAXED);
        reply(h, s, seq, HWB_SHM_OK, NULL);
    } else {
        const char *m = PyUnicode_Check(res) ? PyUnicode_AsUTF8(res) : NULL;
        if (m == NULL) {
            PyErr_Clear();
            m = "server error: the handler returned neither None nor a reason";
        }
        if (strcmp(m, "deadline") == 0) {
            __atomic_fetch_add(&h->deadline_missed, 1, __ATOMIC_RELAXED);
            reply(h, s, seq, HWB_SHM_DEADLINE, m);
        } else {
            __atomic_fetch_add(&h->errors, 1, __ATOMIC_RELAXED);
            reply(h, s, seq, HWB_SHM_UNAVAILABLE, m);
        }
    }
}

static void reap(hwb_shm_header *h, int lock_fd) {
    for (uint32_t i = 0; i < h->nslots; i++) {
        hwb_shm_slot *s = hwb_shm_slot_at(h, i);
        struct flock fl;
        if (HWB_LOAD_ACQ(&s->owner_pid) == 0) continue;
        memset(&fl, 0, sizeof fl);
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        fl.l_start = (off_t)i;
        fl.l_len = 1;
        if (fcntl(lock_fd, F_OFD_SETLK, &fl) != 0) continue; /* a live client holds it */
        HWB_STORE_REL(&s->owner_pid, 0);
        /* drop a request the dead client left behind; the next owner starts clean */
        HWB_STORE_REL(&s->resp, HWB_LOAD_ACQ(&s->req));
        __atomic_fetch_add(&h->reaped, 1, __ATOMIC_RELAXED);
        fl.l_type = F_UNLCK;
        fcntl(lock_fd, F_OFD_SETLK, &fl);
    }
}

typedef struct {
    hwb_shm_header *h;
    PyObject *run, *slot_args, *batch, *input_error;
} loop_ctx;

/* Handle the pending slots; called and returns without the GIL. */
static void handle(loop_ctx *L, const uint32_t *idx, int n) {
    hwb_shm_header *h = L->h;
    uint32_t seqs[MAX_SLOTS];
    int valid[MAX_SLOTS], nv = 0;
    int64_t now = hwb_now_ns();
    char buf[HWB_SHM_MSG + 1];
    for (int k = 0; k < n; k++) {
        hwb_shm_slot *s = hwb_shm_slot_at(h, idx[k]);
        uint32_t status = 0;
        const char *why;
        seqs[k] = HWB_LOAD_ACQ(&s->req);
        why = precheck(h, s, now, &status, buf, sizeof buf);
        if (why) {
            __atomic_fetch_add(status == HWB_SHM_DEADLINE ? &h->deadline_missed : &h->bad_payloads,
                               1, __ATOMIC_RELAXED);
            reply(h, s, seqs[k], status, why);
        } else {
            valid[nv++] = k;
        }
    }
    if (nv == 0) return;
    PyGILState_STATE g = PyGILState_Ensure();
    if (L->batch == Py_None) {
        for (int j = 0; j < nv; j++) {
            int k = valid[j];
            PyObject *res = PyObject_Call(L->run, PyTuple_GET_ITEM(L->slot_args, idx[k]), NULL);
            reply_py(h, hwb_shm_slot_at(h, idx[k]), seqs[k], res, L->input_error);
            Py_XDECREF(res);
        }
    } else {
        PyObject *lst = PyList_New(nv), *res;
        for (int j = 0; j < nv; j++) PyList_SET_ITEM(lst, j, PyLong_FromLong((long)idx[valid[j]]));
        res = PyObject_CallOneArg(L->batch, lst);
        for (int j = 0; j < nv; j++) {
            int k = valid[j];
            hwb_shm_slot *s = hwb_shm_slot_at(h, idx[k]);
            if (res == NULL && j == 0) {
                /* the whole batch failed: the first gets the exception, the rest its message */
                reply_py(h, s, seqs[k], NULL, L->input_error);
                memcpy(buf, s->msg, s->msg_len);
                buf[s->msg_len] = 0;
            } else if (res == NULL) {
                __atomic_fetch_add(&h->errors, 1, __ATOMIC_RELAXED);
                reply(h, s, seqs[k], HWB_SHM_UNAVAILABLE, buf);
            } else {
                PyObject *item = PyList_Check(res) && j < PyList_GET_SIZE(res)
                                     ? PyList_GET_ITEM(res, j) : Py_None;
                reply_py(h, s, seqs[k], item, L->input_error);
            }
        }
        Py_XDECREF(res);
        Py_DECREF(lst);
    }
    PyGILState_Release(g);
}

static int scan(hwb_shm_header *h, uint32_t *idx) {
    int n = 0;
    for (uint32_t i = 0; i < h->nslots; i++) {
        hwb_shm_slot *s = hwb_shm_slot_at(h, i);
        if (HWB_LOAD_ACQ(&s->req) != HWB_LOAD_RLX(&s->resp)) idx[n++] = i;
    }
    return n;
}

static void poll_loop(loop_ctx *L, int lock_fd, int64_t spin_ns, int64_t reap_ns) {
    hwb_shm_header *h = L->h;
    uint32_t idx[MAX_SLOTS];
    int64_t now = hwb_now_ns(), last_busy = now, next_reap = now + reap_ns;
    const int64_t max_sleep = reap_ns < 100000000LL ? reap_ns : 100000000LL;
    while (HWB_LOAD_ACQ(&h->state) == HWB_SHM_STATE_RUNNING) {
        int n = scan(h, idx);
        if (n) {
            handle(L, idx, n);
            last_busy = hwb_now_ns();
            continue;
        }
        now = hwb_now_ns();
        if (now >= next_reap) {
            reap(h, lock_fd);
            HWB_STORE_RLX(&h->heartbeat_ns, (uint64_t)now);
            next_reap = now + reap_ns;
        }
        if (now - last_busy < spin_ns) {
            for (int k = 0; k < 8; k++) hwb_cpu_relax();
            continue;
        }
        /* idle: sleep on the doorbell; a client rings it only if it sees server_sleeping */
        uint32_t d = HWB_LOAD_ACQ(&h->doorbell);
        HWB_STORE_RLX(&h->server_sleeping, 1u);
        HWB_FENCE(); /* pairs with the client's fence between publishing req and reading this */
        if (scan(h, idx) == 0 && HWB_LOAD_ACQ(&h->state) == HWB_SHM_STATE_RUNNING) {
            int64_t left = next_reap - hwb_now_ns();
            hwb_futex_wait(&h->doorbell, d, left < 1000 ? 1000 : (left > max_sleep ? max_sleep : left));
        }
        HWB_STORE_RLX(&h->server_sleeping, 0u);
        last_busy = hwb_now_ns(); /* spin again after a wake-up: requests come in bursts */
    }
}

static PyObject *py_serve(PyObject *self, PyObject *args) {
    Py_buffer buf;
    int lock_fd, pin;
    PyObject *run, *slot_args, *batch, *input_error;
    long long spin_ns, reap_ns;
    loop_ctx L;
    if (!PyArg_ParseTuple(args, "w*iOOOOLLi", &buf, &lock_fd, &run, &slot_args, &batch,
                          &input_error, &spin_ns, &reap_ns, &pin))
        return NULL;
    L.h = (hwb_shm_header *)buf.buf;
    if ((size_t)buf.len < HWB_SHM_HEADER_BYTES || L.h->magic != HWB_SHM_MAGIC ||
        L.h->nslots > MAX_SLOTS || !PyTuple_Check(slot_args) ||
        PyTuple_GET_SIZE(slot_args) != (Py_ssize_t)L.h->nslots) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "serve(): not an initialised hwb segment, or slot_args "
                        "is not a tuple with one argument tuple per slot");
        return NULL;
    }
    L.run = run;
    L.slot_args = slot_args;
    L.batch = batch;
    L.input_error = input_error;
    if (pin >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(pin, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) { /* 0: this thread */
            PyBuffer_Release(&buf);
            return PyErr_SetFromErrno(PyExc_OSError);
        }
    }
    Py_BEGIN_ALLOW_THREADS
    poll_loop(&L, lock_fd, (int64_t)spin_ns, (int64_t)reap_ns);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    Py_RETURN_NONE;
}

static PyObject *py_init_segment(PyObject *self, PyObject *args) {
    Py_buffer buf;
    unsigned nslots, uid;
    int pid;
    unsigned long long gen;
    PyObject *ins, *outs;
    if (!PyArg_ParseTuple(args, "w*IOOIiK", &buf, &nslots, &ins, &outs, &uid, &pid, &gen))
        return NULL;
    hwb_shm_header *h = (hwb_shm_header *)buf.buf;
    Py_ssize_t ni = PyTuple_Size(ins), no = PyTuple_Size(outs);
    if (ni < 0 || no < 0 || ni > HWB_SHM_MAXDIM || no > HWB_SHM_MAXDIM) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "shapes must be tuples of at most 6 dimensions");
        return NULL;
    }
    memset(h, 0, HWB_SHM_HEADER_BYTES);
    uint32_t ci = 1, co = 1;
    for (Py_ssize_t i = 0; i < ni; i++) ci *= (h->in_shape[i] = (uint32_t)PyLong_AsUnsignedLong(PyTuple_GET_ITEM(ins, i)));
    for (Py_ssize_t i = 0; i < no; i++) co *= (h->out_shape[i] = (uint32_t)PyLong_AsUnsignedLong(PyTuple_GET_ITEM(outs, i)));
    if (PyErr_Occurred()) { PyBuffer_Release(&buf); return NULL; }
    size_t need = HWB_SHM_HEADER_BYTES + (size_t)nslots * hwb_shm_slot_bytes(ci, co);
    if ((size_t)buf.len < need || nslots == 0 || nslots > MAX_SLOTS) {
        PyBuffer_Release(&buf);
        PyErr_Format(PyExc_ValueError, "segment of %zd bytes too small (need %zu) or bad nslots",
                     buf.len, need);
        return NULL;
    }
    memset(buf.buf, 0, need);
    h->version = HWB_SHM_VERSION;
    h->header_bytes = HWB_SHM_HEADER_BYTES;
    h->nslots = nslots;
    h->slot_bytes = (uint32_t)hwb_shm_slot_bytes(ci, co);
    h->dtype = HWB_SHM_DTYPE_F32;
    h->in_count = ci;
    h->out_count = co;
    h->in_ndim = (uint32_t)ni;
    h->out_ndim = (uint32_t)no;
    for (Py_ssize_t i = 0; i < ni; i++) h->in_shape[i] = (uint32_t)PyLong_AsUnsignedLong(PyTuple_GET_ITEM(ins, i));
    for (Py_ssize_t i = 0; i < no; i++) h->out_shape[i] = (uint32_t)PyLong_AsUnsignedLong(PyTuple_GET_ITEM(outs, i));
    h->owner_uid = uid;
    h->server_pid = pid;
    h->generation = gen;
    HWB_STORE_REL(&h->state, HWB_SHM_STATE_RUNNING);
    HWB_STORE_REL(&h->magic, HWB_SHM_MAGIC); /* last */
    PyBuffer_Release(&buf);
    return PyLong_FromSize_t(need);
}

static PyObject *py_stop(PyObject *self, PyObject *args) {
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "w*", &buf)) return NULL;
    hwb_shm_header *h = (hwb_shm_header *)buf.buf;
    HWB_STORE_REL(&h->state, HWB_SHM_STATE_CLOSING);
    __atomic_fetch_add(&h->doorbell, 1u, __ATOMIC_SEQ_CST);
    hwb_futex_wake(&h->doorbell, INT_MAX);
    for (uint32_t i = 0; i < h->nslots && i < MAX_SLOTS; i++)
        hwb_futex_wake(&hwb_shm_slot_at(h, i)->resp, INT_MAX); /* blocked clients: server-gone */
    PyBuffer_Release(&buf);
    Py_RETURN_NONE;
}

static PyObject *py_counters(PyObject *self, PyObject *args) {
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*", &buf)) return NULL;
    hwb_shm_header *h = (hwb_shm_header *)buf.buf;
    PyObject *d = Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:I}", "served", (unsigned long long)HWB_LOAD_RLX(&h->served),
        "bad_payloads", (unsigned long long)HWB_LOAD_RLX(&h->bad_payloads), "deadline_missed",
        (unsigned long long)HWB_LOAD_RLX(&h->deadline_missed), "reaped",
        (unsigned long long)HWB_LOAD_RLX(&h->reaped), "errors",
        (unsigned long long)HWB_LOAD_RLX(&h->errors), "heartbeat_ns",
        (unsigned long long)HWB_LOAD_RLX(&h->heartbeat_ns), "generation_lo",
        (unsigned)(h->generation & 0xFFFFFFFFu));
    PyBuffer_Release(&buf);
    return d;
}

/* ---- client ------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    hwb_shm_client c;
    int busy; /* a call is in flight (set and cleared with the GIL held) */
} ClientObject;

static void Client_dealloc(ClientObject *o) {
    hwb_shm_detach(&o->c);
    Py_TYPE(o)->tp_free((PyObject *)o);
}

static PyObject *Client_new(PyTypeObject *t, PyObject *a, PyObject *k) {
    ClientObject *o = (ClientObject *)t->tp_alloc(t, 0);
    if (o) {
        o->c.lock_fd = -1; /* zeroed memory would name fd 0 */
        o->c.slot_index = -1;
    }
    return (PyObject *)o;
}

static int Client_init(ClientObject *o, PyObject *args, PyObject *kw) {
    static char *kws[] = {"name", "owner_uid", "in_count", "out_count", "spin_ns", "timeout_ns", NULL};
    const char *name;
    unsigned uid, ic, oc;
    long long spin, timeout;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sIIILL", kws, &name, &uid, &ic, &oc, &spin, &timeout))
        return -1;
    hwb_shm_detach(&o->c);
    int rc = hwb_shm_attach_as(&o->c, name, uid, ic, oc);
    if (rc) {
        PyObject *e = Py_BuildValue("(isi)", rc, hwb_shm_strerror(rc), o->c.err);
        PyErr_SetObject(PyExc_OSError, e);
        Py_XDECREF(e);
        return -1;
    }
    o->c.spin_ns = spin;
    o->c.timeout_ns = timeout;
    return 0;
}

static int float_buffer(PyObject *obj, Py_buffer *b, int writable, uint32_t count) {
    if (PyObject_GetBuffer(obj, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) != 0) {
        PyErr_Clear();
        return -1;
    }
    const char *f = b->format ? b->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (strcmp(f, "f") != 0 || b->itemsize != 4 || b->len != (Py_ssize_t)count * 4) {
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* call(x, out, deadline_ns) -> status (int). x, out: float32 C-contiguous with the endpoint's
 * element counts (else RC_BAD_BUFFER, nothing sent). The GIL is released for the round trip. */
static PyObject *Client_call(ClientObject *o, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer bx, by;
    long long dl;
    int rc;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "call(x, out, deadline_ns)");
        return NULL;
    }
    dl = PyLong_AsLongLong(args[2]);
    if (dl == -1 && PyErr_Occurred()) return NULL;
    if (!o->c.slot) return PyLong_FromLong(HWB_SHM_E_CLOSED);
    if (o->busy) return PyLong_FromLong(RC_BUSY); /* one slot serves one thread at a time */
    if (float_buffer(args[0], &bx, 0, o->c.in_count)) return PyLong_FromLong(RC_BAD_BUFFER);
    if (float_buffer(args[1], &by, 1, o->c.out_count)) {
        PyBuffer_Release(&bx);
        return PyLong_FromLong(RC_BAD_BUFFER - 1);
    }
    o->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = hwb_shm_predict(&o->c, (const float *)bx.buf, o->c.in_count, (float *)by.buf,
                         o->c.out_count, (int64_t)dl);
    Py_END_ALLOW_THREADS
    o->busy = 0;
    PyBuffer_Release(&bx);
    PyBuffer_Release(&by);
    return PyLong_FromLong(rc);
}

static PyObject *Client_message(ClientObject *o, PyObject *unused) {
    return PyUnicode_DecodeUTF8(hwb_shm_message(&o->c), (Py_ssize_t)strlen(hwb_shm_message(&o->c)), "replace");
}

static PyObject *Client_detach(ClientObject *o, PyObject *unused) {
    if (o->busy) { /* unmapping under a running call would crash it */
        PyErr_SetString(PyExc_RuntimeError, "a call is in flight on this client (another thread)");
        return NULL;
    }
    hwb_shm_detach(&o->c);
    Py_RETURN_NONE;
}

static PyObject *shape_tuple(const uint32_t *s, uint32_t n) {
    PyObject *t = PyTuple_New(n);
    for (uint32_t i = 0; i < n; i++) PyTuple_SET_ITEM(t, i, PyLong_FromUnsignedLong(s[i]));
    return t;
}

static PyObject *Client_info(ClientObject *o, PyObject *unused) {
    hwb_shm_client *c = &o->c;
    if (!c->hdr) Py_RETURN_NONE;
    return Py_BuildValue("{s:i,s:N,s:N,s:i,s:I,s:I,s:K}", "slot", c->slot_index, "in_shape",
                         shape_tuple(c->hdr->in_shape, c->hdr->in_ndim), "out_shape",
                         shape_tuple(c->hdr->out_shape, c->hdr->out_ndim), "server_pid",
                         c->server_pid, "nslots", c->hdr->nslots, "seq", c->seq, "generation",
                         (unsigned long long)c->hdr->generation);
}

static PyMethodDef Client_methods[] = {
    {"call", (PyCFunction)(void (*)(void))Client_call, METH_FASTCALL, "call(x, out, deadline_ns) -> status"},
    {"message", (PyCFunction)Client_message, METH_NOARGS, "the server's message for the last status"},
    {"detach", (PyCFunction)Client_detach, METH_NOARGS, "release the slot and unmap"},
    {"info", (PyCFunction)Client_info, METH_NOARGS, "slot, shapes, server pid"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ClientType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hwbackends.serve._shmloop.Client",
    .tp_basicsize = sizeof(ClientObject),
    .tp_dealloc = (destructor)Client_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "hwb_shm.h client (one slot)",
    .tp_methods = Client_methods,
    .tp_init = (initproc)Client_init,
    .tp_new = Client_new,
};

static PyObject *py_slot_bytes(PyObject *self, PyObject *args) {
    unsigned ic, oc;
    if (!PyArg_ParseTuple(args, "II", &ic, &oc)) return NULL;
    return PyLong_FromSize_t(hwb_shm_slot_bytes(ic, oc));
}

static PyMethodDef methods[] = {
    {"serve", py_serve, METH_VARARGS, "serve(buf, lock_fd, run, slot_args, batch, input_error, spin_ns, reap_ns, pin)"},
    {"init_segment", py_init_segment, METH_VARARGS, "init_segment(buf, nslots, in_shape, out_shape, uid, pid, generation) -> bytes used"},
    {"stop", py_stop, METH_VARARGS, "stop(buf): mark closing and wake everyone"},
    {"counters", py_counters, METH_VARARGS, "counters(buf) -> dict"},
    {"slot_bytes", py_slot_bytes, METH_VARARGS, "slot_bytes(in_count, out_count)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_shmloop", NULL, -1, methods};

PyMODINIT_FUNC PyInit__shmloop(void) {
    PyObject *m;
    if (PyType_Ready(&ClientType) < 0) return NULL;
    m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&ClientType);
    PyModule_AddObject(m, "Client", (PyObject *)&ClientType);
    PyModule_AddIntConstant(m, "VERSION", HWB_SHM_VERSION);
    PyModule_AddIntConstant(m, "HEADER_BYTES", HWB_SHM_HEADER_BYTES);
    PyModule_AddIntConstant(m, "SLOT_CTL", HWB_SHM_SLOT_CTL);
    PyModule_AddIntConstant(m, "RC_BAD_BUFFER", RC_BAD_BUFFER);
    PyModule_AddIntConstant(m, "RC_BUSY", RC_BUSY);
    return m;
}
