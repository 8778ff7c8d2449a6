/* hwb_model_window.h — the sliding window's calls in a cpu.native artifact's hwb_model.h.
   hwbackends copies this file verbatim into every generated hwb_model.h, after the window's
   sizes and form (HWB_MODEL_WINDOW, HWB_MODEL_STEP_SIZE, HWB_MODEL_SLIDING, HWB_MODEL_STREAM,
   HWB_MODEL_PUSH_WEIGHTS, HWB_MODEL_PUSH_GATES), so the exported header stays one file.

   The sliding window (hwbackends/sliding.py): hwb_model_push(x_t, y) takes one step's
   HWB_MODEL_STEP_SIZE floats and writes into y (HWB_MODEL_OUTPUT_SIZE floats) what
   hwb_model_predict gives on the window of the last HWB_MODEL_WINDOW steps, zero state at its
   start, zero-filled before it is full; then call hwb_model_prepare() off the critical path
   (push runs it first when it was not). hwb_model_reset() empties the window. The stream
   (HWB_MODEL_STREAM 1 only, else they return -1): state never reset between pushes, zeroed by
   hwb_model_stream_reset(). Those two are one window and one stream this library keeps (made
   when it loads): one caller at a time, not reentrant. Return 0.
   Windows as handles, one per symbol, any number over this one library's weights:
   hwb_model_window_new() (NULL: out of memory) / hwb_model_stream_new() (NULL without a
   stream), then hwb_model_window_push(w, x_t, y), _prepare(w), _reset(w) as above on that
   handle alone, and hwb_model_window_free(w). hwb_model_window_push_many(ws, k, xs, ys):
   xs[i * HWB_MODEL_STEP_SIZE ..] into the distinct handles ws[i], answers at
   ys[i * HWB_MODEL_OUTPUT_SIZE ..], the same as k pushes (their input products computed
   together where the form can). Calls on different handles may run on different threads at
   once; one handle is one caller's at a time.
   HWB_MODEL_PUSH_WEIGHTS other than "fp32" (the push_weights option): the push multiplies
   the newest step's inputs by bf16 or int8 copies of the input weights, so its answers are
   within that precision's fidelity tolerance of hwb_model_predict's, not equal to them bit
   for bit; HWB_MODEL_PUSH_GATES "fast": its LSTM gates are approximations (within 1e-5 of the
   answers' scale in fp32). The prepare and the stream stay exact fp32. */
#ifndef HWB_MODEL_WINDOW_H
#define HWB_MODEL_WINDOW_H
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
int hwb_model_push(const float *x_t, float *y);
int hwb_model_prepare(void);
int hwb_model_reset(void);
int hwb_model_stream_push(const float *x_t, float *y);
int hwb_model_stream_prepare(void);
int hwb_model_stream_reset(void);
typedef struct hwb_window hwb_window;
hwb_window *hwb_model_window_new(void);
hwb_window *hwb_model_stream_new(void);
int hwb_model_window_push(hwb_window *w, const float *x_t, float *y);
int hwb_model_window_push_many(hwb_window *const *ws, uint32_t k, const float *xs, float *ys);
int hwb_model_window_prepare(hwb_window *w);
int hwb_model_window_reset(hwb_window *w);
void hwb_model_window_free(hwb_window *w);
#ifdef __cplusplus
}
#endif
#endif
