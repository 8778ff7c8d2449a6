/* _shmloop: the native request loop of the shared-memory endpoint (see hwb_shm.h for the
 * protocol, and hwbackends/serve/shm.py for the Python side).
 *
 * serve(): the server's poll loop. It scans the attached clients' slots with the GIL
 * released, busy-polling for spin_ns after the last request and then sleeping in poll() on the
 * clients' connections (a client writes a doorbell byte only when server_sleeping is set), the
 * listening socket and a stop eventfd. A new connection gets its own sealed memfd slot; a
 * hang-up frees it at once. Requests are checked in C (size, deadline, NaN/Inf: refused and
 * counted without touching Python); a valid request takes the GIL just for the model call, in
 * this very thread: no hand-off to another thread — or, when the gate holds a native entry
 * (direct mode over an executor with one, e.g. cpu.native), never takes it: the loop calls
 * the model's C function on the slot memory itself. Geometry and "what did I answer last" are
 * the loop's own copies: nothing a client writes is re-read as server state.
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

#include "include/hwb_native.h"
#include "include/hwb_shm.h"

#define MAX_SLOTS 1024
#define MAX_STREAMS (1u << 16) /* windows per client of a sliding endpoint (sliding.MAX_STREAMS) */
#define RC_BAD_BUFFER (-100) /* call(): x/out are not float32 C-contiguous of the right size */
#define RC_BUSY (-102)       /* call(): the client is in use by another thread */

/* ---- server ------------------------------------------------------------------------- */

#define HWB_SHM_SEALS_OK(fd, want) ((fcntl((fd), F_GET_SEALS) & (want)) == (want))

static void reply(hwb_shm_slot *s, uint32_t seq, uint32_t status, const char *msg) {
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
}

/* One window of one client of a sliding endpoint: the server's own record. */
typedef struct win_t {
    hwb_window *h;       /* the native path's handle (window_new); NULL until its first tick */
    struct win_t *next;  /* the prepare queue's link */
    uint32_t slot;       /* the client (slot index) it belongs to */
    uint8_t queued;      /* in the prepare queue */
} win_t;

/* One attached client. Everything here is the server's own: the slot memory is the client's
 * to write, so nothing read from it is kept or trusted beyond the one request. */
typedef struct {
    int conn;              /* the client's connection; -1: free */
    hwb_shm_slot *s;       /* the slot mapping (owned by `mm`, a Python mmap) */
    uint32_t answered;     /* the last sequence the server answered (its own record) */
    PyObject *mm, *args;   /* mmap object (its buffer held in `view`) and (x, y) views */
    Py_buffer view;
    /* a sliding endpoint: this client's windows, made on its first tick, freed at hang-up */
    win_t *wins;           /* streams entries (NULL: no tick yet) */
    PyObject *py_push, *py_prepare, *py_reset; /* the Python path: its Windows' methods */
} slot_t;

/* ---- native fast path ---------------------------------------------------------------- */
/* An executor's raw C entry (hwbackends.target.Executor.native_entry): hwb_native.h defines
 * it (ABI, layout, rules). Gate_set takes entries of every ABI for whole inputs (predict); a
 * sliding endpoint's native windows take an ABI 3 entry's window handles (parse_sliding). */

/* Gate: which native entry (if any) the poll loop calls instead of the Python handler. The
 * loop reads `entry` once per batch of pending slots, with the GIL released (an atomic
 * pointer load); set() runs in whichever Python thread switches the serving version. */
typedef struct {
    PyObject_HEAD
    const hwb_native_entry *entry; /* NULL: every request takes the Python path */
    uint32_t in_count, out_count;  /* the endpoint's; an entry of other sizes is refused */
    uint64_t served, failed;       /* native calls answered OK / returned nonzero */
    PyObject *keep;                /* every capsule ever set: nothing the loop saw is freed */
} GateObject;

static PyTypeObject GateType;

/* A sliding endpoint's windows: an ABI 3 native entry's handles (window_new / _push /
 * _prepare / _reset / _free, called without the GIL), or, when it has none, one Python
 * Windows per client (`make_windows()`, i.e. cm.sliding(streams=N): its push_into(i, x, y),
 * prepare(), reset(i), with the GIL). */
typedef struct {
    uint32_t window;             /* ticks in the window; 0: not a sliding endpoint */
    uint32_t streams;            /* windows per client: stream ids 0 .. streams-1 */
    const hwb_native_entry *e;   /* native (NULL: the Python path) */
    PyObject *make_windows;      /* the Python path's */
} sliding_ops;

/* The native entry in `cap`, or NULL with a ValueError saying why this loop cannot call it
 * (not a native entry; an ABI or struct size hwb_native_entry_readable refuses). */
static const hwb_native_entry *entry_of(PyObject *cap) {
    const hwb_native_entry *e;
    if (!PyCapsule_IsValid(cap, HWB_NATIVE_ENTRY_NAME)) {
        PyErr_SetString(PyExc_ValueError, "not a native entry: expected a PyCapsule named "
                        "'" HWB_NATIVE_ENTRY_NAME "'");
        return NULL;
    }
    e = (const hwb_native_entry *)PyCapsule_GetPointer(cap, HWB_NATIVE_ENTRY_NAME);
    if (!e) return NULL;
    if (hwb_native_entry_readable(e) == 0) {
        PyErr_Format(PyExc_ValueError, "native entry of ABI %u (%u bytes%s); this server reads "
                     "ABI 1 (%u bytes or more), ABI 2 (%u or more) and ABI 3 (%u or more)", e->abi,
                     e->struct_bytes, e->predict ? "" : ", no predict", HWB_NATIVE_ENTRY_V1_BYTES,
                     HWB_NATIVE_ENTRY_V2_BYTES, (unsigned)sizeof(hwb_native_entry));
        return NULL;
    }
    return e;
}

/* The entry in `cap` when its windows are handles this loop can keep one per stream, or NULL
 * with a ValueError saying why not (entry_of's reasons, an ABI 1 or 2 entry, an ABI 3 one
 * whose window functions are NULL). */
static const hwb_native_entry *windows_entry_of(PyObject *cap) {
    const hwb_native_entry *e = entry_of(cap);
    if (!e) return NULL;
    if (!hwb_native_entry_has_windows(e)) {
        PyErr_Format(PyExc_ValueError, "native entry of ABI %u has no window handles%s", e->abi,
                     e->abi < 3u ? " (window_new/_push/... came with ABI 3: rebuild the artifact)"
                                 : " (a window_* function, push, prepare or reset is NULL, or "
                                   "window/step_count 0)");
        return NULL;
    }
    return e;
}

typedef struct {
    hwb_shm_header *h; /* the server's writable mapping of the header */
    int hdr_fd, listen_fd, stop_fd;
    uint32_t nslots, in_count, out_count, slot_bytes; /* own copies; never re-read */
    uint32_t in_shape0; /* the input's first axis (a whole-input endpoint's window length) */
    uint64_t generation;
    slot_t *slots;
    struct pollfd *pfd;
    PyObject *run, *make_slot, *batch, *input_error;
    GateObject *gate; /* NULL: no native fast path (batch mode) */
    sliding_ops sl;
    win_t *prep_head, *prep_tail; /* windows pushed and not prepared yet, oldest first */
} loop_ctx;

static void count(uint64_t *c) { __atomic_fetch_add(c, 1, __ATOMIC_RELAXED); }

/* The refusal of a request whose size is not the endpoint's: what it takes, and what the
 * request looks like when it is a whole window sent to a sliding endpoint or one tick sent
 * to a whole-window one. */
static const char *wrong_size(loop_ctx *L, uint32_t got, char *buf, size_t n) {
    if (L->sl.window)
        snprintf(buf, n, "wrong payload size: this sliding endpoint takes one tick of %u float32 "
                 "features (it keeps the %u-tick window), the request carried %u%s",
                 L->in_count, L->sl.window, got,
                 (uint64_t)got == (uint64_t)L->in_count * L->sl.window
                     ? ": a whole window? send only the newest tick" : "");
    else
        snprintf(buf, n, "wrong payload size: this endpoint takes %u float32 features, the "
                 "request carried %u%s", L->in_count, got,
                 L->in_shape0 > 1 && (uint64_t)got * L->in_shape0 == L->in_count
                     ? ": one tick? this endpoint takes whole windows (serve it with --sliding "
                       "to send ticks)" : "");
    return buf;
}

/* A request the server refuses without running the model; NULL if it is acceptable. Reads
 * each client-written word once; the size and flags it accepted go to *got / *flags. */
static const char *precheck(loop_ctx *L, hwb_shm_slot *s, int64_t now, uint32_t *status,
                            char *buf, size_t n, uint32_t *got_out, uint32_t *flags_out,
                            uint32_t *stream_out) {
    uint32_t got = HWB_LOAD_RLX(&s->in_count);
    uint32_t flags = HWB_LOAD_RLX(&s->flags);
    uint32_t stream = HWB_LOAD_RLX(&s->stream);
    int64_t dl = HWB_LOAD_RLX(&s->deadline_ns);
    const float *x = hwb_shm_slot_in(s);
    *got_out = got;
    *flags_out = flags;
    *stream_out = stream;
    *status = HWB_SHM_BAD_INPUT;
    if (flags & ~HWB_SHM_FLAG_RESET) {
        snprintf(buf, n, "unknown request flags 0x%x (this server knows HWB_SHM_FLAG_RESET only)",
                 flags);
        return buf;
    }
    if (flags && !L->sl.window)
        return "a reset was asked of an endpoint that keeps no window (it takes whole inputs); "
               "resets are for sliding endpoints (hwb serve --shm NAME --sliding)";
    if (stream && !L->sl.window) {
        snprintf(buf, n, "stream id %u sent to an endpoint that keeps no windows (it takes whole "
                 "inputs); stream ids are for sliding endpoints (hwb serve --shm NAME --sliding "
                 "--streams N)", stream);
        return buf;
    }
    if (L->sl.window && stream >= L->sl.streams) {
        snprintf(buf, n, "stream id %u out of range: this endpoint keeps %u window%s per client "
                 "(stream ids 0 to %u); serve more with hwb serve --streams N", stream,
                 L->sl.streams, L->sl.streams == 1 ? "" : "s", L->sl.streams - 1);
        return buf;
    }
    if (got == 0 && (flags & HWB_SHM_FLAG_RESET)) return NULL; /* a reset alone */
    if (got != L->in_count) return wrong_size(L, got, buf, n);
    if (dl > 0 && now > dl) {
        *status = HWB_SHM_DEADLINE;
        return "deadline";
    }
    for (uint32_t i = 0; i < L->in_count; i++) {
        if (!isfinite(x[i])) {
            snprintf(buf, n, "input has NaN or Inf (feature %u); the endpoint refuses "
                     "non-finite features: clean them in the strategy", i);
            return buf;
        }
    }
    return NULL;
}

/* A status the Python side may answer with: one the server sends (never OK, whose answer
 * is None, nor a client-side E_*). */
static int server_status(long st) {
    return st == HWB_SHM_UNAVAILABLE || st == HWB_SHM_BAD_INPUT || st == HWB_SHM_DEADLINE ||
           st == HWB_SHM_BREAKER_OPEN || st == HWB_SHM_STOPPED;
}

/* Status and message of one Python result (None: ok; (status, message): the Status and
 * reason of an Unavailable, a code of HWB_SHM_STATUSES) or of the pending exception
 * (res == NULL). Writes the reply and counts it. Needs the GIL. */
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
        count(bad ? &h->bad_payloads : &h->errors);
        reply(s, seq, bad ? HWB_SHM_BAD_INPUT : HWB_SHM_UNAVAILABLE, buf);
    } else if (res == Py_None) {
        count(&h->served);
        reply(s, seq, HWB_SHM_OK, NULL);
    } else {
        long st = -1;
        const char *m = NULL;
        if (PyTuple_Check(res) && PyTuple_GET_SIZE(res) == 2) {
            st = PyLong_AsLong(PyTuple_GET_ITEM(res, 0));
            m = PyUnicode_Check(PyTuple_GET_ITEM(res, 1)) ? PyUnicode_AsUTF8(PyTuple_GET_ITEM(res, 1)) : NULL;
        }
        if (m == NULL || !server_status(st)) {
            PyErr_Clear();
            st = HWB_SHM_UNAVAILABLE;
            m = "server error: the handler returned neither None nor (status, message)";
        }
        count(st == HWB_SHM_DEADLINE ? &h->deadline_missed
              : st == HWB_SHM_BAD_INPUT ? &h->bad_payloads : &h->errors);
        reply(s, seq, (uint32_t)st, m);
    }
}

/* The prepare queue: windows pushed since their last prepare, run in the loop's idle time
 * (poll_loop: one per turn, after looking for new requests). A window is in it at most once. */
static void enqueue(loop_ctx *L, win_t *w) {
    if (w->queued) return;
    w->queued = 1;
    w->next = NULL;
    if (L->prep_tail) L->prep_tail->next = w; else L->prep_head = w;
    L->prep_tail = w;
}

/* Take client `slot`'s windows out of the queue (it hung up: they are about to be freed). */
static void unqueue_slot(loop_ctx *L, uint32_t slot) {
    win_t **p = &L->prep_head;
    L->prep_tail = NULL;
    while (*p) {
        if ((*p)->slot == slot) { (*p)->queued = 0; *p = (*p)->next; }
        else { L->prep_tail = *p; p = &(*p)->next; }
    }
}

/* Run the oldest pending prepare. Without the GIL; the Python path takes it for the call.
 * A failed prepare is counted; the window's next push prepares it again itself. */
static void prepare_one(loop_ctx *L) {
    win_t *w = L->prep_head;
    if (!w) return;
    L->prep_head = w->next;
    if (!L->prep_head) L->prep_tail = NULL;
    w->queued = 0;
    w->next = NULL;
    if (L->sl.e) {
        if (w->h && L->sl.e->window_prepare(w->h) != 0) count(&L->h->errors);
        return;
    }
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *prep = L->slots[w->slot].py_prepare;
    if (prep) { /* this client's Windows.prepare(): its windows with work pending (later
                   entries of the same client find nothing left to do) */
        PyObject *r = PyObject_CallNoArgs(prep);
        if (!r) { PyErr_Clear(); count(&L->h->errors); }
        Py_XDECREF(r);
    }
    PyGILState_Release(g);
}

/* The Python path: client `sl`'s Windows (made on its first tick). 0, or -1 with a Python
 * exception pending. Needs the GIL. */
static int py_windows(loop_ctx *L, slot_t *sl) {
    PyObject *w;
    if (sl->py_push) return 0;
    w = PyObject_CallNoArgs(L->sl.make_windows);
    if (!w) return -1;
    sl->py_push = PyObject_GetAttrString(w, "push_into");
    sl->py_prepare = PyObject_GetAttrString(w, "prepare");
    sl->py_reset = PyObject_GetAttrString(w, "reset");
    Py_DECREF(w); /* the bound methods keep it */
    if (!sl->py_push || !sl->py_prepare || !sl->py_reset) {
        Py_CLEAR(sl->py_push);
        Py_CLEAR(sl->py_prepare);
        Py_CLEAR(sl->py_reset);
        return -1;
    }
    __atomic_fetch_add(&L->h->windows, L->sl.streams, __ATOMIC_RELAXED);
    return 0;
}

/* Free client `i`'s windows (it hung up, or the server stops). The native handles need no
 * GIL; the Python path's Windows does (the caller holds it). */
static void free_windows(loop_ctx *L, uint32_t i) {
    slot_t *sl = &L->slots[i];
    if (sl->wins) {
        unqueue_slot(L, i);
        for (uint32_t k = 0; k < L->sl.streams; k++) {
            if (sl->wins[k].h) {
                L->sl.e->window_free(sl->wins[k].h);
                __atomic_fetch_sub(&L->h->windows, 1u, __ATOMIC_RELAXED);
            }
        }
        PyMem_RawFree(sl->wins);
        sl->wins = NULL;
    }
    if (sl->py_push) __atomic_fetch_sub(&L->h->windows, L->sl.streams, __ATOMIC_RELAXED);
    Py_CLEAR(sl->py_push);
    Py_CLEAR(sl->py_prepare);
    Py_CLEAR(sl->py_reset);
}

/* The Python path's call of one of its Windows' methods: reset(i) (x NULL) or push_into(i, x,
 * y). New reference or NULL with an exception. Needs the GIL. */
static PyObject *py_window_call(PyObject *fn, uint32_t stream, PyObject *x, PyObject *y) {
    PyObject *i = PyLong_FromUnsignedLong(stream), *r;
    if (!i) return NULL;
    PyObject *args[3] = {i, x, y};
    r = PyObject_Vectorcall(fn, args, x ? 3 : 1, NULL);
    Py_DECREF(i);
    return r;
}

/* A sliding endpoint's pending slots: per request, the reset it asks for, then the push of its
 * tick into its stream's window and the answer published; the window then waits in the
 * prepare queue for the loop's idle time (the client's critical path is the push only).
 * Without the GIL; the Python path takes it for the round. */
static void handle_sliding(loop_ctx *L, const uint32_t *idx, const uint32_t *seqs,
                           const int *valid, const uint32_t *gots, const uint32_t *flags,
                           const uint32_t *streams, int nv) {
    hwb_shm_header *h = L->h;
    const hwb_native_entry *e = L->sl.e;
    char buf[HWB_SHM_MSG + 1];
    PyGILState_STATE g = PyGILState_UNLOCKED;
    if (!e) g = PyGILState_Ensure();
    for (int j = 0; j < nv; j++) {
        int k = valid[j];
        uint32_t st = streams[k]; /* checked by precheck: < L->sl.streams */
        slot_t *sl = &L->slots[idx[k]];
        float *x = hwb_shm_slot_in(sl->s);
        win_t *w;
        if (!sl->wins) {
            sl->wins = (win_t *)PyMem_RawCalloc(L->sl.streams, sizeof(win_t));
            if (!sl->wins) {
                count(&h->errors);
                reply(sl->s, seqs[k], HWB_SHM_UNAVAILABLE, "server error: out of memory for "
                      "this client's windows");
                continue;
            }
            for (uint32_t q = 0; q < L->sl.streams; q++) sl->wins[q].slot = idx[k];
        }
        w = &sl->wins[st];
        if (flags[k] & HWB_SHM_FLAG_RESET) { /* a window never pushed is empty already */
            int bad = 0;
            if (e) {
                bad = w->h && e->window_reset(w->h) != 0;
            } else if (sl->py_reset) {
                PyObject *r = py_window_call(sl->py_reset, st, NULL, NULL);
                bad = r == NULL;
                Py_XDECREF(r);
            }
            if (bad) {
                if (e) { count(&h->errors); reply(sl->s, seqs[k], HWB_SHM_UNAVAILABLE,
                                                  "server error: the window's reset failed"); }
                else reply_py(h, sl->s, seqs[k], NULL, L->input_error);
                continue;
            }
            if (gots[k] == 0) { /* a reset alone: answered, no outputs */
                count(&h->served);
                reply(sl->s, seqs[k], HWB_SHM_OK, NULL);
                continue;
            }
        }
        if (e) {
            int rc;
            if (!w->h) {
                w->h = e->window_new();
                if (!w->h) {
                    count(&h->errors);
                    reply(sl->s, seqs[k], HWB_SHM_UNAVAILABLE, "server error: the model's "
                          "window_new returned NULL (out of memory)");
                    continue;
                }
                __atomic_fetch_add(&h->windows, 1u, __ATOMIC_RELAXED);
            }
            rc = e->window_push(w->h, x, x + L->in_count);
            if (rc == 0) {
                count(&h->served);
                reply(sl->s, seqs[k], HWB_SHM_OK, NULL);
                enqueue(L, w);
            } else {
                snprintf(buf, sizeof buf, "server error: the model's native window_push returned %d", rc);
                count(&h->errors);
                reply(sl->s, seqs[k], HWB_SHM_UNAVAILABLE, buf);
            }
        } else {
            PyObject *res = NULL;
            if (py_windows(L, sl) == 0)
                res = py_window_call(sl->py_push, st, PyTuple_GET_ITEM(sl->args, 0),
                                     PyTuple_GET_ITEM(sl->args, 1));
            if (res) enqueue(L, w);
            reply_py(h, sl->s, seqs[k], res, L->input_error);
            Py_XDECREF(res);
        }
    }
    if (!e) PyGILState_Release(g);
}

/* Handle the pending slots; called and returns without the GIL. */
static void handle(loop_ctx *L, const uint32_t *idx, const uint32_t *seqs, int n) {
    hwb_shm_header *h = L->h;
    int valid[MAX_SLOTS], nv = 0;
    int64_t dls[MAX_SLOTS];
    uint32_t gots[MAX_SLOTS], flags[MAX_SLOTS], streams[MAX_SLOTS];
    int64_t now = hwb_now_ns();
    char buf[HWB_SHM_MSG + 1];
    for (int k = 0; k < n; k++) {
        hwb_shm_slot *s = L->slots[idx[k]].s;
        uint32_t status = 0;
        const char *why = precheck(L, s, now, &status, buf, sizeof buf, &gots[k], &flags[k],
                                   &streams[k]);
        L->slots[idx[k]].answered = seqs[k];
        if (why) {
            count(status == HWB_SHM_DEADLINE ? &h->deadline_missed : &h->bad_payloads);
            reply(s, seqs[k], status, why);
        } else {
            dls[nv] = HWB_LOAD_RLX(&s->deadline_ns);
            valid[nv++] = k;
        }
    }
    if (nv == 0) return;
    if (L->sl.window) {
        handle_sliding(L, idx, seqs, valid, gots, flags, streams, nv);
        return;
    }
    if (L->gate) {
        const hwb_native_entry *e = __atomic_load_n(&L->gate->entry, __ATOMIC_ACQUIRE);
        if (e) { /* the fast path: the model's C entry on the slot's own memory, no GIL */
            for (int j = 0; j < nv; j++) {
                hwb_shm_slot *s = L->slots[idx[valid[j]]].s;
                float *x = hwb_shm_slot_in(s);
                int rc = e->predict(x, x + L->in_count);
                if (rc == 0) {
                    count(&L->gate->served);
                    count(&h->served);
                    reply(s, seqs[valid[j]], HWB_SHM_OK, NULL);
                } else { /* never a wrong answer: not OK, so the client reads no outputs */
                    snprintf(buf, sizeof buf, "server error: the model's native entry returned "
                             "%d", rc);
                    count(&L->gate->failed);
                    count(&h->errors);
                    reply(s, seqs[valid[j]], HWB_SHM_UNAVAILABLE, buf);
                }
            }
            return;
        }
    }
    PyGILState_STATE g = PyGILState_Ensure();
    if (L->batch == Py_None) {
        for (int j = 0; j < nv; j++) {
            slot_t *sl = &L->slots[idx[valid[j]]];
            PyObject *res = PyObject_Call(L->run, sl->args, NULL);
            reply_py(h, sl->s, seqs[valid[j]], res, L->input_error);
            Py_XDECREF(res);
        }
    } else {
        PyObject *lst = PyList_New(nv), *res;
        for (int j = 0; j < nv; j++) {
            slot_t *sl = &L->slots[idx[valid[j]]];
            PyList_SET_ITEM(lst, j, Py_BuildValue("(OOL)", PyTuple_GET_ITEM(sl->args, 0),
                                                  PyTuple_GET_ITEM(sl->args, 1), (long long)dls[j]));
        }
        res = PyObject_CallOneArg(L->batch, lst);
        for (int j = 0; j < nv; j++) {
            int k = valid[j];
            hwb_shm_slot *s = L->slots[idx[k]].s;
            if (res == NULL && j == 0) {
                /* the whole batch failed: the first gets the exception, the rest its message */
                reply_py(h, s, seqs[k], NULL, L->input_error);
                snprintf(buf, sizeof buf, "server error: the batch failed");
            } else if (res == NULL) {
                count(&h->errors);
                reply(s, seqs[k], HWB_SHM_UNAVAILABLE, buf);
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

/* Pending requests: req (client-written, read once) differs from what we answered last. */
static int scan(loop_ctx *L, uint32_t *idx, uint32_t *seqs) {
    int n = 0;
    for (uint32_t i = 0; i < L->nslots; i++) {
        slot_t *sl = &L->slots[i];
        uint32_t r;
        if (sl->conn < 0) continue;
        r = HWB_LOAD_ACQ(&sl->s->req);
        if (r != sl->answered) {
            idx[n] = i;
            seqs[n++] = r;
        }
    }
    return n;
}

static void send_hello(int conn, int32_t status, uint32_t index, uint32_t slot_bytes,
                       uint64_t generation, const int *fds, int nfds) {
    hwb_shm_hello hello;
    union { struct cmsghdr h; char buf[CMSG_SPACE(2 * sizeof(int))]; } ctl;
    struct iovec iov = {&hello, sizeof hello};
    struct msghdr m;
    memset(&hello, 0, sizeof hello);
    hello.magic = HWB_SHM_MAGIC;
    hello.version = HWB_SHM_VERSION;
    hello.status = status;
    hello.slot_index = index;
    hello.slot_bytes = slot_bytes;
    hello.generation = generation;
    memset(&m, 0, sizeof m);
    memset(&ctl, 0, sizeof ctl);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (nfds) {
        struct cmsghdr *cm;
        m.msg_control = ctl.buf;
        m.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
        cm = CMSG_FIRSTHDR(&m);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
    }
    /* a fresh connection's buffer is empty: 32 bytes never block */
    (void)sendmsg(conn, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* Give a new connection its own slot: a sealed memfd, mapped by Python (views) and sent to
 * the client. Needs the GIL. */
static void attach_client(loop_ctx *L, int conn) {
    int free_i = -1, fd = -1;
    PyObject *pair = NULL;
    for (uint32_t i = 0; i < L->nslots; i++)
        if (L->slots[i].conn < 0) { free_i = (int)i; break; }
    if (free_i < 0) {
        send_hello(conn, HWB_SHM_E_SLOTS_FULL, 0, 0, L->generation, NULL, 0);
        close(conn);
        return;
    }
    fd = (int)syscall(SYS_memfd_create, "hwb-slot", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, L->slot_bytes) != 0 ||
        fcntl(fd, F_ADD_SEALS, HWB_SHM_SLOT_SEALS) != 0 || !HWB_SHM_SEALS_OK(fd, HWB_SHM_SLOT_SEALS))
        goto fail;
    pair = PyObject_CallFunction(L->make_slot, "i", fd); /* -> (mmap, (x, y)) */
    if (pair == NULL || !PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
        !PyTuple_Check(PyTuple_GET_ITEM(pair, 1)) || PyTuple_GET_SIZE(PyTuple_GET_ITEM(pair, 1)) != 2)
        goto fail;
    slot_t *sl = &L->slots[free_i];
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(pair, 0), &sl->view, PyBUF_WRITABLE) != 0) goto fail;
    if ((size_t)sl->view.len < L->slot_bytes) { PyBuffer_Release(&sl->view); goto fail; }
    sl->mm = PyTuple_GET_ITEM(pair, 0);
    sl->args = PyTuple_GET_ITEM(pair, 1);
    Py_INCREF(sl->mm);
    Py_INCREF(sl->args);
    Py_DECREF(pair);
    sl->s = (hwb_shm_slot *)sl->view.buf;
    sl->answered = 0;
    sl->wins = NULL; /* a new session: its windows are made empty on their first tick */
    sl->conn = conn;
    {
        int fds[2] = {L->hdr_fd, fd};
        send_hello(conn, 0, (uint32_t)free_i, L->slot_bytes, L->generation, fds, 2);
    }
    close(fd); /* Python's mmap keeps its own descriptor */
    return;
fail:
    PyErr_Clear();
    Py_XDECREF(pair);
    if (fd >= 0) close(fd);
    count(&L->h->errors);
    close(conn);
}

/* The client hung up (or died): free its slot at once. Needs the GIL. */
static void detach_client(loop_ctx *L, uint32_t i) {
    slot_t *sl = &L->slots[i];
    if (sl->conn < 0) return;
    close(sl->conn);
    sl->conn = -1;
    free_windows(L, i);
    sl->s = NULL;
    PyBuffer_Release(&sl->view);
    Py_CLEAR(sl->args);
    Py_CLEAR(sl->mm); /* unmapped when the last view goes */
    count(&L->h->detached);
}

/* Accept new clients, drain doorbell bytes, free slots of clients that hung up. `timeout_ms`:
 * 0 while spinning, else how long to sleep. Returns 1 when asked to stop. */
static int housekeep(loop_ctx *L, int timeout_ms) {
    int n = 0, rc;
    L->pfd[n].fd = L->stop_fd; L->pfd[n].events = POLLIN; L->pfd[n++].revents = 0;
    L->pfd[n].fd = L->listen_fd; L->pfd[n].events = POLLIN; L->pfd[n++].revents = 0;
    for (uint32_t i = 0; i < L->nslots; i++) {
        L->pfd[n].fd = L->slots[i].conn; /* -1: ignored by poll */
        L->pfd[n].events = POLLIN;
        L->pfd[n++].revents = 0;
    }
    do rc = poll(L->pfd, (nfds_t)n, timeout_ms);
    while (rc < 0 && errno == EINTR);
    if (rc <= 0) return 0;
    if (L->pfd[0].revents) return 1;
    int gil = 0;
    PyGILState_STATE g = PyGILState_UNLOCKED;
    for (uint32_t i = 0; i < L->nslots; i++) {
        short ev = L->pfd[2 + i].revents;
        if (!ev || L->slots[i].conn < 0) continue;
        int gone = (ev & (POLLHUP | POLLERR | POLLNVAL)) != 0;
        if (!gone && (ev & POLLIN)) { /* doorbell bytes (their content means nothing) */
            char junk[256];
            ssize_t k;
            while ((k = recv(L->slots[i].conn, junk, sizeof junk, MSG_DONTWAIT)) > 0) {}
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) gone = 1;
        }
        if (gone) {
            if (!gil) { g = PyGILState_Ensure(); gil = 1; }
            detach_client(L, i);
        }
    }
    if (L->pfd[1].revents & POLLIN) {
        for (int k = 0; k < 64; k++) { /* bounded: one flood of connects cannot stall serving */
            int conn = accept4(L->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (conn < 0) break;
            if (!gil) { g = PyGILState_Ensure(); gil = 1; }
            attach_client(L, conn);
        }
    }
    if (gil) PyGILState_Release(g);
    return 0;
}

static void poll_loop(loop_ctx *L, int64_t spin_ns, int64_t reap_ns) {
    hwb_shm_header *h = L->h;
    uint32_t idx[MAX_SLOTS], seqs[MAX_SLOTS];
    int64_t now = hwb_now_ns(), last_busy = now, next_house = now;
    const int64_t house_ns = 1000000LL; /* look for new clients and hang-ups every 1 ms while busy */
    const int64_t max_sleep_ms = reap_ns / 1000000LL < 1 ? 1 : (reap_ns / 1000000LL > 100 ? 100 : reap_ns / 1000000LL);
    for (;;) {
        int n = scan(L, idx, seqs);
        if (n) {
            handle(L, idx, seqs, n);
            last_busy = hwb_now_ns();
            if (last_busy < next_house) continue;
        } else if (L->prep_head) {
            /* idle time: one window's prepare, then look for new requests again, so a tick
             * that arrived meanwhile is answered before the remaining prepares */
            prepare_one(L);
            last_busy = hwb_now_ns();
            if (last_busy < next_house) continue;
        }
        now = hwb_now_ns();
        if (now >= next_house) {
            if (housekeep(L, 0)) return;
            HWB_STORE_RLX(&h->heartbeat_ns, (uint64_t)now);
            next_house = now + house_ns;
            continue;
        }
        if (now - last_busy < spin_ns) {
            for (int k = 0; k < 8; k++) hwb_cpu_relax();
            continue;
        }
        /* idle: sleep in poll(); a client writes a doorbell byte only if it sees this flag */
        HWB_STORE_RLX(&h->server_sleeping, 1u);
        HWB_FENCE(); /* pairs with the client's fence between publishing req and reading this */
        int stop = 0;
        if (scan(L, idx, seqs) == 0) stop = housekeep(L, (int)max_sleep_ms);
        HWB_STORE_RLX(&h->server_sleeping, 0u);
        if (stop) return;
        now = hwb_now_ns();
        HWB_STORE_RLX(&h->heartbeat_ns, (uint64_t)now);
        next_house = now + house_ns;
        last_busy = now; /* spin again after a wake-up: requests come in bursts */
    }
}

/* serve()'s `sliding`: None (whole inputs), (window, streams, entry): an ABI 3 native entry's
 * window handles (windows_entry_of; its sizes are checked against the header in serve()), or
 * (window, streams, None, make_windows): the Python path (make_windows() -> a Windows of
 * `streams` windows, one per client). */
static int parse_sliding(PyObject *sliding, PyObject *gate, PyObject *batch, sliding_ops *o) {
    unsigned long w, n_streams;
    Py_ssize_t n;
    PyObject *entry;
    memset(o, 0, sizeof *o);
    if (sliding == Py_None) return 0;
    n = PyTuple_Check(sliding) ? PyTuple_GET_SIZE(sliding) : 0;
    if ((n != 3 && n != 4) || gate != Py_None || batch != Py_None) {
        PyErr_SetString(PyExc_TypeError, "serve(): sliding must be (window, streams, entry) or "
                        "(window, streams, None, make_windows), in direct mode without a gate");
        return -1;
    }
    w = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(sliding, 0));
    if (PyErr_Occurred()) return -1;
    n_streams = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(sliding, 1));
    if (PyErr_Occurred()) return -1;
    if (w == 0 || w > (1u << 24) || n_streams == 0 || n_streams > MAX_STREAMS) {
        PyErr_SetString(PyExc_ValueError, "serve(): the window must be 1..16M ticks and the "
                        "streams 1..65536 windows per client");
        return -1;
    }
    o->window = (uint32_t)w;
    o->streams = (uint32_t)n_streams;
    entry = PyTuple_GET_ITEM(sliding, 2);
    if (n == 4) {
        PyObject *make = PyTuple_GET_ITEM(sliding, 3);
        if (entry != Py_None || !PyCallable_Check(make)) {
            PyErr_SetString(PyExc_TypeError, "serve(): the Python path is (window, streams, "
                            "None, make_windows) with a callable");
            return -1;
        }
        o->make_windows = make;
        return 0;
    }
    const hwb_native_entry *e = windows_entry_of(entry);
    if (!e) return -1;
    if (e->window != o->window) {
        PyErr_Format(PyExc_ValueError, "serve(): the native entry's window is %u ticks, the "
                     "endpoint's %u", e->window, o->window);
        return -1;
    }
    o->e = e;
    return 0;
}

static PyObject *py_serve(PyObject *self, PyObject *args) {
    Py_buffer buf;
    int hdr_fd, listen_fd, stop_fd, pin;
    unsigned nslots;
    PyObject *run, *make_slot, *batch, *input_error, *gate = Py_None, *sliding = Py_None;
    long long spin_ns, reap_ns;
    loop_ctx L;
    sliding_ops ops;
    if (!PyArg_ParseTuple(args, "w*iiiIOOOOLLi|OO", &buf, &hdr_fd, &listen_fd, &stop_fd, &nslots,
                          &run, &make_slot, &batch, &input_error, &spin_ns, &reap_ns, &pin, &gate,
                          &sliding))
        return NULL;
    if (parse_sliding(sliding, gate, batch, &ops) != 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (gate != Py_None && (!PyObject_TypeCheck(gate, &GateType) || batch != Py_None)) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_TypeError, "serve(): gate must be a NativeGate (direct mode only) "
                        "or None");
        return NULL;
    }
    memset(&L, 0, sizeof L);
    L.h = (hwb_shm_header *)buf.buf;
    if ((size_t)buf.len < HWB_SHM_HEADER_BYTES || L.h->magic != HWB_SHM_MAGIC || nslots == 0 ||
        nslots > MAX_SLOTS || nslots != L.h->nslots ||
        (gate != Py_None && (((GateObject *)gate)->in_count != L.h->in_count ||
                             ((GateObject *)gate)->out_count != L.h->out_count))) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "serve(): not an initialised hwb header, or nslots "
                        "(or the gate's sizes) differ from the ones it was initialised with");
        return NULL;
    }
    /* the server's own copies, taken once from the header it initialised itself */
    L.hdr_fd = hdr_fd;
    L.listen_fd = listen_fd;
    L.stop_fd = stop_fd;
    L.nslots = nslots;
    L.in_count = L.h->in_count;
    L.out_count = L.h->out_count;
    L.slot_bytes = L.h->slot_bytes;
    L.generation = L.h->generation;
    L.run = run;
    L.make_slot = make_slot;
    L.batch = batch;
    L.input_error = input_error;
    L.gate = gate == Py_None ? NULL : (GateObject *)gate;
    L.sl = ops;
    L.in_shape0 = L.h->in_ndim ? L.h->in_shape[0] : 1;
    if (ops.window && (L.h->sliding != HWB_SHM_ONE_TICK || L.h->window != ops.window ||
                       L.h->streams != ops.streams)) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "serve(): a sliding loop needs a header initialised "
                        "with the same window and streams (init_header's window, streams)");
        return NULL;
    }
    if (ops.e && (ops.e->step_count != L.in_count || ops.e->out_count != L.out_count)) {
        PyBuffer_Release(&buf);
        PyErr_Format(PyExc_ValueError, "serve(): the native window takes %u -> %u floats per "
                     "tick; the endpoint %u -> %u", ops.e->step_count, ops.e->out_count,
                     L.in_count, L.out_count);
        return NULL;
    }
    L.slots = (slot_t *)PyMem_RawCalloc(nslots, sizeof(slot_t));
    L.pfd = (struct pollfd *)PyMem_RawCalloc(nslots + 2, sizeof(struct pollfd));
    if (!L.slots || !L.pfd) {
        PyMem_RawFree(L.slots);
        PyMem_RawFree(L.pfd);
        PyBuffer_Release(&buf);
        return PyErr_NoMemory();
    }
    for (uint32_t i = 0; i < nslots; i++) L.slots[i].conn = -1;
    if (pin >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(pin, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) { /* 0: this thread */
            PyMem_RawFree(L.slots);
            PyMem_RawFree(L.pfd);
            PyBuffer_Release(&buf);
            return PyErr_SetFromErrno(PyExc_OSError);
        }
    }
    Py_BEGIN_ALLOW_THREADS
    poll_loop(&L, (int64_t)spin_ns, (int64_t)reap_ns);
    HWB_STORE_REL(&L.h->state, HWB_SHM_STATE_CLOSING);
    for (uint32_t i = 0; i < nslots; i++) /* blocked clients wake and see server-gone */
        if (L.slots[i].conn >= 0) hwb_futex_wake(&L.slots[i].s->resp, INT_MAX);
    Py_END_ALLOW_THREADS
    for (uint32_t i = 0; i < nslots; i++) detach_client(&L, i);
    PyMem_RawFree(L.slots);
    PyMem_RawFree(L.pfd);
    PyBuffer_Release(&buf);
    Py_RETURN_NONE;
}

/* init_header(fd, nslots, in_shape, out_shape, uid, pid, generation[, window[, streams]]):
 * size, write and seal
 * the header memfd; returns its size. The server maps it writable before the seal; after it,
 * nobody can map it writable again (F_SEAL_FUTURE_WRITE) or resize it. */
static PyObject *py_init_header(PyObject *self, PyObject *args) {
    int fd, pid;
    unsigned nslots, uid;
    unsigned long long gen;
    unsigned window = 0, streams = 1;
    PyObject *ins, *outs;
    hwb_shm_header hd;
    if (!PyArg_ParseTuple(args, "iIOOIiK|II", &fd, &nslots, &ins, &outs, &uid, &pid, &gen, &window,
                          &streams))
        return NULL;
    if (window && (streams == 0 || streams > MAX_STREAMS)) {
        PyErr_SetString(PyExc_ValueError, "streams must be 1..65536 windows per client");
        return NULL;
    }
    Py_ssize_t ni = PyTuple_Size(ins), no = PyTuple_Size(outs);
    if (ni < 0 || no < 0 || ni > HWB_SHM_MAXDIM || no > HWB_SHM_MAXDIM || nslots == 0 ||
        nslots > MAX_SLOTS) {
        PyErr_SetString(PyExc_ValueError, "shapes must be tuples of at most 6 dimensions, "
                        "nslots 1..1024");
        return NULL;
    }
    memset(&hd, 0, sizeof hd);
    uint64_t ci = 1, co = 1;
    for (Py_ssize_t i = 0; i < ni; i++) ci *= (hd.in_shape[i] = (uint32_t)PyLong_AsUnsignedLong(PyTuple_GET_ITEM(ins, i)));
    for (Py_ssize_t i = 0; i < no; i++) co *= (hd.out_shape[i] = (uint32_t)PyLong_AsUnsignedLong(PyTuple_GET_ITEM(outs, i)));
    if (PyErr_Occurred()) return NULL;
    if (ci == 0 || co == 0 || ci > (1u << 24) || co > (1u << 24)) {
        PyErr_SetString(PyExc_ValueError, "tensor sizes must be 1..16M floats");
        return NULL;
    }
    hd.magic = HWB_SHM_MAGIC;
    hd.version = HWB_SHM_VERSION;
    hd.header_bytes = HWB_SHM_HEADER_BYTES;
    hd.nslots = nslots;
    hd.slot_bytes = (uint32_t)hwb_shm_slot_bytes((uint32_t)ci, (uint32_t)co);
    hd.dtype = HWB_SHM_DTYPE_F32;
    hd.in_count = (uint32_t)ci;
    hd.out_count = (uint32_t)co;
    hd.in_ndim = (uint32_t)ni;
    hd.out_ndim = (uint32_t)no;
    hd.owner_uid = uid;
    hd.server_pid = pid;
    hd.generation = gen;
    hd.sliding = window ? HWB_SHM_ONE_TICK : HWB_SHM_WHOLE_INPUT;
    hd.window = window;
    hd.streams = window ? streams : 0u;
    hd.state = HWB_SHM_STATE_RUNNING;
    if (ftruncate(fd, HWB_SHM_HEADER_BYTES) != 0 ||
        pwrite(fd, &hd, sizeof hd, 0) != (ssize_t)sizeof hd)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *py_seal_header(PyObject *self, PyObject *args) {
    int fd;
    if (!PyArg_ParseTuple(args, "i", &fd)) return NULL;
    if (fcntl(fd, F_ADD_SEALS, HWB_SHM_HEADER_SEALS) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    if (!HWB_SHM_SEALS_OK(fd, HWB_SHM_HEADER_SEALS)) {
        PyErr_SetString(PyExc_OSError, "the header memfd did not take its seals");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_counters(PyObject *self, PyObject *args) {
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*", &buf)) return NULL;
    hwb_shm_header *h = (hwb_shm_header *)buf.buf;
    PyObject *d = Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:I,s:I}", "served", (unsigned long long)HWB_LOAD_RLX(&h->served),
        "bad_payloads", (unsigned long long)HWB_LOAD_RLX(&h->bad_payloads), "deadline_missed",
        (unsigned long long)HWB_LOAD_RLX(&h->deadline_missed), "detached",
        (unsigned long long)HWB_LOAD_RLX(&h->detached), "errors",
        (unsigned long long)HWB_LOAD_RLX(&h->errors), "heartbeat_ns",
        (unsigned long long)HWB_LOAD_RLX(&h->heartbeat_ns), "generation_lo",
        (unsigned)(h->generation & 0xFFFFFFFFu), "windows", HWB_LOAD_RLX(&h->windows));
    PyBuffer_Release(&buf);
    return d;
}

/* ---- NativeGate ---------------------------------------------------------------------- */

static PyObject *Gate_new(PyTypeObject *t, PyObject *args, PyObject *kw) {
    unsigned ic, oc;
    GateObject *o;
    if (!PyArg_ParseTuple(args, "II", &ic, &oc)) return NULL;
    o = (GateObject *)t->tp_alloc(t, 0);
    if (!o) return NULL;
    o->in_count = ic;
    o->out_count = oc;
    o->keep = PyList_New(0);
    if (!o->keep) { Py_DECREF(o); return NULL; }
    return (PyObject *)o;
}

static void Gate_dealloc(GateObject *o) {
    Py_XDECREF(o->keep);
    Py_TYPE(o)->tp_free((PyObject *)o);
}

/* set(capsule | None): serve through this entry from the next request on (None: the Python
 * path). Refuses (ValueError, the gate unchanged) an entry entry_of refuses, or one of other
 * sizes than the endpoint's, or of a batch other than 1. Entries of every ABI are served
 * (the gate calls predict only). */
static PyObject *Gate_set(GateObject *o, PyObject *cap) {
    const hwb_native_entry *e;
    if (cap == Py_None) {
        __atomic_store_n(&o->entry, (const hwb_native_entry *)NULL, __ATOMIC_RELEASE);
        Py_RETURN_NONE;
    }
    e = entry_of(cap);
    if (!e) return NULL;
    if (e->in_count != o->in_count || e->out_count != o->out_count || e->batch != 1) {
        PyErr_Format(PyExc_ValueError, "native entry takes %u -> %u floats per sample at batch "
                     "%u; the endpoint needs %u -> %u at batch 1", e->in_count, e->out_count,
                     e->batch, o->in_count, o->out_count);
        return NULL;
    }
    if (PyList_Append(o->keep, cap) < 0) return NULL;
    __atomic_store_n(&o->entry, e, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

static PyObject *Gate_active(GateObject *o, PyObject *unused) {
    return PyBool_FromLong(__atomic_load_n(&o->entry, __ATOMIC_ACQUIRE) != NULL);
}

static PyObject *Gate_counters(GateObject *o, PyObject *unused) {
    return Py_BuildValue("{s:K,s:K}", "native_served",
                         (unsigned long long)__atomic_load_n(&o->served, __ATOMIC_RELAXED),
                         "native_failed",
                         (unsigned long long)__atomic_load_n(&o->failed, __ATOMIC_RELAXED));
}

static PyMethodDef Gate_methods[] = {
    {"set", (PyCFunction)Gate_set, METH_O, "set(capsule | None): the entry the loop calls"},
    {"active", (PyCFunction)Gate_active, METH_NOARGS, "whether an entry is set"},
    {"counters", (PyCFunction)Gate_counters, METH_NOARGS, "native_served, native_failed"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject GateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hwbackends.serve._shmloop.NativeGate",
    .tp_basicsize = sizeof(GateObject),
    .tp_dealloc = (destructor)Gate_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "NativeGate(in_count, out_count): the native entry the poll loop calls, if any",
    .tp_methods = Gate_methods,
    .tp_new = Gate_new,
};

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
        o->c.sock = -1; /* zeroed memory would name fd 0 */
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
    int rc;
    /* without the GIL: an in-process server needs it to set up our slot before its hello */
    Py_BEGIN_ALLOW_THREADS
    rc = hwb_shm_attach_as(&o->c, name, uid, ic, oc);
    Py_END_ALLOW_THREADS
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

/* call(x, out, deadline_ns[, flags[, stream]]) -> status (int). x, out: float32 C-contiguous
 * with the endpoint's element counts (else RC_BAD_BUFFER, nothing sent). flags: HWB_SHM_FLAG_*
 * (a sliding endpoint's reset before this tick); stream: which of this client's windows
 * (hwb_shm_call_stream; the server checks it). The GIL is released for the round trip. */
static PyObject *Client_call(ClientObject *o, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer bx, by;
    long long dl;
    unsigned long flags = 0, stream = 0;
    int rc;
    if (nargs < 3 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "call(x, out, deadline_ns[, flags[, stream]])");
        return NULL;
    }
    dl = PyLong_AsLongLong(args[2]);
    if (dl == -1 && PyErr_Occurred()) return NULL;
    if (nargs >= 4) {
        flags = PyLong_AsUnsignedLong(args[3]);
        if (PyErr_Occurred()) return NULL;
    }
    if (nargs == 5) {
        stream = PyLong_AsUnsignedLong(args[4]);
        if (PyErr_Occurred() || stream > UINT32_MAX) {
            PyErr_Clear();
            PyErr_SetString(PyExc_OverflowError, "stream must be 0 .. 2**32-1");
            return NULL;
        }
    }
    if (!o->c.slot) return PyLong_FromLong(HWB_SHM_E_CLOSED);
    if (o->busy) return PyLong_FromLong(RC_BUSY); /* one slot serves one thread at a time */
    if (float_buffer(args[0], &bx, 0, o->c.in_count)) return PyLong_FromLong(RC_BAD_BUFFER);
    if (float_buffer(args[1], &by, 1, o->c.out_count)) {
        PyBuffer_Release(&bx);
        return PyLong_FromLong(RC_BAD_BUFFER - 1);
    }
    o->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = hwb_shm_call_stream(&o->c, (uint32_t)stream, (const float *)bx.buf, o->c.in_count,
                             (float *)by.buf, o->c.out_count, (int64_t)dl, (uint32_t)flags);
    Py_END_ALLOW_THREADS
    o->busy = 0;
    PyBuffer_Release(&bx);
    PyBuffer_Release(&by);
    return PyLong_FromLong(rc);
}

/* reset(deadline_ns[, stream]) -> status: a sliding endpoint's reset alone of one of this
 * client's windows (hwb_shm_reset_stream). */
static PyObject *Client_reset(ClientObject *o, PyObject *args) {
    long long dl;
    unsigned long stream = 0;
    int rc;
    if (!PyArg_ParseTuple(args, "L|k", &dl, &stream)) return NULL;
    if (stream > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "stream must be 0 .. 2**32-1");
        return NULL;
    }
    if (!o->c.slot) return PyLong_FromLong(HWB_SHM_E_CLOSED);
    if (o->busy) return PyLong_FromLong(RC_BUSY);
    o->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = hwb_shm_reset_stream(&o->c, (uint32_t)stream, (int64_t)dl);
    Py_END_ALLOW_THREADS
    o->busy = 0;
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
    /* slot_addr: where this process maps its own slot (diagnostics and tests of stray writes) */
    return Py_BuildValue("{s:i,s:N,s:N,s:i,s:I,s:I,s:K,s:K,s:n,s:I,s:I,s:I}", "slot", c->slot_index, "in_shape",
                         shape_tuple(c->hdr->in_shape, c->hdr->in_ndim), "out_shape",
                         shape_tuple(c->hdr->out_shape, c->hdr->out_ndim), "server_pid",
                         c->server_pid, "nslots", c->hdr->nslots, "seq", c->seq, "generation",
                         (unsigned long long)c->hdr->generation, "slot_addr",
                         (unsigned long long)(uintptr_t)c->slot, "slot_bytes", (Py_ssize_t)c->slot_size,
                         "sliding", c->hdr->sliding, "window", c->hdr->window, "streams", c->streams);
}

static PyMethodDef Client_methods[] = {
    {"call", (PyCFunction)(void (*)(void))Client_call, METH_FASTCALL, "call(x, out, deadline_ns[, flags]) -> status"},
    {"reset", (PyCFunction)Client_reset, METH_VARARGS, "reset(deadline_ns[, stream]) -> status: empty one of a sliding endpoint's windows"},
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

/* native_windows(capsule) -> (window, step_count, out_count) of the entry's window handles,
 * or ValueError saying why this loop cannot serve them (what serve()'s (window, streams,
 * entry) checks). */
static PyObject *py_native_windows(PyObject *self, PyObject *cap) {
    const hwb_native_entry *e = windows_entry_of(cap);
    if (!e) return NULL;
    return Py_BuildValue("(III)", e->window, e->step_count, e->out_count);
}

static PyObject *py_strerror(PyObject *self, PyObject *args) {
    int rc;
    if (!PyArg_ParseTuple(args, "i", &rc)) return NULL;
    return PyUnicode_FromString(hwb_shm_strerror(rc));
}

/* Module constants from the header itself, so Python redefines none of them: STATUS (name →
 * code, from HWB_SHM_STATUSES) and the byte offsets of every field of the header, the slot
 * and the hello (offsetof), for hwbackends.serve.request.Status and for tests that play a
 * raw client. */
#define HWB_OFF(type, field) {#field, offsetof(type, field)}
typedef struct { const char *name; size_t off; } field_off;
static const field_off HEADER_FIELDS[] = {
    HWB_OFF(hwb_shm_header, magic), HWB_OFF(hwb_shm_header, version),
    HWB_OFF(hwb_shm_header, header_bytes), HWB_OFF(hwb_shm_header, nslots),
    HWB_OFF(hwb_shm_header, slot_bytes), HWB_OFF(hwb_shm_header, dtype),
    HWB_OFF(hwb_shm_header, in_count), HWB_OFF(hwb_shm_header, out_count),
    HWB_OFF(hwb_shm_header, in_ndim), HWB_OFF(hwb_shm_header, out_ndim),
    HWB_OFF(hwb_shm_header, in_shape), HWB_OFF(hwb_shm_header, out_shape),
    HWB_OFF(hwb_shm_header, owner_uid), HWB_OFF(hwb_shm_header, server_pid),
    HWB_OFF(hwb_shm_header, generation), HWB_OFF(hwb_shm_header, sliding),
    HWB_OFF(hwb_shm_header, window), HWB_OFF(hwb_shm_header, streams),
    HWB_OFF(hwb_shm_header, state), HWB_OFF(hwb_shm_header, windows),
    HWB_OFF(hwb_shm_header, server_sleeping), HWB_OFF(hwb_shm_header, heartbeat_ns),
    HWB_OFF(hwb_shm_header, served), HWB_OFF(hwb_shm_header, bad_payloads),
    HWB_OFF(hwb_shm_header, deadline_missed), HWB_OFF(hwb_shm_header, detached),
    HWB_OFF(hwb_shm_header, errors), {NULL, 0}};
static const field_off SLOT_FIELDS[] = {
    HWB_OFF(hwb_shm_slot, req), HWB_OFF(hwb_shm_slot, resp), HWB_OFF(hwb_shm_slot, status),
    HWB_OFF(hwb_shm_slot, client_waiting), HWB_OFF(hwb_shm_slot, flags),
    HWB_OFF(hwb_shm_slot, in_count),
    HWB_OFF(hwb_shm_slot, deadline_ns), HWB_OFF(hwb_shm_slot, msg_len),
    HWB_OFF(hwb_shm_slot, stream), HWB_OFF(hwb_shm_slot, msg), {"in", HWB_SHM_SLOT_CTL},
    {NULL, 0}};
static const field_off HELLO_FIELDS[] = {
    HWB_OFF(hwb_shm_hello, magic), HWB_OFF(hwb_shm_hello, version), HWB_OFF(hwb_shm_hello, status),
    HWB_OFF(hwb_shm_hello, slot_index), HWB_OFF(hwb_shm_hello, slot_bytes),
    HWB_OFF(hwb_shm_hello, generation), {NULL, 0}};

static int add_offsets(PyObject *m, const char *name, const field_off *f) {
    PyObject *d = PyDict_New();
    if (!d) return -1;
    for (; f->name; f++) {
        PyObject *v = PyLong_FromSize_t(f->off);
        if (!v || PyDict_SetItemString(d, f->name, v) < 0) { Py_XDECREF(v); Py_DECREF(d); return -1; }
        Py_DECREF(v);
    }
    return PyModule_AddObject(m, name, d) < 0 ? (Py_DECREF(d), -1) : 0;
}

static int add_statuses(PyObject *m) {
    PyObject *d = PyDict_New(), *v;
    if (!d) return -1;
#define HWB_SHM__ADD(name, value, text)                                                        \
    v = PyLong_FromLong(value);                                                                \
    if (!v || PyDict_SetItemString(d, #name, v) < 0) { Py_XDECREF(v); Py_DECREF(d); return -1; } \
    Py_DECREF(v);
    HWB_SHM_STATUSES(HWB_SHM__ADD)
#undef HWB_SHM__ADD
    return PyModule_AddObject(m, "STATUS", d) < 0 ? (Py_DECREF(d), -1) : 0;
}

static PyMethodDef methods[] = {
    {"serve", py_serve, METH_VARARGS, "serve(hdr_buf, hdr_fd, listen_fd, stop_fd, nslots, run, make_slot, batch, input_error, spin_ns, reap_ns, pin[, gate[, sliding]])"},
    {"init_header", py_init_header, METH_VARARGS, "init_header(fd, nslots, in_shape, out_shape, uid, pid, generation[, window[, streams]]): window > 0: a sliding endpoint (in_shape one tick's, streams windows per client)"},
    {"seal_header", py_seal_header, METH_VARARGS, "seal_header(fd): no resize, no new writable mapping"},
    {"counters", py_counters, METH_VARARGS, "counters(buf) -> dict"},
    {"slot_bytes", py_slot_bytes, METH_VARARGS, "slot_bytes(in_count, out_count)"},
    {"strerror", py_strerror, METH_VARARGS, "strerror(status) -> hwb_shm_strerror's text"},
    {"native_windows", py_native_windows, METH_O,
     "native_windows(entry) -> (window, step_count, out_count), or ValueError saying why not"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_shmloop", NULL, -1, methods};

PyMODINIT_FUNC PyInit__shmloop(void) {
    PyObject *m;
    if (PyType_Ready(&ClientType) < 0 || PyType_Ready(&GateType) < 0) return NULL;
    m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&ClientType);
    PyModule_AddObject(m, "Client", (PyObject *)&ClientType);
    Py_INCREF(&GateType);
    PyModule_AddObject(m, "NativeGate", (PyObject *)&GateType);
    PyModule_AddStringConstant(m, "NATIVE_ENTRY_NAME", HWB_NATIVE_ENTRY_NAME);
    PyModule_AddIntConstant(m, "NATIVE_ENTRY_ABI", HWB_NATIVE_ENTRY_ABI);
    PyModule_AddIntConstant(m, "NATIVE_ENTRY_V1_BYTES", HWB_NATIVE_ENTRY_V1_BYTES);
    PyModule_AddIntConstant(m, "NATIVE_ENTRY_BYTES", sizeof(hwb_native_entry));
    PyModule_AddIntConstant(m, "VERSION", HWB_SHM_VERSION);
    PyModule_AddIntConstant(m, "HEADER_BYTES", HWB_SHM_HEADER_BYTES);
    PyModule_AddIntConstant(m, "SLOT_CTL", HWB_SHM_SLOT_CTL);
    PyModule_AddIntConstant(m, "RC_BAD_BUFFER", RC_BAD_BUFFER);
    PyModule_AddIntConstant(m, "RC_BUSY", RC_BUSY);
    PyModule_AddIntConstant(m, "FLAG_RESET", HWB_SHM_FLAG_RESET);
    PyModule_AddIntConstant(m, "HELLO_BYTES", sizeof(hwb_shm_hello));
    if (PyModule_AddObject(m, "MAGIC", PyLong_FromUnsignedLongLong(HWB_SHM_MAGIC)) < 0 ||
        add_statuses(m) < 0 || add_offsets(m, "HEADER_OFFSETS", HEADER_FIELDS) < 0 ||
        add_offsets(m, "SLOT_OFFSETS", SLOT_FIELDS) < 0 || add_offsets(m, "HELLO_OFFSETS", HELLO_FIELDS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
