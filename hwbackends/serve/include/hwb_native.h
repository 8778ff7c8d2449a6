/* hwb_native.h — the native entry: a model's C functions as an executor hands them to a caller
 * that runs the model without Python (the shm server's poll loop, hwbackends/serve/_shmloop.c).
 *
 *   const hwb_native_entry *e = PyCapsule_GetPointer(cap, HWB_NATIVE_ENTRY_NAME);
 *   if (hwb_native_entry_readable(e) == 0) refuse(e->abi, e->struct_bytes);
 *   rc = e->predict(x, y);                     // whole inputs, e->batch samples
 *   if (hwb_native_entry_has_windows(e)) {     // ABI 3: windows as handles
 *       hwb_window *w = e->window_new();       // one symbol's window over the model's weights
 *       rc = e->window_push(w, x_t, y);        // one tick in, that window's answer out
 *       e->window_prepare(w);                  // off the critical path, after the answer
 *       e->window_free(w);
 *   }
 *
 * `hwb serve --print-include` prints the directory holding this file (add it with -I). The
 * producers and consumers in this project all include this one file: cpu.native's generated
 * extension (hwb_plugins/cpu_native/hwb_ext.h), the shm server's loop and the tests' own entries.
 *
 * WHERE IT COMES FROM. Executor.native_entry() (hwbackends/target.py) returns a PyCapsule
 * named HWB_NATIVE_ENTRY_NAME whose pointer is a hwb_native_entry, static in the executor's
 * own shared object: CPython never unloads an extension, so the struct and the code it points
 * to stay valid for the life of the process. A consumer keeps a reference to the capsule while
 * it may call through it.
 *
 * VERSIONS. `abi` says which fields exist; `struct_bytes` is sizeof the producer's struct. A
 * later ABI only appends fields, so ABI 2 begins with ABI 1's fields at the same offsets.
 *   1  predict only (whole inputs);                         struct_bytes ≥ HWB_NATIVE_ENTRY_V1_BYTES
 *   2  + the sliding window: push, prepare, reset, step_count, window;
 *                                                          struct_bytes ≥ HWB_NATIVE_ENTRY_V2_BYTES
 *   3  + windows as handles: window_new, window_push, window_push_many, window_prepare,
 *        window_reset, window_free, stream;                struct_bytes ≥ sizeof
 * A consumer reads an entry through hwb_native_entry_readable(), which refuses (0) an ABI newer
 * than this header's and a struct shorter than its ABI needs: such an entry is not called.
 *
 * RULES (the producer's promise):
 *   - predict computes exactly what Executor.predict_into computes for the same buffers (the
 *     same bits); it is reentrant and thread-safe (it may run beside predict_into), takes
 *     C-contiguous float32 x and y that do not overlap, touches no Python object, never
 *     allocates, and returns nonzero on failure (the caller then uses no output);
 *   - push/prepare/reset (ABI 2, all three or none) are the executor's sliding window
 *     (CompiledModel.sliding(), hwbackends/sliding.py): push(x_t, y) takes one tick of
 *     step_count floats and writes out_count floats, the model on the window of the last
 *     `window` ticks (zero state at its start, zero-filled before it is full); prepare()
 *     readies the next tick (push runs it first when the caller did not); reset() empties the
 *     window. They are a thin form over one window the library keeps for them: one caller
 *     at a time, not reentrant — the caller claims it first (cm.sliding(), which also resets
 *     it) and then calls only from one thread. Each returns 0 on success; a nonzero push
 *     leaves no answer in y.
 *   - window_* (ABI 3, all six or none) are the same window as a handle the caller owns: any
 *     number of windows over one set of weights (one per symbol), no state in the library.
 *     window_new() returns a window that is empty (as after reset) or NULL (out of memory);
 *     window_push/prepare/reset on one handle are push/prepare/reset above; calls on
 *     different handles may run on different threads at once; calls on one handle are one
 *     caller's at a time. window_push_many(ws, k, xs, ys) pushes xs[i*step_count ..] into
 *     ws[i] and writes its answer at ys[i*out_count ..] for i < k (the k handles distinct):
 *     the same answers as k window_push calls, computed together (the input products as one
 *     matrix product over the k ticks). window_free(NULL) does nothing. `stream` (1 or 0):
 *     whether window_new's windows may be streams — a handle made by stream_new() (when
 *     stream is 1) keeps a stateful model's state, never reset between pushes (VOLLO's
 *     semantics, CompiledModel.streaming()), and takes the same window_* calls.
 *
 * LAYOUT (native byte order, same process only). Offsets in bytes on LP64 (x86-64, AArch64),
 * checked by the static asserts below:
 *     0 abi   4 struct_bytes   8 predict   16 in_count   20 out_count   24 batch   28 reserved
 *    32 push   40 prepare   48 reset   56 step_count   60 window
 *    64 window_new   72 window_push   80 window_push_many   88 window_prepare   96 window_reset
 *   104 window_free   112 stream_new   120 stream   124 reserved3              (128 bytes in all)
 */
#ifndef HWB_NATIVE_H
#define HWB_NATIVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HWB_NATIVE_ENTRY_NAME "hwbackends.native_entry" /* the PyCapsule's name */
#define HWB_NATIVE_ENTRY_ABI 3u /* 2: the sliding window's push/prepare/reset; 3: its handles */

typedef int (*hwb_native_predict_fn)(const float *x, float *y);
typedef int (*hwb_native_void_fn)(void);
/* One window (or stream) of one model: opaque, made and freed by the model's library. */
typedef struct hwb_window hwb_window;
typedef hwb_window *(*hwb_native_window_new_fn)(void);
typedef int (*hwb_native_window_push_fn)(hwb_window *w, const float *x, float *y);
typedef int (*hwb_native_window_push_many_fn)(hwb_window *const *ws, uint32_t k, const float *xs,
                                              float *ys);
typedef int (*hwb_native_window_fn)(hwb_window *w);
typedef void (*hwb_native_window_free_fn)(hwb_window *w);

typedef struct hwb_native_entry {
    /* ---- ABI 1 ---- */
    uint32_t abi;                  /* the producer's ABI: 1 or 2 (HWB_NATIVE_ENTRY_ABI) */
    uint32_t struct_bytes;         /* sizeof the producer's struct (≥ what its ABI needs) */
    hwb_native_predict_fn predict; /* batch samples x → y; 0 = ok. Never NULL */
    uint32_t in_count, out_count;  /* float32 elements per sample (whole input / output) */
    uint32_t batch;                /* samples per predict call */
    uint32_t reserved;             /* 0 */
    /* ---- ABI 2: the sliding window; all NULL and 0 when the model has none ---- */
    hwb_native_predict_fn push;    /* one tick (step_count floats) → the window's answer */
    hwb_native_void_fn prepare;    /* ready the next tick (after the answer is out) */
    hwb_native_void_fn reset;      /* empty the window */
    uint32_t step_count;           /* float32 elements per tick (in_count / window) */
    uint32_t window;               /* ticks in the window */
    /* ---- ABI 3: windows as handles; all NULL and 0 when the model has none ---- */
    hwb_native_window_new_fn window_new;        /* an empty window; NULL: out of memory */
    hwb_native_window_push_fn window_push;      /* one tick into w → w's answer */
    hwb_native_window_push_many_fn window_push_many; /* k ticks into k distinct windows */
    hwb_native_window_fn window_prepare;        /* ready w's next tick */
    hwb_native_window_fn window_reset;          /* empty w */
    hwb_native_window_free_fn window_free;      /* free w (NULL: nothing) */
    hwb_native_window_new_fn stream_new;        /* an empty stream (NULL unless stream is 1) */
    uint32_t stream;                            /* 1: stream_new makes streams */
    uint32_t reserved3;                         /* 0 */
} hwb_native_entry;

/* The size of an ABI 1 entry: its fields end where ABI 2's begin; the same for ABI 2. */
#define HWB_NATIVE_ENTRY_V1_BYTES ((uint32_t)offsetof(hwb_native_entry, push))
#define HWB_NATIVE_ENTRY_V2_BYTES ((uint32_t)offsetof(hwb_native_entry, window_new))

#if defined(__cplusplus)
#define HWB_NATIVE__ASSERT(c, m) static_assert(c, m)
#else
#define HWB_NATIVE__ASSERT(c, m) _Static_assert(c, m)
#endif
HWB_NATIVE__ASSERT(offsetof(hwb_native_entry, predict) == 8, "ABI 1 layout: predict");
HWB_NATIVE__ASSERT(offsetof(hwb_native_entry, in_count) == 8 + sizeof(void *), "ABI 1 layout: counts");
HWB_NATIVE__ASSERT(offsetof(hwb_native_entry, push) == 24 + sizeof(void *), "ABI 2 begins after ABI 1");
HWB_NATIVE__ASSERT(offsetof(hwb_native_entry, step_count) == 24 + 4 * sizeof(void *), "ABI 2 layout");
HWB_NATIVE__ASSERT(offsetof(hwb_native_entry, window_new) == 32 + 4 * sizeof(void *), "ABI 3 begins after ABI 2");
HWB_NATIVE__ASSERT(sizeof(void *) != 8 || sizeof(hwb_native_entry) == 128, "LP64 layout: 128 bytes");
#undef HWB_NATIVE__ASSERT

/* What a consumer built against this header may read of `e`: 3 (every field), 2 (ABI 2's
 * fields: one window, no handles), 1 (ABI 1's fields only: no sliding window), or 0 (nothing:
 * NULL, an ABI newer than this header's, a struct shorter than its ABI needs, or no predict). */
static inline uint32_t hwb_native_entry_readable(const hwb_native_entry *e) {
    if (e == NULL || !e->predict) return 0;
    if (e->abi == 1u && e->struct_bytes >= HWB_NATIVE_ENTRY_V1_BYTES) return 1u;
    if (e->abi == 2u && e->struct_bytes >= HWB_NATIVE_ENTRY_V2_BYTES) return 2u;
    if (e->abi == 3u && e->struct_bytes >= (uint32_t)sizeof(hwb_native_entry)) return 3u;
    return 0;
}

/* Whether `e` offers a sliding window a consumer can call (ABI 2, all three functions, a
 * window of at least one tick). */
static inline int hwb_native_entry_has_window(const hwb_native_entry *e) {
    return hwb_native_entry_readable(e) >= 2u && e->push && e->prepare && e->reset &&
           e->window > 0 && e->step_count > 0;
}

/* Whether `e` offers windows as handles (ABI 3, all six window_* functions; implies
 * hwb_native_entry_has_window). */
static inline int hwb_native_entry_has_windows(const hwb_native_entry *e) {
    return hwb_native_entry_readable(e) >= 3u && hwb_native_entry_has_window(e) && e->window_new &&
           e->window_push && e->window_push_many && e->window_prepare && e->window_reset &&
           e->window_free;
}

#ifdef __cplusplus
}
#endif
#endif /* HWB_NATIVE_H */
