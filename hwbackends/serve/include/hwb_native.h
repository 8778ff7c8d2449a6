/* hwb_native.h — the native entry: a model's C functions as an executor hands them to a caller
 * that runs the model without Python (the shm server's poll loop, hwbackends/serve/_shmloop.c).
 *
 *   const hwb_native_entry *e = PyCapsule_GetPointer(cap, HWB_NATIVE_ENTRY_NAME);
 *   if (hwb_native_entry_readable(e) == 0) refuse(e->abi, e->struct_bytes);
 *   rc = e->predict(x, y);                     // whole inputs, e->batch samples
 *   if (hwb_native_entry_has_window(e)) {      // ABI 2 with a sliding window
 *       rc = e->push(x_t, y);                  // one tick in, the window's answer out
 *       e->prepare();                          // off the critical path, after the answer
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
 *   2  + the sliding window: push, prepare, reset, step_count, window; struct_bytes ≥ sizeof
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
 *     window. Their state lives in the model library: one caller at a time, not reentrant —
 *     the caller claims the window first (cm.sliding(), which also resets it) and then calls
 *     only from one thread. Each returns 0 on success; a nonzero push leaves no answer in y.
 *
 * LAYOUT (native byte order, same process only). Offsets in bytes on LP64 (x86-64, AArch64),
 * checked by the static asserts below:
 *     0 abi   4 struct_bytes   8 predict   16 in_count   20 out_count   24 batch   28 reserved
 *    32 push   40 prepare   48 reset   56 step_count   60 window        (64 bytes in all)
 */
#ifndef HWB_NATIVE_H
#define HWB_NATIVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HWB_NATIVE_ENTRY_NAME "hwbackends.native_entry" /* the PyCapsule's name */
#define HWB_NATIVE_ENTRY_ABI 2u /* 2: the sliding window's push/prepare/reset */

typedef int (*hwb_native_predict_fn)(const float *x, float *y);
typedef int (*hwb_native_void_fn)(void);

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
} hwb_native_entry;

/* The size of an ABI 1 entry: its fields end where ABI 2's begin. */
#define HWB_NATIVE_ENTRY_V1_BYTES ((uint32_t)offsetof(hwb_native_entry, push))

#if defined(__cplusplus)
#define HWB_NATIVE__ASSERT(c, m) static_assert(c, m)
#else
#define HWB_NATIVE__ASSERT(c, m) _Static_assert(c, m)
#endif
HWB_NATIVE__ASSERT(offsetof(hwb_native_entry, predict) == 8, "ABI 1 layout: predict");
HWB_NATIVE__ASSERT(offsetof(hwb_native_entry, in_count) == 8 + sizeof(void *), "ABI 1 layout: counts");
HWB_NATIVE__ASSERT(offsetof(hwb_native_entry, push) == 24 + sizeof(void *), "ABI 2 begins after ABI 1");
HWB_NATIVE__ASSERT(offsetof(hwb_native_entry, step_count) == 24 + 4 * sizeof(void *), "ABI 2 layout");
HWB_NATIVE__ASSERT(sizeof(void *) != 8 || sizeof(hwb_native_entry) == 64, "LP64 layout: 64 bytes");
#undef HWB_NATIVE__ASSERT

/* What a consumer built against this header may read of `e`: 2 (every field), 1 (ABI 1's
 * fields only: no sliding window), or 0 (nothing: NULL, an ABI newer than this header's, a
 * struct shorter than its ABI needs, or no predict). */
static inline uint32_t hwb_native_entry_readable(const hwb_native_entry *e) {
    if (e == NULL) return 0;
    if (e->abi == 1u && e->struct_bytes >= HWB_NATIVE_ENTRY_V1_BYTES) return e->predict ? 1u : 0u;
    if (e->abi == 2u && e->struct_bytes >= (uint32_t)sizeof(hwb_native_entry)) return e->predict ? 2u : 0u;
    return 0;
}

/* Whether `e` offers a sliding window a consumer can call (ABI 2, all three functions, a
 * window of at least one tick). */
static inline int hwb_native_entry_has_window(const hwb_native_entry *e) {
    return hwb_native_entry_readable(e) >= 2u && e->push && e->prepare && e->reset &&
           e->window > 0 && e->step_count > 0;
}

#ifdef __cplusplus
}
#endif
#endif /* HWB_NATIVE_H */
