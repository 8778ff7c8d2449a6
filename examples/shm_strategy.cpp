// A C++ strategy calling a model served by `hwb serve --shm NAME`, through hwb_shm.h.
//
//   g++ -O2 -std=c++17 -I"$(hwb serve --print-include)" examples/shm_strategy.cpp -o shm_strategy
//   ./shm_strategy NAME predict in.f32 out.f32     # rows of float32 features -> float32 outputs
//   ./shm_strategy NAME bench N [GAP_US]           # N calls (GAP_US apart; default back to back)
//   ./shm_strategy NAME replay ticks.f64           # open loop: one call per scheduled arrival
//   ./shm_strategy NAME streams K in.f32 out.f32   # sliding: row r is a tick of symbol r % K
//
// A sliding endpoint (`hwb serve ... --shm NAME --sliding [--streams N]`) takes one tick per
// call (its in_count is one tick's floats; the header's `window` says how many ticks it keeps)
// for one of this client's N windows: every mode above then sends ticks to stream 0, and
// `predict` answers one row per tick, in order; `streams K` sends row r to stream r % K with
// hwb_shm_push(), as a desk feeding K symbols through one connection does (each connection's
// windows are its own and start empty; hwb_shm_reset_stream() empties one mid-session). Pin
// this process to another core than the server's loop (`hwb serve` prints it): taskset -c 0 ...
// The server prepares a window after its answer, in its idle time: back to back on one
// window, the next call may wait for that prepare; `bench N 20` leaves 20 µs between calls,
// as real ticks do, so it does not.
//
// Every failure is a status, never a wrong answer: a version, dtype or size mismatch is
// refused at attach (exit 3); a tick whose answer did not come is skipped and counted.
#include <hwb_shm.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

std::vector<char> read_file(const char *path) {
    std::vector<char> buf;
    FILE *f = std::fopen(path, "rb");
    if (!f) { std::perror(path); std::exit(2); }
    char tmp[1 << 16];
    size_t n;
    while ((n = std::fread(tmp, 1, sizeof tmp, f)) > 0) buf.insert(buf.end(), tmp, tmp + n);
    std::fclose(f);
    return buf;
}

double pct(std::vector<double> v, double q) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    size_t i = static_cast<size_t>(q * (v.size() - 1) + 0.5);
    return v[std::min(i, v.size() - 1)];
}

void print_stats(const std::vector<double> &lat_us, long lost, long errors) {
    std::printf("{\"n\": %zu, \"p50_us\": %.3f, \"p99_us\": %.3f, \"p999_us\": %.3f, "
                "\"max_us\": %.3f, \"lost\": %ld, \"errors\": %ld}\n",
                lat_us.size(), pct(lat_us, 0.50), pct(lat_us, 0.99), pct(lat_us, 0.999),
                lat_us.empty() ? 0.0 : *std::max_element(lat_us.begin(), lat_us.end()), lost,
                errors);
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s NAME predict IN OUT | bench N | replay TICKS | streams K IN OUT\n",
                     argv[0]);
        return 2;
    }
    hwb_shm_client c;
    int rc = hwb_shm_attach(&c, argv[1], 0, 0);
    if (rc) {
        std::fprintf(stderr, "attach %s: %s\n", argv[1], hwb_shm_strerror(rc));
        return 3;
    }
    const uint32_t ni = c.in_count, no = c.out_count;
    std::string mode = argv[2];
    if (c.hdr->sliding == HWB_SHM_ONE_TICK)
        std::fprintf(stderr, "%s: sliding endpoint, one tick of %u floats per call (window of %u, "
                     "%u streams)\n", argv[1], ni, c.hdr->window, c.streams);
    std::vector<float> out(no);
    int status = 0;

    if (mode == "predict" && argc == 5) {
        std::vector<char> raw = read_file(argv[3]);
        if (raw.size() % (4u * ni)) {
            std::fprintf(stderr, "%s: %zu bytes is not a whole number of %u-float rows\n",
                         argv[3], raw.size(), ni);
            hwb_shm_detach(&c);
            return 2;
        }
        size_t rows = raw.size() / (4u * ni);
        std::vector<float> x(raw.size() / 4), y(rows * no);
        std::memcpy(x.data(), raw.data(), raw.size());
        for (size_t r = 0; r < rows; r++) {
            rc = hwb_shm_predict(&c, &x[r * ni], ni, &y[r * no], no, 0);
            if (rc != HWB_SHM_OK) {
                std::fprintf(stderr, "row %zu: %s %s\n", r, hwb_shm_strerror(rc), hwb_shm_message(&c));
                status = 4;
                break;
            }
        }
        FILE *f = std::fopen(argv[4], "wb");
        if (!f || std::fwrite(y.data(), 4, y.size(), f) != y.size()) status = 2;
        if (f) std::fclose(f);
    } else if (mode == "streams" && argc == 6) {
        const uint32_t k = static_cast<uint32_t>(std::atol(argv[3]));
        std::vector<char> raw = read_file(argv[4]);
        if (k == 0 || raw.size() % (4u * ni)) {
            std::fprintf(stderr, "streams: K must be >= 1 and %s whole %u-float rows\n", argv[4], ni);
            hwb_shm_detach(&c);
            return 2;
        }
        size_t rows = raw.size() / (4u * ni);
        std::vector<float> x(raw.size() / 4), y(rows * no);
        std::memcpy(x.data(), raw.data(), raw.size());
        for (size_t r = 0; r < rows; r++) {
            rc = hwb_shm_push(&c, static_cast<uint32_t>(r % k), &x[r * ni], &y[r * no], 0);
            if (rc != HWB_SHM_OK) {
                std::fprintf(stderr, "row %zu (stream %zu): %s %s\n", r, r % k, hwb_shm_strerror(rc),
                             hwb_shm_message(&c));
                status = 4;
                break;
            }
        }
        FILE *f = std::fopen(argv[5], "wb");
        if (!f || std::fwrite(y.data(), 4, y.size(), f) != y.size()) status = 2;
        if (f) std::fclose(f);
    } else if (mode == "bench" && (argc == 4 || argc == 5)) {
        long n = std::atol(argv[3]), errors = 0;
        const int64_t gap_ns = argc == 5 ? static_cast<int64_t>(std::atof(argv[4]) * 1e3) : 0;
        std::vector<float> xs(256 * ni);
        unsigned s = 12345;
        for (auto &v : xs) { s = s * 1103515245u + 12345u; v = ((s >> 8) & 0xFFFF) / 32768.0f - 1.0f; }
        std::vector<double> lat;
        lat.reserve(n);
        for (long i = 0; i < n; i++) {
            if (gap_ns > 0) {  // spin, not sleep: the client stays on its core
                int64_t until = hwb_now_ns() + gap_ns;
                while (hwb_now_ns() < until) hwb_cpu_relax();
            }
            int64_t t0 = hwb_now_ns();
            rc = hwb_shm_predict(&c, &xs[(i % 256) * ni], ni, out.data(), no, 0);
            int64_t t1 = hwb_now_ns();
            if (rc != HWB_SHM_OK) errors++;
            if (i >= n / 20) lat.push_back((t1 - t0) / 1e3);  // first 5 %: warm-up
        }
        print_stats(lat, 0, errors);
    } else if (mode == "replay" && argc == 4) {
        // Open loop: latency counts from the *scheduled* arrival, so queueing behind a slow
        // call is charged to the calls that waited (no coordinated omission).
        std::vector<char> raw = read_file(argv[3]);
        size_t n = raw.size() / 8;
        std::vector<double> at(n);
        std::memcpy(at.data(), raw.data(), n * 8);
        std::vector<float> x(ni, 0.25f);
        std::vector<double> lat;
        lat.reserve(n);
        long lost = 0, errors = 0;
        int64_t start = hwb_now_ns() + 1000000;
        for (size_t i = 0; i < n; i++) {
            int64_t due = start + static_cast<int64_t>(at[i] * 1e9);
            int64_t ahead = due - hwb_now_ns();
            if (ahead > 300000) {  // sleep until shortly before the tick, then spin
                struct timespec ts = {0, static_cast<long>(ahead - 250000)};
                ts.tv_sec = ts.tv_nsec / 1000000000L;
                ts.tv_nsec %= 1000000000L;
                nanosleep(&ts, nullptr);
            }
            while (hwb_now_ns() < due) hwb_cpu_relax();
            x[i % ni] += 1e-3f;
            rc = hwb_shm_predict(&c, x.data(), ni, out.data(), no, 0);
            if (rc == HWB_SHM_OK) lat.push_back((hwb_now_ns() - due) / 1e3);
            else if (rc < 0) lost++;
            else errors++;
        }
        print_stats(lat, lost, errors);
    } else {
        std::fprintf(stderr, "unknown mode %s (or wrong arguments)\n", mode.c_str());
        status = 2;
    }
    hwb_shm_detach(&c);
    return status;
}
