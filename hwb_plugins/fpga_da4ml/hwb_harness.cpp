// hwb_harness.cpp — hwbackends' testbench for a da4ml pipeline, the same for every design: one
// input vector per clock, the output sampled after every rising edge, so one entry serves the
// predictions (outputs `latency` clocks after their inputs) and the latency / initiation-
// interval measurement (measure.py), which does not take da4ml's latency figure on trust.
//
// rtl.py copies it beside the Verilated model (sim/) and compiles it into sim/libhwb_rtl.so
// with the design's sizes and model class as -D flags:
//
//   HWB_N_IN, HWB_N_OUT     the vector sizes (values per input / output vector)
//   HWB_BW_IN, HWB_BW_OUT   the bits of one input / output value
//   HWB_DUT                 the Verilated model's class (Vhwb_wrapper)
//   HWB_DUT_H               its header, as a string ("Vhwb_wrapper.h")
//
// It needs da4ml's ioutil.hh (write_input / read_output) and Verilator's headers on the
// include path.
#if !defined(HWB_N_IN) || !defined(HWB_N_OUT) || !defined(HWB_BW_IN) || !defined(HWB_BW_OUT) || \
    !defined(HWB_DUT) || !defined(HWB_DUT_H)
#error "define HWB_N_IN, HWB_N_OUT, HWB_BW_IN, HWB_BW_OUT, HWB_DUT and HWB_DUT_H (rtl.py passes them)"
#endif

#include <cstdint>
#include <memory>
#include <mutex>
#include <unistd.h>
#include "ioutil.hh"
#include HWB_DUT_H

static const size_t N_IN = HWB_N_IN, N_OUT = HWB_N_OUT, BW_IN = HWB_BW_IN, BW_OUT = HWB_BW_OUT;

struct Hwb {
    std::unique_ptr<VerilatedContext> ctx;
    std::unique_ptr<HWB_DUT> dut;
    std::mutex lock;  // one stream at a time per model instance
};

extern "C" {
long hwb_n_in() { return N_IN; }
long hwb_n_out() { return N_OUT; }

// The lookup tables are $readmemh'd (relative paths) during the first eval: construct and
// evaluate once inside memdir.
void *hwb_open(const char *memdir) {
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd)) return nullptr;
    if (chdir(memdir) != 0) return nullptr;
    auto *h = new Hwb();
    h->ctx = std::make_unique<VerilatedContext>();
    h->dut = std::make_unique<HWB_DUT>(h->ctx.get());
    h->dut->clk = 0;
    h->dut->eval();
    int rc = chdir(cwd);
    (void)rc;
    return h;
}

void hwb_close(void *p) { delete static_cast<Hwb *>(p); }

// Clock t (0 <= t < clocks): present vector min(t, n-1), rising edge, sample the output into
// trace[t]. Vector i appears in trace[i + latency].
void hwb_stream(void *p, const int32_t *in, int32_t *trace, long n, long clocks) {
    auto *h = static_cast<Hwb *>(p);
    std::lock_guard<std::mutex> g(h->lock);
    auto *dut = h->dut.get();
    for (long t = 0; t < clocks; ++t) {
        long src = t < n ? t : n - 1;
        write_input<N_IN, BW_IN>(dut->model_inp, &in[src * N_IN]);
        dut->clk = 0;
        dut->eval();
        dut->clk = 1;
        dut->eval();
        read_output<N_OUT, BW_OUT>(dut->model_out, &trace[t * N_OUT]);
    }
}
}
