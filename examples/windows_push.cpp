// A C++ strategy over many symbols: one window per symbol, all over one cpu.native library's
// weights, through its exported C ABI's window handles (hwb_model_window_new / _push /
// _push_many / _prepare / _free; no state in the library, so handles on different threads run
// at once).
//
//   hwb export zoo:lstm --target cpu.native --format c -o native/
//   g++ -O2 -std=c++17 -Inative examples/windows_push.cpp native/libhwb_model.so -Wl,-rpath,native -o windows_push
//   ./windows_push N ticks.f32 answers.f32   # rounds of N ticks (one per window) in, N answers per round out:
//                                            # even rounds window by window, odd rounds with push_many
//   ./windows_push --bench N TICKS           # ns per push (round-robin over N windows), per prepare,
//                                            # and per push_many of all N (and per tick in it)
//
// Each window's answer for a tick is hwb_model_predict on the last HWB_MODEL_WINDOW ticks of
// that window alone (zero-filled before it is full). The push does only the work that needs
// the tick; the prepare, called after the answer is used, does the rest.
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

struct Windows {  // N handles, freed with the object
    std::vector<hwb_window *> w;
    explicit Windows(int n) {
        for (int i = 0; i < n; i++) {
            hwb_window *h = hwb_model_window_new();
            if (h == nullptr) {
                std::fprintf(stderr, "hwb_model_window_new: out of memory\n");
                std::exit(1);
            }
            w.push_back(h);
        }
    }
    ~Windows() {
        for (hwb_window *h : w) hwb_model_window_free(h);
    }
};

int run(int n, const char *in, const char *out) {
    const std::vector<float> x = read_floats(in);
    const size_t per_round = static_cast<size_t>(n) * HWB_MODEL_STEP_SIZE;
    if (x.empty() || x.size() % per_round) {
        std::fprintf(stderr, "%s: expected rounds of %d x %d floats\n", in, n, HWB_MODEL_STEP_SIZE);
        return 1;
    }
    const size_t rounds = x.size() / per_round;
    Windows ws(n);
    std::vector<float> y(rounds * n * HWB_MODEL_OUTPUT_SIZE);
    for (size_t r = 0; r < rounds; r++) {
        const float *xr = x.data() + r * per_round;
        float *yr = y.data() + r * n * HWB_MODEL_OUTPUT_SIZE;
        if (r % 2) {
            if (hwb_model_window_push_many(ws.w.data(), static_cast<uint32_t>(n), xr, yr) != 0) return 1;
        } else {
            for (int i = 0; i < n; i++)
                if (hwb_model_window_push(ws.w[i], xr + i * HWB_MODEL_STEP_SIZE, yr + i * HWB_MODEL_OUTPUT_SIZE)) return 1;
        }
        for (int i = 0; i < n; i++) hwb_model_window_prepare(ws.w[i]);  // after the answers are out
    }
    std::ofstream(out, std::ios::binary).write(reinterpret_cast<const char *>(y.data()),
                                               static_cast<std::streamsize>(y.size() * sizeof(float)));
    return 0;
}

int bench(int n, int ticks) {
    using clock = std::chrono::steady_clock;
    Windows ws(n);
    std::vector<float> x(static_cast<size_t>(n) * HWB_MODEL_STEP_SIZE), y(static_cast<size_t>(n) * HWB_MODEL_OUTPUT_SIZE);
    for (size_t i = 0; i < x.size(); i++) x[i] = static_cast<float>((i * 7919) % 1000) / 500.0f - 1.0f;
    std::vector<double> push, prep, many;
    for (int t = 0; t < ticks; t++) {
        const int i = t % n;
        auto a = clock::now();
        hwb_model_window_push(ws.w[i], x.data() + i * HWB_MODEL_STEP_SIZE, y.data());
        auto b = clock::now();
        hwb_model_window_prepare(ws.w[i]);
        auto c = clock::now();
        push.push_back(std::chrono::duration<double, std::nano>(b - a).count());
        prep.push_back(std::chrono::duration<double, std::nano>(c - b).count());
    }
    for (int r = 0; r < std::max(1, ticks / n); r++) {
        auto a = clock::now();
        hwb_model_window_push_many(ws.w.data(), static_cast<uint32_t>(n), x.data(), y.data());
        auto b = clock::now();
        for (int i = 0; i < n; i++) hwb_model_window_prepare(ws.w[i]);
        many.push_back(std::chrono::duration<double, std::nano>(b - a).count());
    }
    std::printf("%d windows: push p50 %.0f ns p99 %.0f ns; prepare p50 %.0f ns p99 %.0f ns; "
                "push_many of %d p50 %.0f ns (%.0f ns per tick) p99 %.0f ns\n",
                n, pct(push, 0.5), pct(push, 0.99), pct(prep, 0.5), pct(prep, 0.99), n, pct(many, 0.5),
                pct(many, 0.5) / n, pct(many, 0.99));
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc == 4 && std::string(argv[1]) == "--bench") return bench(std::atoi(argv[2]), std::atoi(argv[3]));
    if (argc == 4) return run(std::atoi(argv[1]), argv[2], argv[3]);
    std::fprintf(stderr, "usage: %s N ticks.f32 answers.f32 | --bench N TICKS\n", argv[0]);
    return 2;
}
