/* hwb_window.h — the fixed part of every cpu.native sliding window: windows as handles.
 *
 * Included at the end of the generated window code of model.c (hwb_plugins/cpu_native/
 * sliding.py, sliding_conv.py), after the form has defined:
 *
 *   struct hwb_window { int stream; ... };   every piece of one window's (or stream's) state;
 *                                            `stream` first: 1 for a stream (stream_new)
 *   HWB_WINDOW_STREAM                        1 when the form has a stream, else 0
 *   static void hwb_w_fill(hwb_window *w)    w's state as a fresh window and stream have it
 *                                            (zero-filled window, zero stream state)
 *   static int hwb_w_push(hwb_window *w, const float *x, float *y)      the window's tick
 *   static int hwb_w_prepare(hwb_window *w)                             its prepare
 *   static int hwb_s_push(...), hwb_s_prepare(...)    the stream's (only with a stream)
 *   HWB_WINDOW_PUSH_MANY (optional)          defined when the form has its own
 *                                            static int hwb_w_push_many(ws, k, xs, ys)
 *
 * and gives the library's C ABI (hwb_model.h, hwbackends/serve/include/hwb_native.h ABI 3):
 * hwb_model_window_new/_push/_push_many/_prepare/_reset/_free and hwb_model_stream_new over
 * handles the caller owns, and the single-window calls (hwb_model_push, …, hwb_model_stream_*)
 * as a thin form over two handles the library makes when it loads. No other state is global:
 * the one static struct is the template a new or reset window is copied from, filled once
 * when the library loads and only read after, so calls on different handles may run on
 * different threads.
 */
#ifndef HWB_WINDOW_H
#define HWB_WINDOW_H

#include <stdlib.h>
#include <string.h>

/* A fresh window's state, filled when the library loads (hwb_w_fill: for the recurrent
 * form one run over zero steps, copied into the windows in flight by their ages). */
static hwb_window hwb_template;
/* The handles behind the single-window calls. */
static hwb_window *hwb_default, *hwb_default_stream;

static hwb_window *hwb_alloc(int stream) {
    /* sizeof is a multiple of the struct's 64-byte alignment, as aligned_alloc needs */
    hwb_window *w = (hwb_window *)aligned_alloc(64, sizeof(hwb_window));
    if (w != NULL) {
        memcpy(w, &hwb_template, sizeof *w);
        w->stream = stream;
    }
    return w;
}

hwb_window *hwb_model_window_new(void) { return hwb_alloc(0); }

hwb_window *hwb_model_stream_new(void) { return HWB_WINDOW_STREAM ? hwb_alloc(1) : NULL; }

void hwb_model_window_free(hwb_window *w) { free(w); }

int hwb_model_window_reset(hwb_window *w) {
    const int stream = w->stream;
    memcpy(w, &hwb_template, sizeof *w);
    w->stream = stream;
    return 0;
}

int hwb_model_window_push(hwb_window *w, const float *x, float *y) {
#if HWB_WINDOW_STREAM
    if (w->stream) return hwb_s_push(w, x, y);
#endif
    return hwb_w_push(w, x, y);
}

int hwb_model_window_prepare(hwb_window *w) {
#if HWB_WINDOW_STREAM
    if (w->stream) return hwb_s_prepare(w);
#endif
    return hwb_w_prepare(w);
}

int hwb_model_window_push_many(hwb_window *const *ws, uint32_t k, const float *xs, float *ys) {
#ifdef HWB_WINDOW_PUSH_MANY
    return hwb_w_push_many(ws, k, xs, ys);
#else
    for (uint32_t i = 0; i < k; i++) {
        const int rc = hwb_model_window_push(ws[i], xs + (size_t)i * HWB_MODEL_STEP_SIZE,
                                             ys + (size_t)i * HWB_MODEL_OUTPUT_SIZE);
        if (rc != 0) return rc;
    }
    return 0;
#endif
}

/* ---- the single-window calls: a thin form over the library's two handles ---- */
/* (-1: the library could not allocate them when it loaded) */
int hwb_model_push(const float *x, float *y) { return hwb_default ? hwb_w_push(hwb_default, x, y) : -1; }
int hwb_model_prepare(void) { return hwb_default ? hwb_w_prepare(hwb_default) : -1; }
int hwb_model_reset(void) { return hwb_default ? hwb_model_window_reset(hwb_default) : -1; }
#if HWB_WINDOW_STREAM
int hwb_model_stream_push(const float *x, float *y) {
    return hwb_default_stream ? hwb_s_push(hwb_default_stream, x, y) : -1;
}
int hwb_model_stream_prepare(void) { return hwb_default_stream ? hwb_s_prepare(hwb_default_stream) : -1; }
int hwb_model_stream_reset(void) {
    return hwb_default_stream ? hwb_model_window_reset(hwb_default_stream) : -1;
}
#else
int hwb_model_stream_push(const float *x, float *y) { (void)x; (void)y; return -1; }
int hwb_model_stream_prepare(void) { return -1; }
int hwb_model_stream_reset(void) { return -1; }
#endif

__attribute__((constructor)) static void hwb_window_init(void) {
    hwb_w_fill(&hwb_template);
    hwb_default = hwb_alloc(0);
    hwb_default_stream = HWB_WINDOW_STREAM ? hwb_alloc(1) : NULL;
}

#endif /* HWB_WINDOW_H */
