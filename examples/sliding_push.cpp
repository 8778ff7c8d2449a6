// A C++ strategy on a sliding window: one tick's features in, the window's answer out, through a
// cpu.native library's exported C ABI (hwb_model_push / hwb_model_prepare / hwb_model_reset).
//
//   hwb export zoo:lstm --target cpu.native --format c -o native/
//   g++ -O2 -std=c++17 -Inative examples/sliding_push.cpp native/libhwb_model.so -Wl,-rpath,native -o sliding_push
//   ./sliding_push ticks.f32 answers.f32   # rows of HWB_MODEL_STEP_SIZE floats in, one answer per tick out
//   ./sliding_push --bench 20000           # ns per hwb_model_push (the tick) and per prepare, apart
//
// The answer for each tick is hwb_model_predict on the window of the last HWB_MODEL_WINDOW ticks
// (zero-filled before it is full). The push does only the work that needs the tick; the prepare,
// called after the answer is used (while the strategy waits for the next tick), does the rest.
// Run it on a CPU with every feature in HWB_MODEL_REQUIRES (examples/native_strategy.cpp checks).
#include "hwb_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

std::vector<float> read_floats(const char *path) {
    std::ifstream f(path, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<float> v(bytes.size() / sizeof(float));
    std::copy(bytes.begin(), bytes.begin() + v.size() * sizeof(float), reinterpret_cast<char *>(v.data()));
    return v;
}

double pct(std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

}  // namespace

int main(int argc, char **argv) {
    constexpr long step_n = HWB_MODEL_STEP_SIZE, out_n = HWB_MODEL_OUTPUT_SIZE;
    if (argc == 3 && std::string(argv[1]) == "--bench") {
        const long ticks = std::max(100L, std::atol(argv[2]));
        std::vector<float> x(step_n), y(out_n);
        std::vector<double> push_ns, prep_ns;
        hwb_model_reset();
        for (long t = 0; t < ticks; t++) {
            for (long i = 0; i < step_n; i++) x[i] = static_cast<float>((t * 7 + i) % 13) * 0.1f - 0.6f;
            auto t0 = std::chrono::steady_clock::now();
            hwb_model_push(x.data(), y.data());
            asm volatile("" : : "r"(y.data()) : "memory");
            auto t1 = std::chrono::steady_clock::now();
            hwb_model_prepare();
            auto t2 = std::chrono::steady_clock::now();
            if (t >= HWB_MODEL_WINDOW) {  // the window is full: steady state
                push_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
                prep_ns.push_back(std::chrono::duration<double, std::nano>(t2 - t1).count());
            }
        }
        std::printf("%s (%s, window %d): hwb_model_push p50 %.0f ns, p99 %.0f ns; prepare p50 %.0f ns, "
                    "p99 %.0f ns (%zu ticks)\n", HWB_MODEL_NAME, HWB_MODEL_SLIDING, HWB_MODEL_WINDOW,
                    pct(push_ns, 0.5), pct(push_ns, 0.99), pct(prep_ns, 0.5), pct(prep_ns, 0.99), push_ns.size());
        return 0;
    }
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s TICKS.f32 ANSWERS.f32 | --bench TICKS\n", argv[0]);
        return 2;
    }
    const std::vector<float> x = read_floats(argv[1]);
    if (x.empty() || x.size() % step_n) {
        std::fprintf(stderr, "%s holds %zu floats; expected rows of %ld\n", argv[1], x.size(), step_n);
        return 2;
    }
    const long ticks = static_cast<long>(x.size()) / step_n;
    std::vector<float> y(ticks * out_n);
    hwb_model_reset();
    for (long t = 0; t < ticks; t++) {
        if (hwb_model_push(x.data() + t * step_n, y.data() + t * out_n) != 0) return 1;
        hwb_model_prepare();
    }
    std::ofstream(argv[2], std::ios::binary).write(reinterpret_cast<const char *>(y.data()),
                                                  static_cast<std::streamsize>(y.size() * sizeof(float)));
    std::printf("%ld ticks through %s (%s window of %d)\n", ticks, HWB_MODEL_NAME, HWB_MODEL_SLIDING,
                HWB_MODEL_WINDOW);
    return 0;
}
