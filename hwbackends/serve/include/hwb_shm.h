/* hwb_shm.h — header-only C/C++ client of the hwbackends shared-memory endpoint (Linux).
 *
 *   hwb_shm_client c;
 *   int rc = hwb_shm_attach(&c, "hwb-signal", 32, 1);       // 0 = accept any size
 *   if (rc) { fprintf(stderr, "%s\n", hwb_shm_strerror(rc)); ... }
 *   rc = hwb_shm_predict(&c, features, 32, out, 1, 200000); // deadline 200 µs (ns; 0: none)
 *   if (rc == HWB_SHM_OK) use(out); else skip_tick(hwb_shm_strerror(rc), hwb_shm_message(&c));
 *   hwb_shm_detach(&c);
 *
 * `hwb serve --print-include` prints the directory holding this file (add it with -I).
 * Needs POSIX/Linux declarations: C++ (g++ defines _GNU_SOURCE), or C with -std=gnu11 (or
 * _GNU_SOURCE defined before any #include).
 * The Python client (hwbackends.serve.shm.ShmClient) and the server's poll loop are compiled
 * from this same header, so there is one implementation of the protocol.
 *
 * FILES. An endpoint NAME lives in <root>/NAME/, root = $HWB_SHM_DIR or /dev/shm/hwb-<uid>
 * (0700, owned by the server's user; 0710 with a named group). Inside (0700, or 0750 + group):
 *   seg         the mapped segment (0600, or 0660 + group); created under a temporary name and
 *               renamed into place once its header is complete: a client never sees half of it
 *   server.lock flock'ed by the live server for its whole life: a second server is refused,
 *               and a server only removes files whose inode is the one it created
 *   slots.lock  one byte per slot; a client holds an OFD write lock on its slot's byte, which
 *               the kernel drops when the client dies (the server then reclaims the slot)
 * These are plain files, not POSIX shm names: multiprocessing.shared_memory cannot attach
 * (and its resource tracker therefore cannot unlink) them.
 *
 * SEGMENT LAYOUT (native byte order; same machine only). Offsets in bytes.
 *   header, 256 bytes (struct hwb_shm_header below):
 *     0 magic "HWBSHM\0\0"+version check   8 version   12 header_bytes   16 nslots
 *    20 slot_bytes   24 dtype (1 = float32)   28 in_count   32 out_count   36 in_ndim
 *    40 out_ndim   44 in_shape[6]   68 out_shape[6]   92 owner_uid   96 server_pid
 *   104 generation (random per server start)
 *   128 state (1 running, 2 closing)   132 doorbell (futex)   136 server_sleeping
 *   144 heartbeat_ns   152 served   160 bad_payloads   168 deadline_missed   176 reaped
 *   184 errors
 *   slot i at 256 + i * slot_bytes (slot_bytes a multiple of 64):
 *     0 req     sequence the client publishes (release) after writing its input
 *     4 resp    sequence the server publishes (release) after writing status and output;
 *               also the futex word a blocked client sleeps on
 *     8 status  HWB_SHM_OK / _UNAVAILABLE / _BAD_INPUT / _DEADLINE (valid when resp == req)
 *    12 client_waiting   16 owner_pid   20 in_count (floats the client wrote)
 *    24 deadline_ns (absolute CLOCK_MONOTONIC, 0 = none)   32 msg_len
 *    64 msg[192]  (server's message for a non-OK status)
 *   256 in[in_count] float32, then out[out_count] float32
 *
 * ORDERING. Every shared word is accessed with the GCC/Clang __atomic builtins (the C11/C++11
 * memory model): payload stores, then req with release; the server loads req with acquire,
 * so it sees the payload; the same in the other direction through resp. The sleep/wake
 * handshakes (client_waiting, server_sleeping) use a sequentially consistent fence on both
 * sides (Dekker), so no wake-up is lost. This is correct on weakly ordered CPUs (ARM) too.
 *
 * WAITING. The client spins (spin_ns, default 50 µs) re-reading resp, then sleeps on a futex
 * in ≤ 10 ms steps, checking that the server process still exists between steps: a dead
 * server is reported within ~10 ms (HWB_SHM_E_SERVER_GONE).
 *
 * RESYNCHRONISATION. A call that timed out, or a sequence word changed behind the client's
 * back (a stray write), leaves resp != the client's sequence. The next call first lets the
 * server answer whatever stands in req (bounded by timeout_ns), then adopts that value: one
 * call may fail, the client never stays wedged.
 */
#ifndef HWB_SHM_H
#define HWB_SHM_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#ifndef F_OFD_SETLK /* Linux ≥ 3.15; glibc hides it without _GNU_SOURCE */
#define F_OFD_SETLK 37
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define HWB_SHM_MAGIC 0x00004D4853425748ULL /* "HWBSHM\0\0" little-endian */
#define HWB_SHM_VERSION 2u
#define HWB_SHM_HEADER_BYTES 256u
#define HWB_SHM_SLOT_CTL 256u
#define HWB_SHM_MSG 192u
#define HWB_SHM_MAXDIM 6
#define HWB_SHM_DTYPE_F32 1u
#define HWB_SHM_STATE_RUNNING 1u
#define HWB_SHM_STATE_CLOSING 2u

/* Statuses. ≥ 0: answered by the server; < 0: decided by the client. */
#define HWB_SHM_OK 0
#define HWB_SHM_UNAVAILABLE 1 /* the server could not run it (message says why) */
#define HWB_SHM_BAD_INPUT 2   /* NaN/Inf or wrong size: refused and counted by the server */
#define HWB_SHM_DEADLINE 3    /* the deadline had passed when the server reached it */
#define HWB_SHM_E_TIMEOUT (-1)        /* no answer before the deadline; server alive */
#define HWB_SHM_E_SERVER_GONE (-2)    /* the server process is gone or closing */
#define HWB_SHM_E_NOT_RESPONDING (-3) /* could not resynchronise within timeout_ns */
#define HWB_SHM_E_SHAPE (-4)          /* in/out count differs from the endpoint's */
#define HWB_SHM_E_VERSION (-5)        /* the segment speaks another protocol version */
#define HWB_SHM_E_DTYPE (-6)          /* the endpoint's dtype is not float32 */
#define HWB_SHM_E_NOENT (-7)          /* no endpoint of that name (server not running) */
#define HWB_SHM_E_ACCESS (-8)         /* permission denied (another user's endpoint) */
#define HWB_SHM_E_SLOTS_FULL (-9)     /* every slot is taken */
#define HWB_SHM_E_SYS (-10)           /* a system call failed (errno kept in c->err) */
#define HWB_SHM_E_CLOSED (-11)        /* the client is detached */
#define HWB_SHM_E_NOT_HWB (-12)       /* the file is not an hwb segment */
#define HWB_SHM_E_NAME (-13)          /* the name has characters outside [A-Za-z0-9._-] */

typedef struct {
    uint64_t magic;
    uint32_t version, header_bytes, nslots, slot_bytes, dtype, in_count, out_count;
    uint32_t in_ndim, out_ndim, in_shape[HWB_SHM_MAXDIM], out_shape[HWB_SHM_MAXDIM];
    uint32_t owner_uid;
    int32_t server_pid;
    uint32_t _pad0;
    uint64_t generation;
    uint8_t _pad1[128 - 112];
    /* shared words (atomics), on their own cache lines */
    uint32_t state, doorbell, server_sleeping, _pad2;
    uint64_t heartbeat_ns, served, bad_payloads, deadline_missed, reaped, errors;
    uint8_t _pad3[256 - 192];
} hwb_shm_header;

typedef struct {
    uint32_t req, resp, status, client_waiting;
    int32_t owner_pid;
    uint32_t in_count;
    int64_t deadline_ns;
    uint32_t msg_len;
    uint8_t _pad[64 - 36];
    char msg[HWB_SHM_MSG];
} hwb_shm_slot;

#if defined(__cplusplus)
static_assert(sizeof(hwb_shm_header) == 256, "header layout");
static_assert(sizeof(hwb_shm_slot) == 256, "slot layout");
#else
_Static_assert(sizeof(hwb_shm_header) == 256, "header layout");
_Static_assert(sizeof(hwb_shm_slot) == 256, "slot layout");
#endif

typedef struct {
    uint8_t *base;
    size_t size;
    hwb_shm_header *hdr;
    hwb_shm_slot *slot;
    float *in, *out;
    uint32_t seq, in_count, out_count;
    int dirty, lock_fd, slot_index, err;
    int32_t server_pid;
    int64_t spin_ns;    /* busy-poll budget before sleeping (default 50 µs) */
    int64_t timeout_ns; /* wait for calls without a deadline, and for resynchronising (5 s) */
} hwb_shm_client;

/* ---- small helpers (also used by the server loop) ------------------------------------ */
#define HWB_LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define HWB_LOAD_RLX(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define HWB_STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define HWB_STORE_RLX(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define HWB_FENCE() __atomic_thread_fence(__ATOMIC_SEQ_CST)

static inline int64_t hwb_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void hwb_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

static inline long hwb_futex_wait(uint32_t *addr, uint32_t val, int64_t timeout_ns) {
    struct timespec ts;
    ts.tv_sec = (time_t)(timeout_ns / 1000000000LL);
    ts.tv_nsec = (long)(timeout_ns % 1000000000LL);
    /* no FUTEX_PRIVATE_FLAG: the word is in a mapping shared between processes */
    return syscall(SYS_futex, addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static inline long hwb_futex_wake(uint32_t *addr, int n) {
    return syscall(SYS_futex, addr, FUTEX_WAKE, n, NULL, NULL, 0);
}

static inline size_t hwb_shm_slot_bytes(uint32_t in_count, uint32_t out_count) {
    size_t raw = HWB_SHM_SLOT_CTL + 4u * ((size_t)in_count + out_count);
    return (raw + 63u) / 64u * 64u;
}

static inline hwb_shm_slot *hwb_shm_slot_at(hwb_shm_header *h, uint32_t i) {
    return (hwb_shm_slot *)((uint8_t *)h + HWB_SHM_HEADER_BYTES + (size_t)i * h->slot_bytes);
}

static inline float *hwb_shm_slot_in(hwb_shm_slot *s) {
    return (float *)((uint8_t *)s + HWB_SHM_SLOT_CTL);
}

static inline float *hwb_shm_slot_out(hwb_shm_header *h, hwb_shm_slot *s) {
    return hwb_shm_slot_in(s) + h->in_count;
}

static inline int hwb_shm_name_ok(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > 100 || name[0] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

/* <root>/<name> into buf. root: $HWB_SHM_DIR, else /dev/shm/hwb-<owner_uid>. */
static inline int hwb_shm_endpoint_dir(char *buf, size_t n, const char *name, unsigned owner_uid) {
    const char *root = getenv("HWB_SHM_DIR");
    int k;
    if (!hwb_shm_name_ok(name)) return HWB_SHM_E_NAME;
    if (root && *root)
        k = snprintf(buf, n, "%s/%s", root, name);
    else
        k = snprintf(buf, n, "/dev/shm/hwb-%u/%s", owner_uid, name);
    return (k < 0 || (size_t)k >= n) ? HWB_SHM_E_NAME : 0;
}

static inline const char *hwb_shm_strerror(int rc) {
    switch (rc) {
    case HWB_SHM_OK: return "ok";
    case HWB_SHM_UNAVAILABLE: return "unavailable (server could not run the request)";
    case HWB_SHM_BAD_INPUT: return "bad input (refused by the server)";
    case HWB_SHM_DEADLINE: return "deadline";
    case HWB_SHM_E_TIMEOUT: return "deadline";
    case HWB_SHM_E_SERVER_GONE: return "server-gone";
    case HWB_SHM_E_NOT_RESPONDING: return "server-not-responding";
    case HWB_SHM_E_SHAPE: return "shape mismatch: the endpoint expects other input/output sizes";
    case HWB_SHM_E_VERSION: return "protocol version mismatch: rebuild the client against this server's hwb_shm.h";
    case HWB_SHM_E_DTYPE: return "dtype mismatch: the endpoint does not serve float32";
    case HWB_SHM_E_NOENT: return "no such endpoint (is `hwb serve --shm NAME` running as this user?)";
    case HWB_SHM_E_ACCESS: return "permission denied: the endpoint is owner-only (or for a named group)";
    case HWB_SHM_E_SLOTS_FULL: return "all slots are taken (start the server with more --shm-slots)";
    case HWB_SHM_E_SYS: return "system call failed";
    case HWB_SHM_E_CLOSED: return "client is detached";
    case HWB_SHM_E_NOT_HWB: return "not an hwb shared-memory segment";
    case HWB_SHM_E_NAME: return "bad endpoint name (use [A-Za-z0-9._-], at most 100 characters)";
    default: return "unknown status";
    }
}

/* The server's message for HWB_SHM_UNAVAILABLE / HWB_SHM_BAD_INPUT (NUL-terminated copy). */
static inline const char *hwb_shm_message(hwb_shm_client *c) {
    static __thread char msg[HWB_SHM_MSG + 1];
    uint32_t n;
    if (!c->slot) return "";
    n = c->slot->msg_len;
    if (n > HWB_SHM_MSG) n = HWB_SHM_MSG;
    memcpy(msg, c->slot->msg, n);
    msg[n] = 0;
    return msg;
}

static inline int hwb_shm_errno_rc(int e) {
    if (e == ENOENT) return HWB_SHM_E_NOENT;
    if (e == EACCES || e == EPERM) return HWB_SHM_E_ACCESS;
    return HWB_SHM_E_SYS;
}

static inline void hwb_shm_detach(hwb_shm_client *c) {
    if (c->slot) HWB_STORE_REL(&c->slot->owner_pid, 0);
    if (c->lock_fd >= 0) close(c->lock_fd); /* drops the OFD lock on our slot */
    if (c->base) munmap(c->base, c->size);
    c->base = NULL;
    c->hdr = NULL;
    c->slot = NULL;
    c->lock_fd = -1;
}

static inline int hwb_shm__check_header(hwb_shm_client *c, size_t size, uint32_t in_count,
                                        uint32_t out_count) {
    hwb_shm_header *h = c->hdr;
    if (size < HWB_SHM_HEADER_BYTES || (h->magic & 0xFFFFFFFFFFFFULL) != HWB_SHM_MAGIC)
        return HWB_SHM_E_NOT_HWB;
    if (h->version != HWB_SHM_VERSION || h->header_bytes != HWB_SHM_HEADER_BYTES)
        return HWB_SHM_E_VERSION;
    if (h->dtype != HWB_SHM_DTYPE_F32) return HWB_SHM_E_DTYPE;
    if ((in_count && h->in_count != in_count) || (out_count && h->out_count != out_count))
        return HWB_SHM_E_SHAPE;
    if (h->slot_bytes != hwb_shm_slot_bytes(h->in_count, h->out_count) || h->nslots == 0 ||
        size < HWB_SHM_HEADER_BYTES + (size_t)h->nslots * h->slot_bytes)
        return HWB_SHM_E_NOT_HWB;
    return 0;
}

static inline int hwb_shm__claim_slot(hwb_shm_client *c, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/slots.lock", dir);
    c->lock_fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (c->lock_fd < 0) { c->err = errno; return hwb_shm_errno_rc(errno); }
    for (uint32_t i = 0; i < c->hdr->nslots; i++) {
        struct flock fl;
        memset(&fl, 0, sizeof fl);
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        fl.l_start = (off_t)i;
        fl.l_len = 1;
        if (fcntl(c->lock_fd, F_OFD_SETLK, &fl) == 0) {
            c->slot_index = (int)i;
            return 0;
        }
        if (errno != EAGAIN && errno != EACCES) { c->err = errno; return HWB_SHM_E_SYS; }
    }
    return HWB_SHM_E_SLOTS_FULL;
}

/* Attach to endpoint `name` of user `owner_uid` (use geteuid() for your own), claiming a
 * slot. in_count/out_count: the float32 counts the caller will use (0: accept the server's).
 * Returns 0 or a negative HWB_SHM_E_* status; on failure nothing stays open. */
static inline int hwb_shm_attach_as(hwb_shm_client *c, const char *name, unsigned owner_uid,
                                    uint32_t in_count, uint32_t out_count) {
    char dir[4096], path[4200];
    struct stat st;
    int fd, rc;
    memset(c, 0, sizeof *c);
    c->lock_fd = -1;
    c->slot_index = -1;
    c->spin_ns = 50000;
    c->timeout_ns = 5000000000LL;
    if ((rc = hwb_shm_endpoint_dir(dir, sizeof dir, name, owner_uid))) return rc;
    snprintf(path, sizeof path, "%s/seg", dir);
    fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) { c->err = errno; return hwb_shm_errno_rc(errno); }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) { close(fd); return HWB_SHM_E_NOT_HWB; }
    c->size = (size_t)st.st_size;
    if (c->size < HWB_SHM_HEADER_BYTES) { close(fd); return HWB_SHM_E_NOT_HWB; }
    c->base = (uint8_t *)mmap(NULL, c->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (c->base == (uint8_t *)MAP_FAILED) { c->base = NULL; c->err = errno; return HWB_SHM_E_SYS; }
    c->hdr = (hwb_shm_header *)c->base;
    if ((rc = hwb_shm__check_header(c, c->size, in_count, out_count)) ||
        (rc = hwb_shm__claim_slot(c, dir))) {
        hwb_shm_detach(c);
        return rc;
    }
    c->slot = hwb_shm_slot_at(c->hdr, (uint32_t)c->slot_index);
    c->in = hwb_shm_slot_in(c->slot);
    c->out = hwb_shm_slot_out(c->hdr, c->slot);
    c->in_count = c->hdr->in_count;
    c->out_count = c->hdr->out_count;
    c->server_pid = c->hdr->server_pid;
    HWB_STORE_REL(&c->slot->owner_pid, (int32_t)getpid());
    c->seq = HWB_LOAD_ACQ(&c->slot->req);
    /* a request a dead predecessor left behind: resynchronise before the first call */
    c->dirty = HWB_LOAD_ACQ(&c->slot->resp) != c->seq;
    return 0;
}

static inline int hwb_shm_attach(hwb_shm_client *c, const char *name, uint32_t in_count,
                                 uint32_t out_count) {
    return hwb_shm_attach_as(c, name, (unsigned)geteuid(), in_count, out_count);
}

static inline int hwb_shm_server_alive(hwb_shm_client *c) {
    if (HWB_LOAD_ACQ(&c->hdr->state) != HWB_SHM_STATE_RUNNING) return 0;
    return !(kill(c->server_pid, 0) != 0 && errno == ESRCH);
}

/* Wait until resp == seq or `until` (CLOCK_MONOTONIC ns). 0, E_TIMEOUT or E_SERVER_GONE. */
static inline int hwb_shm__wait(hwb_shm_client *c, uint32_t seq, int64_t until) {
    uint32_t *resp = &c->slot->resp;
    int64_t now = hwb_now_ns(), spin_until = now + c->spin_ns;
    for (unsigned k = 0;; k++) {
        if (HWB_LOAD_ACQ(resp) == seq) return 0;
        if ((k & 15u) == 0) {
            now = hwb_now_ns();
            if (now >= until) return HWB_SHM_E_TIMEOUT;
            if (now >= spin_until) break;
        }
        hwb_cpu_relax();
    }
    for (;;) {
        uint32_t r;
        int64_t step;
        HWB_STORE_RLX(&c->slot->client_waiting, 1u);
        HWB_FENCE(); /* pairs with the server's fence between publishing resp and reading this */
        r = HWB_LOAD_ACQ(resp);
        if (r == seq) break;
        now = hwb_now_ns();
        if (now >= until) { HWB_STORE_RLX(&c->slot->client_waiting, 0u); return HWB_SHM_E_TIMEOUT; }
        step = until - now < 10000000LL ? until - now : 10000000LL;
        hwb_futex_wait(resp, r, step);
        if (HWB_LOAD_ACQ(resp) == seq) break;
        if (!hwb_shm_server_alive(c)) {
            HWB_STORE_RLX(&c->slot->client_waiting, 0u);
            return HWB_SHM_E_SERVER_GONE;
        }
    }
    HWB_STORE_RLX(&c->slot->client_waiting, 0u);
    return 0;
}

static inline void hwb_shm__ring(hwb_shm_header *h) {
    HWB_FENCE(); /* pairs with the server's fence between server_sleeping = 1 and its scan */
    if (HWB_LOAD_RLX(&h->server_sleeping)) {
        __atomic_fetch_add(&h->doorbell, 1u, __ATOMIC_SEQ_CST);
        hwb_futex_wake(&h->doorbell, 1);
    }
}

/* Let the server answer whatever stands in req, then adopt it as our sequence. */
static inline int hwb_shm__resync(hwb_shm_client *c) {
    uint32_t r = HWB_LOAD_ACQ(&c->slot->req);
    int rc;
    hwb_shm__ring(c->hdr);
    rc = hwb_shm__wait(c, r, hwb_now_ns() + c->timeout_ns);
    if (rc == HWB_SHM_E_TIMEOUT) return HWB_SHM_E_NOT_RESPONDING;
    if (rc) return rc;
    c->seq = r;
    c->dirty = 0;
    return 0;
}

/* One sample: in[n_in] → out[n_out]. deadline_ns: relative budget (≤ 0: none, the client's
 * timeout_ns applies). Returns HWB_SHM_OK (out written) or another status; out is untouched
 * unless the status is HWB_SHM_OK. */
static inline int hwb_shm_predict(hwb_shm_client *c, const float *in, uint32_t n_in, float *out,
                                  uint32_t n_out, int64_t deadline_ns) {
    hwb_shm_slot *s = c->slot;
    int64_t t0, until;
    uint32_t seq, st;
    int rc;
    if (!s) return HWB_SHM_E_CLOSED;
    if (n_in != c->in_count || n_out != c->out_count) return HWB_SHM_E_SHAPE;
    if (c->dirty || HWB_LOAD_ACQ(&s->resp) != c->seq) {
        if ((rc = hwb_shm__resync(c))) return rc;
    }
    t0 = hwb_now_ns();
    until = deadline_ns > 0 ? t0 + deadline_ns : t0 + c->timeout_ns;
    memcpy(c->in, in, (size_t)n_in * 4u);
    HWB_STORE_RLX(&s->in_count, n_in);
    HWB_STORE_RLX(&s->deadline_ns, deadline_ns > 0 ? until : (int64_t)0);
    seq = c->seq + 1u;
    HWB_STORE_REL(&s->req, seq); /* publishes the payload above */
    c->seq = seq;
    hwb_shm__ring(c->hdr);
    rc = hwb_shm__wait(c, seq, until);
    if (rc) {
        c->dirty = 1;
        return rc;
    }
    st = HWB_LOAD_RLX(&s->status);
    if (st == HWB_SHM_OK) memcpy(out, c->out, (size_t)n_out * 4u);
    return (int)st;
}

#ifdef __cplusplus
}
#endif
#endif /* HWB_SHM_H */
