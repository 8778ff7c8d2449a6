/* hwb_shm.h — header-only C/C++ client of the hwbackends shared-memory endpoint (Linux ≥ 5.1).
 *
 *   hwb_shm_client c;
 *   int rc = hwb_shm_attach(&c, "hwb-signal", 32, 1);       // 0 = accept any size
 *   if (rc) { fprintf(stderr, "%s\n", hwb_shm_strerror(rc)); ... }
 *   rc = hwb_shm_predict(&c, features, 32, out, 1, 200000); // deadline 200 µs (ns; 0: none)
 *   if (rc == HWB_SHM_OK) use(out); else skip_tick(hwb_shm_strerror(rc), hwb_shm_message(&c));
 *   rc = hwb_shm_push(&c, 7, tick, out, 200000);            // a sliding endpoint: this client's
 *                                                           // window 7 (0 .. c.streams-1)
 *   hwb_shm_detach(&c);
 *
 * `hwb serve --print-include` prints the directory holding this file (add it with -I).
 * Needs POSIX/Linux declarations: C++ (g++ defines _GNU_SOURCE), or C with -std=gnu11 (or
 * _GNU_SOURCE defined before any #include).
 * The Python client (hwbackends.serve.shm.ShmClient) and the server's poll loop are compiled
 * from this same header, so there is one implementation of the protocol.
 *
 * TRUST. Nothing one client can write reaches another client or the server's own state:
 *   - each client gets its OWN slot: a memfd the server creates for that connection, sealed
 *     against shrinking/growing (the server can never fault on it), mapped by that client and
 *     the server only. No other client can map, read or write it;
 *   - the header (geometry, state, counters) is a memfd sealed with F_SEAL_FUTURE_WRITE: a
 *     client maps it read-only and cannot make it writable; the server keeps its own copy of
 *     every geometry value and never re-reads what a client could have written;
 *   - everything the server reads from a slot (req, in_count, stream, deadline, features) is
 *     treated as untrusted input that can only change that client's own answer; the server
 *     keeps its own record of which sequence it answered last, and a sliding endpoint's
 *     windows are per connection (a stream id names one of this client's windows only);
 *   - the client authenticates the server: the endpoint directory and its parent must be
 *     owned by the expected uid and not writable by group/others (OpenSSH's StrictModes), and
 *     the socket's peer credentials (SO_PEERCRED, set by the kernel) must be that uid and the
 *     pid the header names.
 *
 * FILES. An endpoint NAME lives in <root>/NAME/, root = $HWB_SHM_DIR or /dev/shm/hwb-<uid>
 * (0700, owned by the server's user; 0710 with a named group). Inside (0700, or 0750 + group):
 *   sock        a listening Unix stream socket (0600, or 0660 + group); bound under a temporary
 *               name and renamed into place once it listens
 *   server.lock flock'ed by the live server for its whole life: a second server is refused,
 *               and a server only removes files whose inode is the one it created
 * A client connects to sock; the server answers with one hello message (struct hwb_shm_hello)
 * carrying two descriptors (SCM_RIGHTS): the header memfd (read-only for the client) and the
 * client's slot memfd. The connection stays open: it is the doorbell (the client writes one
 * byte when the server sleeps) and each side's liveness signal (closing it frees the slot at
 * once; the client sees the server gone through POLLHUP).
 *
 * HEADER LAYOUT (native byte order; same machine only). Offsets in bytes, 256 bytes (the
 * Python extension exports them, from offsetof on the structs below, as HEADER_OFFSETS and
 * SLOT_OFFSETS; nothing in Python hard-codes one):
 *     0 magic "HWBSHM\0\0"   8 version   12 header_bytes   16 nslots (max clients)
 *    20 slot_bytes   24 dtype (1 = float32)   28 in_count   32 out_count   36 in_ndim
 *    40 out_ndim   44 in_shape[6]   68 out_shape[6]   92 owner_uid   96 server_pid
 *   104 generation (random per server start)   112 sliding (0 whole input per request, 1 one
 *   tick per request: the server keeps the window)   116 window (ticks; 0 unless sliding)
 *   120 streams (windows each client may keep: stream ids 0 .. streams-1; 0 unless sliding)
 *   128 state (1 running, 2 closing)   132 windows (a sliding endpoint's windows alive now)
 *   136 server_sleeping
 *   144 heartbeat_ns   152 served   160 bad_payloads   168 deadline_missed   176 detached
 *   184 errors
 * SLOT LAYOUT (slot_bytes, a multiple of 64):
 *     0 req     sequence the client publishes (release) after writing its input
 *     4 resp    sequence the server publishes (release) after writing status and output;
 *               also the futex word a blocked client sleeps on
 *     8 status  HWB_SHM_OK / _UNAVAILABLE / _BAD_INPUT / _DEADLINE / _BREAKER_OPEN / _STOPPED
 *               (valid when resp == req; any status but OK means "no answer this tick")
 *    12 client_waiting   16 flags (HWB_SHM_FLAG_RESET)   20 in_count (floats the client wrote)
 *    24 deadline_ns (absolute CLOCK_MONOTONIC, 0 = none)   32 msg_len
 *    36 stream  (a sliding endpoint: which of this client's windows the tick is for)
 *    64 msg[192]  (server's message for a non-OK status)
 *   256 in[in_count] float32, then out[out_count] float32
 *
 * ORDERING. Every shared word is accessed with the GCC/Clang __atomic builtins (the C11/C++11
 * memory model): payload stores, then req with release; the server loads req with acquire,
 * so it sees the payload; the same in the other direction through resp. The sleep/wake
 * handshakes (client_waiting, server_sleeping) use a sequentially consistent fence on both
 * sides (Dekker); the server's doorbell is a byte in a socket buffer, which cannot be lost.
 * This is correct on weakly ordered CPUs (ARM) too.
 *
 * SLIDING ENDPOINTS (version 4; streams since 5). Header `sliding` = HWB_SHM_ONE_TICK: each
 * request carries one tick (in_shape is one tick's, `window` the window's length in ticks) for
 * one of the client's windows, the slot's `stream` (hwb_shm_push()); the server keeps the
 * windows, answers with the model on the window ending at the tick, then prepares the next
 * tick after the answer is published. Stream ids are PER CLIENT: each connection has its own
 * windows 0 .. header `streams`-1 (one per symbol), made on their first tick, freed when it
 * hangs up; client A's stream 7 and client B's stream 7 are two windows, and no request of
 * one client can reach another's. A stream id ≥ `streams` is BAD_INPUT (the message says the
 * range). A request whose `flags` hold HWB_SHM_FLAG_RESET empties its stream's window first
 * (in_count 0: a reset alone, answered OK without outputs; hwb_shm_reset_stream()); a new
 * connection starts with every window empty. A whole-input endpoint refuses flags and stream
 * ids other than 0 (BAD_INPUT). Clients of another version are refused at attach
 * (E_VERSION): a version 4 client would feed every tick into stream 0 without knowing it.
 *
 * WAITING. The client spins (spin_ns, default 50 µs) re-reading resp, then sleeps on a futex
 * in ≤ 10 ms steps, checking between steps that the server's connection is still open: a dead
 * (or zombie) server is reported within ~10 ms (HWB_SHM_E_SERVER_GONE).
 *
 * RESYNCHRONISATION. Each call publishes one past whatever stands in req (skipping the value
 * in resp), so it is never the sequence the server answered last: after a call that timed
 * out, or a sequence word changed behind the client's back (a stray write by the client's own
 * process), at most one call fails; the client never stays wedged. An answer counts only when
 * resp equals the sequence this call published: it is bound to this request.
 */
#ifndef HWB_SHM_H
#define HWB_SHM_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* glibc hides these without _GNU_SOURCE; the values are the kernel's ABI */
#ifndef O_PATH
#define O_PATH 010000000
#endif
#ifndef POLLRDHUP
#define POLLRDHUP 0x2000
#endif
#ifndef MSG_CMSG_CLOEXEC
#define MSG_CMSG_CLOEXEC 0x40000000
#endif
#ifndef F_ADD_SEALS
#define F_ADD_SEALS 1033
#define F_GET_SEALS 1034
#define F_SEAL_SEAL 0x0001
#define F_SEAL_SHRINK 0x0002
#define F_SEAL_GROW 0x0004
#define F_SEAL_WRITE 0x0008
#endif
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux ≥ 5.1 */
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define HWB_SHM_MAGIC 0x00004D4853425748ULL /* "HWBSHM\0\0" little-endian */
#define HWB_SHM_VERSION 5u /* 4: sliding endpoints (header sliding/window, slot flags); 5: streams */
#define HWB_SHM_HEADER_BYTES 256u
#define HWB_SHM_SLOT_CTL 256u
#define HWB_SHM_MSG 192u
#define HWB_SHM_MAXDIM 6
#define HWB_SHM_DTYPE_F32 1u
#define HWB_SHM_STATE_RUNNING 1u
#define HWB_SHM_STATE_CLOSING 2u
/* header `sliding`: what one request carries */
#define HWB_SHM_WHOLE_INPUT 0u /* the model's whole input (e.g. a whole window) */
#define HWB_SHM_ONE_TICK 1u    /* one tick (the input's shape[1:]); the server keeps the window */
/* slot `flags` (a sliding endpoint only; a whole-input endpoint refuses them, BAD_INPUT) */
#define HWB_SHM_FLAG_RESET 1u /* empty the window (zero-filled) before this request's tick; with
                                 in_count 0 the request only resets (status OK, no outputs) */
/* seals the server puts on the slot memfd (and the header's, plus F_SEAL_FUTURE_WRITE) */
#define HWB_SHM_SLOT_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
#define HWB_SHM_HEADER_SEALS (HWB_SHM_SLOT_SEALS | F_SEAL_FUTURE_WRITE)

/* Statuses. ≥ 0: answered by the server; < 0: decided by the client. One table, read three
 * ways: the enum below (HWB_SHM_OK, HWB_SHM_DEADLINE, ...), hwb_shm_strerror(), and the Python
 * extension's STATUS dict, from which hwbackends.serve.request.Status takes its values (so
 * the Python names and numbers cannot drift from these). X(name, value, text). */
#define HWB_SHM_STATUSES(X)                                                                        \
    X(OK, 0, "ok")                                                                                 \
    X(UNAVAILABLE, 1, "unavailable (server could not run the request)") /* message says why */    \
    X(BAD_INPUT, 2, "bad input (refused by the server)") /* NaN/Inf or wrong size; counted */      \
    X(DEADLINE, 3, "deadline")        /* the deadline had passed when the server reached it */   \
    X(BREAKER_OPEN, 4, "breaker-open") /* the server sheds calls while its backend recovers */   \
    X(STOPPED, 5, "engine-stopped")   /* the server's engine is stopping */                      \
    X(E_TIMEOUT, -1, "deadline")      /* no answer before the deadline; server alive */          \
    X(E_SERVER_GONE, -2, "server-gone") /* the server process is gone or closing */              \
    X(E_NOT_RESPONDING, -3, "server-not-responding") /* attach: no hello within timeout_ns */     \
    X(E_SHAPE, -4, "shape mismatch: the endpoint expects other input/output sizes")              \
    X(E_VERSION, -5, "protocol version mismatch: rebuild the client against this server's hwb_shm.h") \
    X(E_DTYPE, -6, "dtype mismatch: the endpoint does not serve float32")                        \
    X(E_NOENT, -7, "no such endpoint (is `hwb serve --shm NAME` running as this user?)")          \
    X(E_ACCESS, -8, "permission denied: the endpoint is owner-only (or for a named group)")       \
    X(E_SLOTS_FULL, -9, "all slots are taken (start the server with more --shm-slots)")           \
    X(E_SYS, -10, "system call failed") /* errno kept in c->err */                               \
    X(E_CLOSED, -11, "client is detached")                                                         \
    X(E_NOT_HWB, -12, "not an hwb shared-memory endpoint")                                         \
    X(E_NAME, -13, "bad endpoint name (use [A-Za-z0-9._-], at most 100 characters)")              \
    X(E_OWNER, -14, "refused: the endpoint (its directory, or the process serving it) is not the expected user's")

enum hwb_shm_status {
#define HWB_SHM__ENUM(name, value, text) HWB_SHM_##name = value,
    HWB_SHM_STATUSES(HWB_SHM__ENUM)
#undef HWB_SHM__ENUM
};

typedef struct {
    uint64_t magic;
    uint32_t version, header_bytes, nslots, slot_bytes, dtype, in_count, out_count;
    uint32_t in_ndim, out_ndim, in_shape[HWB_SHM_MAXDIM], out_shape[HWB_SHM_MAXDIM];
    uint32_t owner_uid;
    int32_t server_pid;
    uint32_t _pad0;
    uint64_t generation;
    uint32_t sliding; /* HWB_SHM_WHOLE_INPUT or HWB_SHM_ONE_TICK */
    uint32_t window;  /* ONE_TICK: the window's length in ticks (in_shape is one tick's); else 0 */
    uint32_t streams; /* ONE_TICK: windows per client (stream ids 0 .. streams-1); else 0 */
    uint8_t _pad1[128 - 124];
    /* words the server updates (clients only read them), on their own cache line */
    uint32_t state, windows, server_sleeping, _pad2; /* windows: alive now (sliding) */
    uint64_t heartbeat_ns, served, bad_payloads, deadline_missed, detached, errors;
    uint8_t _pad3[256 - 192];
} hwb_shm_header;

typedef struct {
    uint32_t req, resp, status, client_waiting;
    uint32_t flags; /* HWB_SHM_FLAG_*, read by the server with the request */
    uint32_t in_count;
    int64_t deadline_ns;
    uint32_t msg_len;
    uint32_t stream; /* a sliding endpoint: this client's window the tick is for (0: whole input) */
    uint8_t _pad[64 - 40];
    char msg[HWB_SHM_MSG];
} hwb_shm_slot;

/* The server's one message on a new connection (with 2 fds on success: header, slot). */
typedef struct {
    uint64_t magic;
    uint32_t version;
    int32_t status;      /* 0, or HWB_SHM_E_SLOTS_FULL (then no descriptors) */
    uint32_t slot_index; /* for logs only: the slot is the memfd, not an index into anything */
    uint32_t slot_bytes;
    uint64_t generation;
} hwb_shm_hello;

#if defined(__cplusplus)
static_assert(sizeof(hwb_shm_header) == 256, "header layout");
static_assert(sizeof(hwb_shm_slot) == 256, "slot layout");
static_assert(sizeof(hwb_shm_hello) == 32, "hello layout");
#else
_Static_assert(sizeof(hwb_shm_header) == 256, "header layout");
_Static_assert(sizeof(hwb_shm_slot) == 256, "slot layout");
_Static_assert(sizeof(hwb_shm_hello) == 32, "hello layout");
#endif

/* SO_PEERCRED's answer (struct ucred, which glibc hides without _GNU_SOURCE) */
typedef struct {
    int32_t pid;
    uint32_t uid, gid;
} hwb_shm_ucred;

typedef struct {
    const hwb_shm_header *hdr; /* read-only mapping */
    hwb_shm_slot *slot;        /* this client's own slot */
    size_t hdr_size, slot_size;
    float *in, *out;
    uint32_t seq, in_count, out_count;
    uint32_t streams;          /* a sliding endpoint's windows per client (0: whole inputs) */
    int sock, slot_index, err;
    int32_t server_pid;
    int64_t spin_ns;    /* busy-poll budget before sleeping (default 50 µs) */
    int64_t timeout_ns; /* wait for calls without a deadline, and for the
                           server's hello at attach (5 s) */
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

static inline float *hwb_shm_slot_in(hwb_shm_slot *s) {
    return (float *)((uint8_t *)s + HWB_SHM_SLOT_CTL);
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

/* The root directory into buf: $HWB_SHM_DIR, else /dev/shm/hwb-<owner_uid>. */
static inline int hwb_shm_root_dir(char *buf, size_t n, unsigned owner_uid) {
    const char *root = getenv("HWB_SHM_DIR");
    int k;
    if (root && *root)
        k = snprintf(buf, n, "%s", root);
    else
        k = snprintf(buf, n, "/dev/shm/hwb-%u", owner_uid);
    return (k < 0 || (size_t)k >= n) ? HWB_SHM_E_NAME : 0;
}

static inline const char *hwb_shm_strerror(int rc) {
    switch (rc) {
#define HWB_SHM__CASE(name, value, text) case value: return text;
    HWB_SHM_STATUSES(HWB_SHM__CASE)
#undef HWB_SHM__CASE
    default: return "unknown status";
    }
}

/* The server's message for HWB_SHM_UNAVAILABLE / HWB_SHM_BAD_INPUT (NUL-terminated copy). */
static inline const char *hwb_shm_message(hwb_shm_client *c) {
    static __thread char msg[HWB_SHM_MSG + 1];
    uint32_t n;
    if (!c->slot) return "";
    n = HWB_LOAD_RLX(&c->slot->msg_len);
    if (n > HWB_SHM_MSG) n = HWB_SHM_MSG;
    memcpy(msg, c->slot->msg, n);
    msg[n] = 0;
    return msg;
}

static inline int hwb_shm_errno_rc(int e) {
    if (e == ENOENT || e == ECONNREFUSED) return HWB_SHM_E_NOENT; /* refused: a dead server's socket */
    if (e == EACCES || e == EPERM) return HWB_SHM_E_ACCESS;
    return HWB_SHM_E_SYS;
}

static inline void hwb_shm_detach(hwb_shm_client *c) {
    if (c->slot) munmap(c->slot, c->slot_size);
    if (c->hdr) munmap((void *)c->hdr, c->hdr_size);
    if (c->sock >= 0) close(c->sock); /* the server frees our slot when it sees the hang-up */
    c->hdr = NULL;
    c->slot = NULL;
    c->sock = -1;
}

/* A directory the endpoint may live in: a real directory (fd opened O_NOFOLLOW), owned by
 * the expected user and not writable by group or others. */
static inline int hwb_shm__dir_ok(int fd, unsigned owner_uid) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode)) return HWB_SHM_E_NOT_HWB;
    if (st.st_uid != owner_uid || (st.st_mode & 022)) return HWB_SHM_E_OWNER;
    return 0;
}

static inline int hwb_shm__check_header(const hwb_shm_header *h, size_t size, uint32_t in_count,
                                        uint32_t out_count, unsigned owner_uid, pid_t peer) {
    if (size < HWB_SHM_HEADER_BYTES || h->magic != HWB_SHM_MAGIC) return HWB_SHM_E_NOT_HWB;
    if (h->version != HWB_SHM_VERSION || h->header_bytes != HWB_SHM_HEADER_BYTES)
        return HWB_SHM_E_VERSION;
    if (h->owner_uid != owner_uid || h->server_pid != (int32_t)peer) return HWB_SHM_E_OWNER;
    if (h->dtype != HWB_SHM_DTYPE_F32) return HWB_SHM_E_DTYPE;
    if ((in_count && h->in_count != in_count) || (out_count && h->out_count != out_count))
        return HWB_SHM_E_SHAPE;
    if (h->slot_bytes != hwb_shm_slot_bytes(h->in_count, h->out_count)) return HWB_SHM_E_NOT_HWB;
    return 0;
}

/* Receive the hello and its descriptors; fds[0] header, fds[1] slot (-1 where absent). */
static inline int hwb_shm__recv_hello(hwb_shm_client *c, hwb_shm_hello *hello, int fds[2]) {
    union { struct cmsghdr h; char buf[CMSG_SPACE(2 * sizeof(int))]; } ctl;
    struct iovec iov = {hello, sizeof *hello};
    struct msghdr m;
    struct cmsghdr *cm;
    ssize_t n;
    memset(&m, 0, sizeof m);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl.buf;
    m.msg_controllen = sizeof ctl.buf;
    fds[0] = fds[1] = -1;
    do n = recvmsg(c->sock, &m, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    while (n < 0 && errno == EINTR);
    for (cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            int got[2] = {-1, -1};
            memcpy(got, CMSG_DATA(cm), (k < 2 ? k : 2) * sizeof(int));
            for (size_t i = 0; i < k && i < 2; i++) fds[i] = got[i];
        }
    }
    if (n < 0) {
        c->err = errno;
        return (errno == EAGAIN || errno == EWOULDBLOCK) ? HWB_SHM_E_NOT_RESPONDING : HWB_SHM_E_SYS;
    }
    if ((size_t)n != sizeof *hello || (m.msg_flags & (MSG_CTRUNC | MSG_TRUNC)))
        return HWB_SHM_E_NOT_HWB;
    if (hello->magic != HWB_SHM_MAGIC) return HWB_SHM_E_NOT_HWB;
    if (hello->version != HWB_SHM_VERSION) return HWB_SHM_E_VERSION;
    if (hello->status) return hello->status == HWB_SHM_E_SLOTS_FULL ? HWB_SHM_E_SLOTS_FULL : HWB_SHM_E_NOT_HWB;
    if (fds[0] < 0 || fds[1] < 0) return HWB_SHM_E_NOT_HWB;
    return 0;
}

static inline void *hwb_shm__map(int fd, size_t want, int prot, size_t *size) {
    struct stat st;
    void *p;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size < want) return NULL;
    p = mmap(NULL, (size_t)st.st_size, prot, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return NULL;
    *size = (size_t)st.st_size;
    return p;
}

/* Attach to endpoint `name` of user `owner_uid` (use geteuid() for your own): connect, check
 * who serves it, map the header (read-only) and this client's own slot. in_count/out_count:
 * the float32 counts the caller will use (0: accept the server's). Returns 0 or a negative
 * HWB_SHM_E_* status; on failure nothing stays open. */
static inline int hwb_shm_attach_as(hwb_shm_client *c, const char *name, unsigned owner_uid,
                                    uint32_t in_count, uint32_t out_count) {
    char root[4096];
    struct sockaddr_un addr;
    hwb_shm_ucred cred;
    socklen_t clen = sizeof cred;
    hwb_shm_hello hello;
    int rootfd = -1, dirfd = -1, fds[2] = {-1, -1}, rc, k;
    memset(c, 0, sizeof *c);
    c->sock = -1;
    c->slot_index = -1;
    c->spin_ns = 50000;
    c->timeout_ns = 5000000000LL;
    if (!hwb_shm_name_ok(name)) return HWB_SHM_E_NAME;
    if ((rc = hwb_shm_root_dir(root, sizeof root, owner_uid))) return rc;
    /* StrictModes: the root and the endpoint directory are the owner's and nobody else can
     * put anything in them; opened once (O_NOFOLLOW) and used through the fd */
    rootfd = open(root, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (rootfd < 0) { c->err = errno; rc = errno == ELOOP || errno == ENOTDIR ? HWB_SHM_E_OWNER : hwb_shm_errno_rc(errno); goto fail; }
    if ((rc = hwb_shm__dir_ok(rootfd, owner_uid))) goto fail;
    dirfd = openat(rootfd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dirfd < 0) { c->err = errno; rc = errno == ELOOP || errno == ENOTDIR ? HWB_SHM_E_OWNER : hwb_shm_errno_rc(errno); goto fail; }
    if ((rc = hwb_shm__dir_ok(dirfd, owner_uid))) goto fail;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    k = snprintf(addr.sun_path, sizeof addr.sun_path, "/proc/self/fd/%d/sock", dirfd);
    if (k < 0 || (size_t)k >= sizeof addr.sun_path) { rc = HWB_SHM_E_NAME; goto fail; }
    c->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->sock < 0) { c->err = errno; rc = HWB_SHM_E_SYS; goto fail; }
    if (connect(c->sock, (struct sockaddr *)&addr, sizeof addr) != 0) {
        c->err = errno;
        rc = hwb_shm_errno_rc(errno);
        goto fail;
    }
    close(dirfd);
    close(rootfd);
    dirfd = rootfd = -1;
    /* the kernel's word on who is listening: a socket another user planted is refused */
    if (getsockopt(c->sock, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) { c->err = errno; rc = HWB_SHM_E_SYS; goto fail; }
    if (cred.uid != owner_uid) { rc = HWB_SHM_E_OWNER; goto fail; }
    {
        struct timeval tv;
        tv.tv_sec = (time_t)(c->timeout_ns / 1000000000LL);
        tv.tv_usec = (suseconds_t)((c->timeout_ns % 1000000000LL) / 1000);
        setsockopt(c->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    if ((rc = hwb_shm__recv_hello(c, &hello, fds))) goto fail;
    c->hdr = (const hwb_shm_header *)hwb_shm__map(fds[0], HWB_SHM_HEADER_BYTES, PROT_READ, &c->hdr_size);
    if (!c->hdr) { rc = HWB_SHM_E_NOT_HWB; goto fail; }
    if ((rc = hwb_shm__check_header(c->hdr, c->hdr_size, in_count, out_count, owner_uid, cred.pid)))
        goto fail;
    if (hello.slot_bytes != c->hdr->slot_bytes) { rc = HWB_SHM_E_NOT_HWB; goto fail; }
    c->slot = (hwb_shm_slot *)hwb_shm__map(fds[1], c->hdr->slot_bytes, PROT_READ | PROT_WRITE, &c->slot_size);
    if (!c->slot) { rc = HWB_SHM_E_NOT_HWB; goto fail; }
    close(fds[0]);
    close(fds[1]);
    /* non-blocking from now on: a doorbell byte that does not fit means one is pending */
    fcntl(c->sock, F_SETFL, fcntl(c->sock, F_GETFL) | O_NONBLOCK);
    c->slot_index = (int)hello.slot_index;
    c->in = hwb_shm_slot_in(c->slot);
    c->in_count = c->hdr->in_count;
    c->out_count = c->hdr->out_count;
    c->out = c->in + c->in_count;
    c->streams = c->hdr->sliding ? c->hdr->streams : 0u;
    c->server_pid = (int32_t)cred.pid;
    c->seq = 0;
    return 0;
fail:
    if (fds[0] >= 0) close(fds[0]);
    if (fds[1] >= 0) close(fds[1]);
    if (dirfd >= 0) close(dirfd);
    if (rootfd >= 0) close(rootfd);
    hwb_shm_detach(c);
    return rc;
}

static inline int hwb_shm_attach(hwb_shm_client *c, const char *name, uint32_t in_count,
                                 uint32_t out_count) {
    return hwb_shm_attach_as(c, name, (unsigned)geteuid(), in_count, out_count);
}

/* The server is running and its end of our connection is open (it never writes after the
 * hello, so readable means end-of-file). */
static inline int hwb_shm_server_alive(hwb_shm_client *c) {
    struct pollfd p;
    if (HWB_LOAD_ACQ(&c->hdr->state) != HWB_SHM_STATE_RUNNING) return 0;
    p.fd = c->sock;
    p.events = POLLIN | POLLRDHUP;
    p.revents = 0;
    return poll(&p, 1, 0) == 0;
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

static inline void hwb_shm__ring(hwb_shm_client *c) {
    HWB_FENCE(); /* pairs with the server's fence between server_sleeping = 1 and its scan */
    if (HWB_LOAD_RLX(&c->hdr->server_sleeping)) {
        char b = 1;
        ssize_t n = send(c->sock, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)n; /* EAGAIN: bytes are already pending, the server wakes anyway */
    }
}

/* One request for `stream` (0 unless the endpoint is sliding) with flags (HWB_SHM_FLAG_*; 0
 * for a plain call): in[n_in] → out[n_out]. deadline_ns: relative budget (≤ 0: none, the
 * client's timeout_ns applies). Returns HWB_SHM_OK (out written) or another status; out is
 * untouched unless the status is HWB_SHM_OK. n_in 0 with HWB_SHM_FLAG_RESET: a reset alone
 * (out untouched). The server checks `stream` (BAD_INPUT, with the range, when out of it). */
static inline int hwb_shm_call_stream(hwb_shm_client *c, uint32_t stream, const float *in,
                                      uint32_t n_in, float *out, uint32_t n_out,
                                      int64_t deadline_ns, uint32_t flags) {
    hwb_shm_slot *s = c->slot;
    int64_t t0, until;
    uint32_t seq, st;
    int rc;
    int reset_only = n_in == 0 && (flags & HWB_SHM_FLAG_RESET);
    if (!s) return HWB_SHM_E_CLOSED;
    if ((!reset_only && n_in != c->in_count) || n_out != c->out_count) return HWB_SHM_E_SHAPE;
    t0 = hwb_now_ns();
    until = deadline_ns > 0 ? t0 + deadline_ns : t0 + c->timeout_ns;
    if (n_in) memcpy(c->in, in, (size_t)n_in * 4u);
    HWB_STORE_RLX(&s->flags, flags);
    HWB_STORE_RLX(&s->stream, stream);
    HWB_STORE_RLX(&s->in_count, n_in);
    HWB_STORE_RLX(&s->deadline_ns, deadline_ns > 0 ? until : (int64_t)0);
    /* one past what stands in req: never the sequence the server answered last, even after
     * a timed-out call or a stray write (then at most this one call times out) */
    seq = HWB_LOAD_RLX(&s->req) + 1u;
    if (seq == HWB_LOAD_RLX(&s->resp)) seq++;
    HWB_STORE_REL(&s->req, seq); /* publishes the payload above */
    c->seq = seq;
    hwb_shm__ring(c);
    if ((rc = hwb_shm__wait(c, seq, until))) return rc;
    st = HWB_LOAD_RLX(&s->status);
    if (st == HWB_SHM_OK && !reset_only) memcpy(out, c->out, (size_t)n_out * 4u);
    return (int)st;
}

/* hwb_shm_call_stream on stream 0. */
static inline int hwb_shm_call(hwb_shm_client *c, const float *in, uint32_t n_in, float *out,
                               uint32_t n_out, int64_t deadline_ns, uint32_t flags) {
    return hwb_shm_call_stream(c, 0u, in, n_in, out, n_out, deadline_ns, flags);
}

/* One sample (a whole input, or one tick of a sliding endpoint's stream 0): hwb_shm_call
 * without flags. */
static inline int hwb_shm_predict(hwb_shm_client *c, const float *in, uint32_t n_in, float *out,
                                  uint32_t n_out, int64_t deadline_ns) {
    return hwb_shm_call(c, in, n_in, out, n_out, deadline_ns, 0u);
}

/* Sliding endpoints: one tick (in_count floats) into this client's window `stream` (0 ..
 * c->streams-1, e.g. one per symbol), its answer (out_count floats) into y. */
static inline int hwb_shm_push(hwb_shm_client *c, uint32_t stream, const float *x, float *y,
                               int64_t deadline_ns) {
    return hwb_shm_call_stream(c, stream, x, c->in_count, y, c->out_count, deadline_ns, 0u);
}

/* Sliding endpoints: empty this client's window `stream` (a new session or day); its next
 * tick's answer is the model on [0, ..., 0, x]. Every window of a new connection is empty. */
static inline int hwb_shm_reset_stream(hwb_shm_client *c, uint32_t stream, int64_t deadline_ns) {
    float none = 0.0f;
    return hwb_shm_call_stream(c, stream, &none, 0u, &none, c->out_count, deadline_ns,
                               HWB_SHM_FLAG_RESET);
}

/* hwb_shm_reset_stream on stream 0. */
static inline int hwb_shm_reset(hwb_shm_client *c, int64_t deadline_ns) {
    return hwb_shm_reset_stream(c, 0u, deadline_ns);
}

#ifdef __cplusplus
}
#endif
#endif /* HWB_SHM_H */
