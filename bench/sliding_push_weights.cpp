// The sliding push of several cpu.native libraries of one model (push_weights fp32 / bf16 / f16 / int8, any isa)
// timed interleaved in one C++ process (bench/sliding.py --push-weights builds and runs it).
//
//   g++ -O2 -std=c++17 bench/sliding_push_weights.cpp -ldl -o push_weights
//   ./push_weights STEP_SIZE ROUNDS BLOCK LABEL=lib1.so LABEL=lib2.so ...
//
// Each library is dlopen'ed on its own (RTLD_LOCAL: every one keeps its own window). Per round,
// each library in turn runs BLOCK ticks: a new step each tick (a fixed pseudo-random sequence),
// hwb_model_push timed with steady_clock around it, then hwb_model_prepare (not timed), so a
// shared machine's noise hits them alike. The first round is a warm-up, unrecorded. Prints one
// line per library: push p50 / p99 / p99.9 in ns and the number of ticks.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using push_fn = int (*)(const float *, float *);
using void_fn = int (*)();

struct Lib {
    std::string label;
    push_fn push;
    void_fn prepare, reset;
    std::vector<double> ns;
};

double pct(std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 5) {
        std::fprintf(stderr, "usage: %s STEP_SIZE ROUNDS BLOCK LABEL=LIB.so...\n", argv[0]);
        return 2;
    }
    const long step = std::atol(argv[1]), rounds = std::atol(argv[2]), block = std::atol(argv[3]);
    if (step <= 0 || rounds <= 0 || block <= 0) {
        std::fprintf(stderr, "STEP_SIZE, ROUNDS and BLOCK must be positive\n");
        return 2;
    }
    std::vector<Lib> libs;
    for (int a = 4; a < argc; a++) {
        const std::string arg = argv[a];
        const auto eq = arg.find('=');
        if (eq == std::string::npos) {
            std::fprintf(stderr, "%s: expected LABEL=path/to/libhwb_model.so\n", argv[a]);
            return 2;
        }
        void *h = dlopen(arg.substr(eq + 1).c_str(), RTLD_NOW | RTLD_LOCAL);
        if (h == nullptr) {
            std::fprintf(stderr, "dlopen %s: %s\n", arg.c_str(), dlerror());
            return 1;
        }
        Lib lib{arg.substr(0, eq), reinterpret_cast<push_fn>(dlsym(h, "hwb_model_push")),
                reinterpret_cast<void_fn>(dlsym(h, "hwb_model_prepare")),
                reinterpret_cast<void_fn>(dlsym(h, "hwb_model_reset")), {}};
        if (!lib.push || !lib.prepare || !lib.reset) {
            std::fprintf(stderr, "%s has no sliding window (hwb_model_push)\n", arg.c_str());
            return 1;
        }
        lib.reset();
        libs.push_back(lib);
    }
    std::vector<float> xs(4096 * step), y(1 << 16);  // y: room for any zoo output
    unsigned s = 12345;
    for (auto &v : xs) {
        s = s * 1103515245u + 12345u;
        v = static_cast<float>((s >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
    for (long r = -1; r < rounds; r++) {
        for (auto &lib : libs) {
            for (long i = 0; i < block; i++) {
                const float *x = xs.data() + ((r + 1) * block + i) % 4096 * step;
                const auto t0 = std::chrono::steady_clock::now();
                lib.push(x, y.data());
                asm volatile("" : : "r"(y.data()) : "memory");
                const auto t1 = std::chrono::steady_clock::now();
                lib.prepare();
                if (r >= 0) lib.ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
            }
        }
    }
    for (const auto &lib : libs)
        std::printf("%s: push p50 %.0f ns, p99 %.0f ns, p99.9 %.0f ns (%zu ticks)\n", lib.label.c_str(),
                    pct(lib.ns, 0.5), pct(lib.ns, 0.99), pct(lib.ns, 0.999), lib.ns.size());
    return 0;
}
