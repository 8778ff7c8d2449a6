// A C++ strategy calling a cpu.native model in-process through its exported C ABI.
//
//   hwb export zoo:signal --target cpu.native --format c -o native/   (or Target.export)
//   g++ -O2 -std=c++17 -Inative examples/native_strategy.cpp native/libhwb_model.so -Wl,-rpath,native -o native_strategy
//   ./native_strategy inputs.f32 outputs.f32    # float32 rows in, float32 rows out
//   ./native_strategy --bench 1000000           # ns per hwb_model_predict call
//
// Before the first call it checks that this CPU has every feature the library was built for
// (HWB_MODEL_REQUIRES, /proc/cpuinfo names): a library built with -march=x86-64-v4 on an AVX2
// machine would otherwise die with SIGILL inside hwb_model_predict.
#include "hwb_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::set<std::string> cpu_flags() {
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    while (std::getline(f, line)) {
        if (line.rfind("flags", 0) == 0 || line.rfind("Features", 0) == 0) {
            std::istringstream words(line.substr(line.find(':') + 1));
            return {std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
        }
    }
    return {};
}

// Empty when this CPU can run the library, else the missing features.
std::string missing_features() {
    const std::set<std::string> have = cpu_flags();
    std::string missing, need = HWB_MODEL_REQUIRES;
    std::istringstream parts(need);
    for (std::string f; std::getline(parts, f, ',');)
        if (!f.empty() && !have.count(f)) missing += (missing.empty() ? "" : ",") + f;
    return missing;
}

std::vector<float> read_floats(const char *path) {
    std::ifstream f(path, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<float> v(bytes.size() / sizeof(float));
    std::copy(bytes.begin(), bytes.begin() + v.size() * sizeof(float), reinterpret_cast<char *>(v.data()));
    return v;
}

}  // namespace

int main(int argc, char **argv) {
    const std::string missing = missing_features();
    if (!missing.empty()) {
        std::fprintf(stderr, "this CPU lacks %s, which model %s (isa %s) needs; re-export it for "
                     "this machine (isa=native)\n", missing.c_str(), HWB_MODEL_NAME, HWB_MODEL_ISA);
        return 3;
    }
    constexpr long in_n = HWB_MODEL_INPUT_SIZE, out_n = HWB_MODEL_OUTPUT_SIZE;
    if (argc == 3 && std::string(argv[1]) == "--bench") {
        // blocks of 100 calls timed together (the clock costs ~20 ns, a call less); the median
        // block leaves out the blocks another process preempted
        const long blocks = std::max(1L, std::atol(argv[2]) / 100);
        std::vector<float> x(HWB_MODEL_BATCH * in_n, 0.5f), y(HWB_MODEL_BATCH * out_n);
        std::vector<double> ns;
        for (long b = 0; b < blocks; b++) {
            auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < 100; i++) {
                x[0] = static_cast<float>(i & 7);  // a new input each call
                hwb_model_predict(x.data(), y.data());
                asm volatile("" : : "r"(y.data()) : "memory");
            }
            auto t1 = std::chrono::steady_clock::now();
            ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / 100);
        }
        std::sort(ns.begin(), ns.end());
        std::printf("%s %s: p50 %.1f ns, p99 %.1f ns per hwb_model_predict (%ld blocks of 100)\n",
                    HWB_MODEL_NAME, HWB_MODEL_FINGERPRINT, ns[ns.size() / 2], ns[ns.size() * 99 / 100], blocks);
        return 0;
    }
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s INPUTS.f32 OUTPUTS.f32 | --bench CALLS\n", argv[0]);
        return 2;
    }
    const std::vector<float> x = read_floats(argv[1]);
    if (x.empty() || x.size() % in_n) {
        std::fprintf(stderr, "%s holds %zu floats; expected rows of %ld\n", argv[1], x.size(), in_n);
        return 2;
    }
    const long rows = static_cast<long>(x.size()) / in_n;
    std::vector<float> y(rows * out_n);
    if (hwb_model_predict_n(x.data(), y.data(), rows) != 0) return 1;
    std::ofstream(argv[2], std::ios::binary).write(reinterpret_cast<const char *>(y.data()),
                                                  static_cast<std::streamsize>(y.size() * sizeof(float)));
    std::printf("%ld rows through %s (fingerprint %s, isa %s)\n", rows, HWB_MODEL_NAME,
                HWB_MODEL_FINGERPRINT, HWB_MODEL_ISA);
    return 0;
}
