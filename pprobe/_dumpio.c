/* pprobe._dumpio: the native half of dump mode and statistics (pprobe/dumps.py, pprobe/stats.py
 * hold the pure-Python twins with the same contract).
 *
 * - A dump queue: the program's thread copies the bytes it dumps (values at call time) into
 *   one malloc'd block with the .npy header and queues it; a native thread, which never takes
 *   the GIL, creates the file under a hidden temporary name relative to the run folder's
 *   descriptor (O_CREAT|O_EXCL|O_NOFOLLOW, 0600), writes it and renames it into place. A dump
 *   whose content was written before becomes a hard link to the first file. The queue's memory
 *   is bounded; when it is full the caller waits (GIL released) or skips, as it asks.
 * - A content hash (128 bits, two multiply-rotate lanes sets) to find repeated contents.
 * - Statistics in one pass over memory for contiguous arrays of the common numeric types:
 *   min, max, mean and std over finite values, NaN and inf counts. Blocks of 2048 values are
 *   summed twice while they are in cache (mean, then squared deviations), and blocks are
 *   combined with Chan's formula, so the result is as exact as a two-pass float64 reduction.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/uio.h>

#define DUMPIO_API 11

/* ------------------------------------------------------------------ the queue */
typedef struct Job {
    struct Job *next;
    char *name;  /* final file name in the run folder */
    char *link;  /* NULL: write data; else an existing file to hard-link */
    char *data;  /* header + array bytes */
    size_t len;
    int pack;    /* append to this process's pack (pprobe/packs.py) instead of a file */
    int err;     /* the worker's outcome: 0 or an errno */
    int has_dg;  /* dg is the XXH3-128 digest of data[hlen..len): a version 2 pack entry */
    int written; /* its file was written with the batch's large files (write_large) */
    uint32_t hlen;
    unsigned char dg[16];
    void *block; /* the block to free: the job itself, or its data's page-aligned start */
    size_t cap;  /* the block's capacity where it is pooled (pool_take), else 0 */
} Job; /* one malloc'd block: the job, then its data, its name and its link (dq_submit); a
        * dump of POOL_MIN bytes and more has a pooled block (pool_take) that starts with its
        * data instead, page-aligned, then the job, its name and its link */

typedef struct Failure {
    struct Failure *next;
    char *name;
    int err;
} Failure;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv_work = PTHREAD_COND_INITIALIZER;
static pthread_cond_t cv_done = PTHREAD_COND_INITIALIZER;
static Job *q_head = NULL, *q_tail = NULL;
static Job *q_busy = NULL; /* the batch the worker is writing now, taken off the queue */
static size_t q_bytes = 0, q_max = 64u << 20;
static uint64_t n_submitted = 0, n_completed = 0, n_files = 0, n_links = 0, n_failed = 0;
static uint64_t bytes_written = 0;
static int dirfd_ = -1;
static int running = 0, stopping = 0, idle = 0;
static int held = 0; /* (tests: hold()) the worker takes no job until released */
static pthread_t thread;
static Failure *failures = NULL;

/* ------------------------------------------------------------------ packs (pprobe/packs.py)
 * Small dumps are appended to <run>/.packs/{host}-{pid}-{k}.npk, one entry each: a 24-byte
 * header (b"PPKE", version 1, kind 0 data / 1 alias, u16 name length, u64 payload length,
 * crc32 of those 16 bytes + name + payload, u32 0), the seed name, the payload. Version 2
 * (a job submitted with the array's XXH3-128 digest, which the program's thread took to find
 * contents seen before): the u32 is hlen, the crc32 covers the 16 bytes, hlen, the name, the
 * digest and the payload's first hlen bytes (the .npy header), and the digest follows the
 * name; the array's bytes are then written without being read here first. Only the worker
 * thread touches the pack. */
#define PACK_MAX (1ull << 30)
/* iovecs per writev call (IOV_MAX is 1024 on Linux) */
#define IOV_BATCH 1024
static int pack_fd = -1;      /* worker only */
static uint64_t pack_size = 0; /* worker only */
/* Where the pack's preallocated blocks end (worker only; see pack_reserve) */
static uint64_t pack_alloc = 0;
static int prealloc_off = 0; /* the file system refused a preallocation: none any more */
static unsigned pack_k = 0;    /* worker only */
static unsigned pack_gen = 0;  /* the dirfd generation the pack was opened for */
static unsigned dir_gen = 0;   /* bumped by open() (with mu held) */
static char pack_host[72] = "host";
/* zlib's CRC-32 (polynomial 0xEDB88320, reflected), two implementations giving the same
 * values: slicing by 8 (eight tables, eight bytes a step: ~6x the byte-wise loop), and, on
 * x86-64 CPUs with PCLMULQDQ and SSE4.1, carry-less multiplication folding (below). The pack
 * writer checksums every byte it appends. */
static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

/* the register c (zlib's value, complemented) after the n bytes at p, by the tables */
static uint32_t crc32_tables(uint32_t c, const unsigned char *p, size_t n) {
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
            crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
            crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#include <wmmintrin.h>
#define CRC_CLMUL 1
static int g_clmul = 0; /* the CPU has PCLMULQDQ and SSE4.1 (set when the module loads) */
/* Shorter inputs take the tables: the folding's fixed cost (one or two folds and the final
 * reduction, ~11 ns on a Zen 4 core) is that of the tables' on 24 to 31 bytes. */
#ifndef CRC_CLMUL_MIN
#define CRC_CLMUL_MIN 32
#endif

/* Folding (Intel, "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ
 * Instruction", 2009), for the reflected polynomial. Bit i of a little-endian 128-bit load
 * is the coefficient of x^(127-i) of that block; a carry-less product of two 64-bit halves
 * read that way is the product times x. The register c, xored into the first 32 bits of the
 * message, makes the CRC that of a message starting from 0: c' = M(x) x^32 mod P(x).
 * A block X = A x^64 + B (A: its low half) followed by D more bits counts as
 * X x^D = A x^(D+64) + B x^D; with the constants K(e) = (x^e mod P) bit-reversed over 33 bits
 * (coefficient j at bit 32-j, i.e. times x^31 in the 64-bit reading), clmul(A, K(D+32)) and
 * clmul(B, K(D-32)) are congruent to those two terms and fit 127 bits, so they are xored
 * into the block D bits later. Four registers fold 512 bits ahead at a time, then are folded
 * into one 128 bits at a time; then X x^32 is reduced to 96 bits (K(96)), to 64 (K(64)),
 * and to 32 by Barrett's reduction with mu = x^64 div P and P itself (both reversed over 33
 * bits). The constants were computed with polynomial arithmetic over GF(2) (x^e mod P,
 * x^64 div P) and checked with a bit-exact Python model of these steps against zlib.crc32;
 * tests/test_crc32.py compares this code with zlib. */
#define K_544 0x154442bd4ull /* x^(512+32) mod P: folds 512 bits, the low half */
#define K_480 0x1c6e41596ull /* x^(512-32) mod P: folds 512 bits, the high half */
#define K_160 0x1751997d0ull /* x^(128+32) mod P: folds 128 bits, the low half */
#define K_96 0x0ccaa009eull  /* x^(128-32) mod P: folds 128 bits, the high half; 128 -> 96 */
#define K_64 0x163cd6124ull  /* x^64 mod P: 96 -> 64 bits */
#define K_MU 0x1f7011641ull  /* x^64 div P (Barrett) */
#define K_P 0x1db710641ull   /* P */

/* x folded 128 * k bits ahead (the constants in the low and high halves of k) */
__attribute__((target("pclmul,sse4.1"))) static inline __m128i clmul_fold(__m128i x, __m128i k) {
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

/* pshufb masks: the 16 bytes at crc_shift + r move a block 16 - r bytes up, zeros below */
static const unsigned char crc_shift[32] = {
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* the register c after the n >= 16 bytes at p (any alignment). When n is not a multiple of
 * 16, the message is read as if preceded by 16 - n % 16 zero bytes (leading zeros leave a
 * CRC from 0 unchanged; c is xored into the message's first 4 bytes, wherever they are):
 * the first block is the first n % 16 bytes moved up (pshufb), the next starts at p + n % 16.
 */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc32_clmul(uint32_t c,
                                                                   const unsigned char *p,
                                                                   size_t n) {
    const __m128i k512 = _mm_set_epi64x((long long)K_480, (long long)K_544);
    const __m128i k128 = _mm_set_epi64x((long long)K_96, (long long)K_160);
    size_t r = n & 15;
    __m128i x0 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)c));
    if (r) {
        x0 = _mm_shuffle_epi8(x0, _mm_loadu_si128((const __m128i *)(crc_shift + r)));
        __m128i x1 = _mm_loadu_si128((const __m128i *)(p + r));
        if (r < 4) x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)(c >> (8 * r))));
        x0 = _mm_xor_si128(clmul_fold(x0, k128), x1);
        p += r;
        n -= r;
    }
    p += 16;
    n -= 16;
    /* x0: the first block (the earlier ones folded in); n bytes follow, a multiple of 16 */
    if (n >= 112) { /* four registers fold 512 bits at a time */
        __m128i x1 = _mm_loadu_si128((const __m128i *)p);
        __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 16));
        __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 32));
        p += 48;
        n -= 48;
        do {
            x0 = _mm_xor_si128(clmul_fold(x0, k512), _mm_loadu_si128((const __m128i *)p));
            x1 = _mm_xor_si128(clmul_fold(x1, k512), _mm_loadu_si128((const __m128i *)(p + 16)));
            x2 = _mm_xor_si128(clmul_fold(x2, k512), _mm_loadu_si128((const __m128i *)(p + 32)));
            x3 = _mm_xor_si128(clmul_fold(x3, k512), _mm_loadu_si128((const __m128i *)(p + 48)));
            p += 64;
            n -= 64;
        } while (n >= 64);
        x1 = _mm_xor_si128(clmul_fold(x0, k128), x1);
        x2 = _mm_xor_si128(clmul_fold(x1, k128), x2);
        x0 = _mm_xor_si128(clmul_fold(x2, k128), x3);
    }
    for (; n >= 16; p += 16, n -= 16)
        x0 = _mm_xor_si128(clmul_fold(x0, k128), _mm_loadu_si128((const __m128i *)p));
    /* x0 = A x^64 + B; the CRC register is x0 x^32 mod P. 128 -> 96 bits: A x^96 + B x^32,
     * i.e. clmul(A, K(96)) + B x^32, both times x^32 in v's reading (v's bits 0..95) */
    const __m128i kr = _mm_set_epi64x((long long)K_64, (long long)K_96);
    const __m128i lo32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i v = _mm_xor_si128(_mm_clmulepi64_si128(x0, kr, 0x00), _mm_srli_si128(x0, 8));
    /* 96 -> 64 bits: the top 32 (v's low dword) times x^64 (K(64)) plus the 64 others (v
     * shifted down 4 bytes), in the low half of w (read as the low half of a load) */
    __m128i w = _mm_xor_si128(_mm_srli_si128(v, 4),
                              _mm_clmulepi64_si128(_mm_and_si128(v, lo32), kr, 0x10));
    /* Barrett, Z the low half of w: q = ((Z div x^32) mu) div x^32 (t's low dword), and
     * Z + q P = Z mod P: the register, in w's bits 32..63 */
    const __m128i kb = _mm_set_epi64x((long long)K_MU, (long long)K_P);
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(w, lo32), kb, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, lo32), kb, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(w, t), 1);
}
#endif

/* zlib's crc32: crc32_update(crc, p, n) continues crc; portable: the tables only */
static uint32_t crc32_any(uint32_t crc, const unsigned char *p, size_t n, int portable) {
    uint32_t c = ~crc;
#ifdef CRC_CLMUL
    if (g_clmul && !portable && n >= CRC_CLMUL_MIN) return ~crc32_clmul(c, p, n);
#else
    (void)portable;
#endif
    return ~crc32_tables(c, p, n);
}

static uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) {
    return crc32_any(crc, p, n, 0);
}

static void put_le(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* create this process's next pack; the fd or -1 with errno set */
static int open_pack(int dfd) {
    if (mkdirat(dfd, ".packs", 0700) < 0 && errno != EEXIST) return -1;
    int pd = openat(dfd, ".packs", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (pd < 0) return -1;
    int fd = -1;
    char name[160];
    for (int tries = 0; tries < 1 << 20; tries++) {
        snprintf(name, sizeof name, "%s-%ld-%u.npk", pack_host, (long)getpid(), pack_k++);
        fd = openat(pd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_APPEND,
                    0600);
        if (fd >= 0 || errno != EEXIST) break;
    }
    int e = errno;
    close(pd);
    errno = e;
    return fd;
}

/* Blocks allocated ahead of the pack's end, PREALLOC bytes at a time, beyond its size
 * (FALLOC_FL_KEEP_SIZE: readers see the same file): ext4 then skips the delayed allocation's
 * per-page reservations, and a buffered append costs ~30 % less CPU (0.24 -> 0.17 ms per MB
 * here). What is left unwritten is given back when the pack is closed (pack_trim); a killed
 * process leaves at most PREALLOC of them past a pack's end (its size stays right). */
#define PREALLOC (4u << 20)
static void pack_reserve(uint64_t end) {
#if defined(__linux__) && defined(FALLOC_FL_KEEP_SIZE)
    if (prealloc_off || end <= pack_alloc) return;
    uint64_t to = (end + PREALLOC - 1) / PREALLOC * PREALLOC;
    if (to > PACK_MAX + PREALLOC) to = end;
    if (fallocate(pack_fd, FALLOC_FL_KEEP_SIZE, (off_t)pack_alloc, (off_t)(to - pack_alloc)) == 0)
        pack_alloc = to;
    else if (errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL)
        prealloc_off = 1; /* tmpfs before 3.5, NFS, ...: buffered appends as they were */
    /* ENOSPC and others: the write itself says what happens */
#else
    (void)end;
#endif
}

/* the preallocated blocks past the pack's end given back (worker only) */
static void pack_trim(void) {
    if (pack_fd >= 0 && pack_alloc > pack_size && ftruncate(pack_fd, (off_t)pack_size) == 0)
        pack_alloc = pack_size;
}

/* the pack to append to, opened (or rotated) as needed; 0 or an errno */
static int pack_ready(int dfd, unsigned gen) {
    if (pack_fd >= 0 && (gen != pack_gen || pack_size >= PACK_MAX)) {
        pack_trim();
        close(pack_fd);
        pack_fd = -1;
    }
    if (pack_fd < 0) {
        pack_fd = open_pack(dfd);
        if (pack_fd < 0) return errno ? errno : EIO;
        pack_size = pack_alloc = 0;
        pack_gen = gen;
    }
    return 0;
}

/* an entry's 24-byte head (kind 0: data, 1: alias), its CRC over head, name and payload;
 * dg (not NULL): a version 2 entry, the CRC over head, hlen, name, dg and payload[0..hlen) */
static void entry_head(unsigned char head[24], int kind, const char *name, size_t nl,
                       const char *payload, size_t plen, const unsigned char *dg, uint32_t hlen) {
    memcpy(head, "PPKE", 4);
    head[4] = dg ? 2 : 1;
    head[5] = (unsigned char)kind;
    put_le(head + 6, nl, 2);
    put_le(head + 8, plen, 8);
    put_le(head + 20, dg ? hlen : 0, 4);
    uint32_t crc = crc32_update(0, head, 16);
    if (dg) crc = crc32_update(crc, head + 20, 4);
    crc = crc32_update(crc, (const unsigned char *)name, nl);
    if (dg) crc = crc32_update(crc, dg, 16);
    crc = crc32_update(crc, (const unsigned char *)payload, dg ? hlen : plen);
    put_le(head + 16, crc, 4);
}

/* writev all of iov[0..cnt) to the pack (it moves iov's bases); 0 or an errno, after which
 * the pack is cut back to pack_size (or given up) so that no partial entry precedes later
 * ones */
static int pack_writev(struct iovec *iov, int cnt, size_t left) {
    int i = 0;
    pack_reserve(pack_size + left);
    while (left) {
        int c = cnt - i > IOV_BATCH ? IOV_BATCH : cnt - i;
        ssize_t w = writev(pack_fd, iov + i, c);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int err = w < 0 ? errno : ENOSPC;
            if (ftruncate(pack_fd, (off_t)pack_size) < 0) {
                close(pack_fd);
                pack_fd = -1;
            } else {
                pack_alloc = pack_size; /* the cut gave the preallocated blocks back */
            }
            return err;
        }
        left -= (size_t)w;
        while (i < cnt && (size_t)w >= iov[i].iov_len) {
            w -= (ssize_t)iov[i].iov_len;
            i++;
        }
        if (i < cnt) {
            iov[i].iov_base = (char *)iov[i].iov_base + w;
            iov[i].iov_len -= (size_t)w;
        }
    }
    return 0;
}

/* Append one entry (kind 0: data, 1: alias) to the pack; 0 or an errno. A failed append is
 * cut off (or the pack given up) so that no partial entry precedes later ones. */
static int append_entry(int dfd, unsigned gen, int kind, const char *name, const char *payload,
                        size_t plen, const unsigned char *dg, uint32_t hlen) {
    int err = pack_ready(dfd, gen);
    if (err) return err;
    size_t nl = strlen(name);
    unsigned char head[24];
    entry_head(head, kind, name, nl, payload, plen, dg, hlen);
    struct iovec iov[4];
    int cnt = 0;
    iov[cnt++] = (struct iovec){head, 24};
    iov[cnt++] = (struct iovec){(void *)name, nl};
    if (dg) iov[cnt++] = (struct iovec){(void *)dg, 16};
    if (plen) iov[cnt++] = (struct iovec){(void *)payload, plen};
    size_t total = 24 + nl + (dg ? 16 : 0) + plen;
    err = pack_writev(iov, cnt, total);
    if (!err) pack_size += total;
    return err;
}

static int pack_entry_failed(const char *name);
static void note_pack_failure(const char *name);

/* One pack job appended by itself: an alias to an entry that failed before fails (ENOENT),
 * as a hard link to a file never written does; a failed entry is noted. Its err is set. */
static void append_job(int dfd, unsigned gen, Job *j) {
    j->err = j->link ? (pack_entry_failed(j->link)
                            ? ENOENT
                            : append_entry(dfd, gen, 1, j->name, j->link, strlen(j->link),
                                           NULL, 0))
                     : append_entry(dfd, gen, 0, j->name, j->data, j->len,
                                    j->has_dg ? j->dg : NULL, j->hlen);
    if (j->err) note_pack_failure(j->name);
}

/* The pack jobs from j on (up to GROUP_MAX of them, not past PACK_MAX): their entries in one
 * writev. Each job's err is set; the first job after them is returned. An alias to an entry
 * that failed before fails (ENOENT). When the grouped write fails, the group's entries are
 * appended one by one instead (append_entry's outcome for each, as without grouping). */
#define GROUP_MAX 64
static Job *append_group(int dfd, unsigned gen, Job *j) {
    Job *jobs[GROUP_MAX];
    unsigned char heads[GROUP_MAX][24];
    struct iovec iov[4 * GROUP_MAX];
    int n = 0, cnt = 0;
    size_t total = 0;
    int err = pack_ready(dfd, gen);
    if (err) { /* no pack to append to: this job fails (the next one tries again) */
        j->err = err;
        note_pack_failure(j->name);
        return j->next;
    }
    for (; j && j->pack && n < GROUP_MAX && (!n || pack_size + total < PACK_MAX); j = j->next) {
        const char *payload = j->link ? j->link : j->data;
        size_t plen = j->link ? strlen(j->link) : j->len;
        if (j->link && pack_entry_failed(j->link)) {
            j->err = ENOENT;
            note_pack_failure(j->name);
            continue;
        }
        size_t nl = strlen(j->name);
        const unsigned char *dg = !j->link && j->has_dg ? j->dg : NULL;
        entry_head(heads[n], j->link ? 1 : 0, j->name, nl, payload, plen, dg, j->hlen);
        iov[cnt++] = (struct iovec){heads[n], 24};
        iov[cnt++] = (struct iovec){j->name, nl};
        if (dg) iov[cnt++] = (struct iovec){(void *)dg, 16};
        if (plen) iov[cnt++] = (struct iovec){(void *)payload, plen};
        total += 24 + nl + (dg ? 16 : 0) + plen;
        jobs[n++] = j;
    }
    if (!n) return j;
    if (!pack_writev(iov, cnt, total)) { /* (each job's err is still 0) */
        pack_size += total;
        return j;
    }
    /* the group's write failed (and was cut off): its entries one by one */
    for (int k = 0; k < n; k++) append_job(dfd, gen, jobs[k]);
    return j;
}

/* Pack entries that failed to append (FNV-1a hashes of their names; worker only): an alias
 * to one of them fails too, as a hard link to a file never written does (its row then says
 * "not dumped" instead of naming an entry that is not there). Failures are rare: a list. */
static uint64_t *pack_failed = NULL;
static size_t n_pack_failed = 0, cap_pack_failed = 0;

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ULL;
    return h;
}

static int pack_entry_failed(const char *name) {
    uint64_t h = name_hash(name);
    for (size_t i = 0; i < n_pack_failed; i++)
        if (pack_failed[i] == h) return 1;
    return 0;
}

static void note_pack_failure(const char *name) {
    if (n_pack_failed == cap_pack_failed) {
        size_t cap = cap_pack_failed ? 2 * cap_pack_failed : 64;
        uint64_t *p = realloc(pack_failed, cap * sizeof *p);
        if (!p) return;
        pack_failed = p;
        cap_pack_failed = cap;
    }
    pack_failed[n_pack_failed++] = name_hash(name);
}

/* ------------------------------------------------------------------ block pool
 * A dump's block of POOL_MIN bytes and more is kept when its job is done, up to pool_max
 * bytes in all (half the queue's memory), and handed to the next dump of its size class:
 * a block taken fresh from the C library comes as pages the kernel (or a VM's host) must
 * hand out and zero on first touch, which makes the program thread's copy into it ~10x
 * slower than into pages used a moment ago (1 MB: ~480 against ~40 us on a 2-core VM). A
 * class is an eighth of a power of two (a block is at most 1/8 larger than asked for); the
 * pooled blocks are page-aligned (the data first: DIRECT_MIN files may go O_DIRECT). The
 * kept blocks are given back when the writer stops (close()), and dropped in a forked
 * child (the parent's). */
#define POOL_MIN (32u << 10)
#define DIRECT_ALIGN 4096u /* (O_DIRECT's alignment: see "direct writes") */
#define POOL_CLASSES 512
typedef struct PoolBlk {
    struct PoolBlk *next;
} PoolBlk;
static pthread_mutex_t pmu = PTHREAD_MUTEX_INITIALIZER;
static PoolBlk *pool[POOL_CLASSES];
static size_t pool_bytes = 0, pool_max = 32u << 20;
static uint64_t pool_hits = 0, pool_misses = 0; /* (tests, meta.json) */

/* the class of a block of `size` bytes (>= POOL_MIN) and its capacity in *cap */
static int pool_class(size_t size, size_t *cap) {
    int o = 63 - __builtin_clzll((unsigned long long)size); /* 2^o <= size < 2^(o+1) */
    size_t step = (size_t)1 << (o - 3);
    size_t k = (size - ((size_t)1 << o) + step - 1) / step; /* 0..8 eighths above 2^o */
    if (k == 8) { /* (2^(o+1): the next octave's first class) */
        o++;
        k = 0;
    }
    *cap = ((size_t)1 << o) + k * ((size_t)1 << (o - 3));
    int c = (o - 15) * 8 + (int)k; /* POOL_MIN = 2^15 */
    return c >= 0 && c < POOL_CLASSES ? c : -1;
}

/* a page-aligned block of at least `size` bytes (*cap: its capacity; 0 when not pooled) */
static void *pool_take(size_t size, size_t *cap) {
    *cap = 0;
    size_t c_cap = 0;
    int c = size >= POOL_MIN ? pool_class(size, &c_cap) : -1;
    void *blk = NULL;
    if (c >= 0) {
        pthread_mutex_lock(&pmu);
        size_t most = pool_max;
        PoolBlk *b = pool[c];
        if (b) {
            pool[c] = b->next;
            pool_bytes -= c_cap;
            pool_hits++;
        } else {
            pool_misses++;
        }
        pthread_mutex_unlock(&pmu);
        if (b) {
            *cap = c_cap;
            return b;
        }
        if (c_cap <= most) /* (a block too large to keep is not rounded up) */
            size = c_cap;
        else
            c = -1;
    }
    if (posix_memalign(&blk, DIRECT_ALIGN, size)) return NULL;
    *cap = c >= 0 ? c_cap : 0;
    return blk;
}

/* the block back: kept while the pool has room, else freed */
static void pool_give(void *blk, size_t cap) {
    size_t c_cap = 0;
    int c = cap >= POOL_MIN ? pool_class(cap, &c_cap) : -1;
    if (c >= 0 && c_cap == cap) {
        pthread_mutex_lock(&pmu);
        if (pool_bytes + cap <= pool_max) {
            PoolBlk *b = blk;
            b->next = pool[c];
            pool[c] = b;
            pool_bytes += cap;
            blk = NULL;
        }
        pthread_mutex_unlock(&pmu);
    }
    free(blk); /* (free(NULL): nothing) */
}

/* every kept block freed (drop: the forked child's, whose lock may be the parent's) */
static void pool_clear(int drop) {
    if (!drop) pthread_mutex_lock(&pmu);
    for (int c = 0; c < POOL_CLASSES; c++) {
        PoolBlk *b = pool[c];
        pool[c] = NULL;
        while (b) {
            PoolBlk *n = b->next;
            free(b);
            b = n;
        }
    }
    pool_bytes = 0;
    if (!drop) pthread_mutex_unlock(&pmu);
}

static void free_job(Job *j) {
    if (j->cap) /* (name, link and data are in its block) */
        pool_give(j->block, j->cap);
    else
        free(j->block);
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (w == 0) {
            errno = ENOSPC;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* a worker's batch: at most this many jobs, or this many bytes (but at least one job) */
#define BATCH_JOBS 256
#define BATCH_BYTES (8u << 20)

/* the hidden temporary name a file is written under before its rename (malloc'd), or NULL */
static char *tmp_name(const char *name) {
    size_t nl = strlen(name);
    char *tmp = malloc(nl + 6);
    if (tmp) {
        tmp[0] = '.';
        memcpy(tmp + 1, name, nl);
        memcpy(tmp + 1 + nl, ".tmp", 5);
    }
    return tmp;
}

/* Create `name` in the run folder with `data`: temporary name, then rename. 0 or an errno. */
static int write_file(int dfd, const char *name, const char *data, size_t len) {
    char *tmp = tmp_name(name);
    if (!tmp) return ENOMEM;
    int err = 0;
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        err = errno;
    } else {
        if (write_all(fd, data, len) < 0) err = errno;
        if (close(fd) < 0 && !err) err = errno;
        if (!err && renameat(dfd, tmp, dfd, name) < 0) err = errno;
        if (err) unlinkat(dfd, tmp, 0);
    }
    free(tmp);
    return err;
}

/* ------------------------------------------------------------------ direct writes
 * A large dump (DIRECT_MIN bytes and more, a file of its own) can be written with O_DIRECT
 * from its page-aligned block: the device reads the bytes where the program's thread copied
 * them, with no copy into the page cache and little CPU. Which way is faster depends on the
 * page cache's state: into pages the kernel (or a VM's host) has not handed out lately, a
 * buffered copy runs at a few hundred MB/s a thread, below the device's speed; into warm
 * pages it runs at several GB/s, above it. So with PPROBE_DUMP_DIRECT=auto (the default), of
 * the two threads that write a batch's large files (write_large), the helper writes with
 * O_DIRECT, and the worker goes the way whose recent files took less time a byte (the
 * helper's included), trying the other way again after DIRECT_RETRY files, twice as many
 * each time it is still the slower (a batch with one large file is the worker's alone).
 * Each takes the next file when it is done, so the faster way writes more of them. `on`:
 * both with O_DIRECT; `off`: both through the page cache. A folder whose file system refuses
 * O_DIRECT (EINVAL: tmpfs before Linux 6.6, some FUSE mounts) gets buffered writes from then
 * on. A file's whole pages are written with O_DIRECT, its last partial page through the page
 * cache (O_DIRECT cleared on the descriptor), under its temporary name: it is renamed only
 * once whole, as buffered ones are. */
#define DIRECT_MIN PAR_MIN
#define DIRECT_RETRY 16 /* files, doubled each time the other way is still slower */
#define DIRECT_RETRY_MAX 512
enum { DIRECT_OFF = 0, DIRECT_AUTO = 1, DIRECT_ON = 2 };
/* under hmu: the setting, whether the folder takes O_DIRECT, the files written with it, the
 * two ways' recent ns per MiB (0: none yet), the worker's direct files since it last tried
 * the page cache */
static int d_setting = DIRECT_AUTO, d_ok = 1;
static unsigned d_gen = 0; /* the folder d_ok is about (dir_gen) */
/* tests: the folder's file system creates the file, then refuses O_DIRECT (as tmpfs before
 * Linux 6.6 does) */
static int d_refuse_test = 0;
static uint64_t d_files = 0; /* (tests, meta.json) */
static double d_ns[2] = {0, 0};
static int d_since = 0, d_retry = DIRECT_RETRY;

#ifdef O_DIRECT
#define HAVE_DIRECT 1
#else /* (macOS: no O_DIRECT; large files are written the buffered way) */
#define HAVE_DIRECT 0
#define O_DIRECT 0
#endif

/* with hmu held: 1 to write this file with O_DIRECT (helper: the helper thread writes it) */
static int d_choose(const Job *j, int helper) {
    if (!HAVE_DIRECT || d_setting == DIRECT_OFF || !d_ok || j->block != (void *)j->data)
        return 0;
    if (d_setting == DIRECT_ON || helper) return 1;
    if (d_ns[0] == 0 || d_ns[1] == 0) return d_ns[0] != 0; /* (each way measured once) */
    int best = d_ns[1] < d_ns[0];
    if (++d_since < d_retry) return best;
    d_since = 0;
    return !best;
}

/* with hmu held: a file of len bytes took ns the way `direct` (helper: the helper's) */
static void d_took(int direct, size_t len, uint64_t ns, int helper) {
    double v = (double)ns * (double)(1u << 20) / (double)(len ? len : 1);
    int was = d_ns[1] < d_ns[0], measured = d_ns[0] != 0 && d_ns[1] != 0;
    int tried = measured && !helper && d_setting == DIRECT_AUTO && direct != was;
    /* (a way tried again: its old figure is stale, the new one replaces it) */
    d_ns[direct] = d_ns[direct] == 0 || tried ? v : 0.75 * d_ns[direct] + 0.25 * v;
    d_files += direct;
    if (!measured || helper || d_setting != DIRECT_AUTO) return;
    if ((d_ns[1] < d_ns[0]) != was) /* the other way is faster now */
        d_retry = DIRECT_RETRY;
    else if (direct != was && d_retry < DIRECT_RETRY_MAX) /* tried, and still slower */
        d_retry *= 2;
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* write_file with O_DIRECT from j's page-aligned block: 0, an errno, or -1 where the
 * folder's file system refuses O_DIRECT or its alignment (nothing is left behind: the caller
 * writes the file the buffered way) */
static int write_direct(int dfd, const Job *j, int refuse_test) {
    char *tmp = tmp_name(j->name);
    if (!tmp) return ENOMEM;
    int err = 0;
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_DIRECT,
                    0600);
    if (fd >= 0 && refuse_test) {
        close(fd);
        fd = -1;
        errno = EINVAL;
    }
    if (fd < 0) {
        err = errno == EINVAL ? -1 : errno;
        /* A file system without O_DIRECT may have created the file before refusing the flag:
         * O_EXCL made the name ours, so it goes (the buffered write creates it again). */
        if (err == -1) unlinkat(dfd, tmp, 0);
    } else {
        size_t n = j->len & ~(size_t)(DIRECT_ALIGN - 1), done = 0;
        while (done < n && !err) {
            ssize_t w = write(fd, j->data + done, n - done);
            if (w < 0) {
                if (errno != EINTR) err = errno == EINVAL ? -1 : errno;
            } else if (w == 0 || ((size_t)w & (DIRECT_ALIGN - 1))) {
                err = w ? -1 : ENOSPC; /* (a short write off a page boundary: buffered) */
            } else {
                done += (size_t)w;
            }
        }
        /* the last partial page through the page cache: no padding, no truncation */
        if (!err && n < j->len) {
            int fl = fcntl(fd, F_GETFL);
            if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_DIRECT) < 0)
                err = errno;
            else if (write_all(fd, j->data + n, j->len - n) < 0)
                err = errno;
        }
        if (close(fd) < 0 && !err) err = errno;
        if (!err && renameat(dfd, tmp, dfd, j->name) < 0) err = errno;
        if (err) unlinkat(dfd, tmp, 0);
    }
    free(tmp);
    return err;
}

/* a detached thread running fn; 0 or pthread_create's error */
static int start_detached(pthread_t *t, void *(*fn)(void *)) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(t, &attr, fn, NULL);
    pthread_attr_destroy(&attr);
    return rc;
}

/* ------------------------------------------------------------------ large files, two at once
 * A batch's large dumps that get a file each (PAR_MIN bytes and more: what packs do not
 * take) are written by the worker and one helper thread together, each taking the next file
 * in turn, before the batch's other jobs (hard links to them included) and before the batch
 * is accounted for: a batch is still done as a whole, so a ticket's jobs are all written when
 * wait() says so. One thread writes one file at a time, creating it, copying its bytes into
 * the page cache and renaming it; two overlap those steps. */
#define PAR_MIN (256u << 10)
static pthread_mutex_t hmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hcv_work = PTHREAD_COND_INITIALIZER; /* a round posted, or quit */
static pthread_cond_t hcv_done = PTHREAD_COND_INITIALIZER; /* a round's last file written */
/* under hmu: the round's files, the next to take, how many are not written yet */
static Job **h_jobs = NULL;
static int h_n = 0, h_next = 0, h_left = 0, h_dfd = -1, h_running = 0, h_quit = 0;
static unsigned h_gen = 0; /* the round's folder (dir_gen): a refusal counts for it only */
static unsigned h_round = 0;
static unsigned h_first = 0; /* the round a new helper is started for (it joins that one) */
static uint64_t h_files = 0; /* files the helper wrote (tests: the two-thread path ran) */

/* with hmu held: write the round's files until none is left to take */
static void h_share(int helper) {
    while (h_next < h_n) {
        Job *j = h_jobs[h_next++];
        int dfd = h_dfd, direct = d_choose(j, helper), refuse_test = d_refuse_test;
        pthread_mutex_unlock(&hmu);
        uint64_t t0 = now_ns();
        int err = direct ? write_direct(dfd, j, refuse_test) : 0, refused = err == -1;
        if (!direct || refused) err = write_file(dfd, j->name, j->data, j->len);
        uint64_t t1 = now_ns();
        pthread_mutex_lock(&hmu);
        j->err = err;
        if (refused && h_gen == d_gen) d_ok = 0; /* (written the buffered way above) */
        else if (!err) d_took(direct, j->len, t1 - t0, helper); /* (successful writes only) */
        h_files += helper;
        if (--h_left == 0) pthread_cond_signal(&hcv_done);
    }
}

static void *helper(void *unused) {
    (void)unused;
    pthread_mutex_lock(&hmu);
    unsigned seen = h_first;
    for (;;) {
        while (h_round == seen && !h_quit) pthread_cond_wait(&hcv_work, &hmu);
        if (h_quit) break;
        seen = h_round;
        h_share(1);
    }
    h_running = 0;
    pthread_mutex_unlock(&hmu);
    return NULL;
}

/* Write the batch's large files (two threads), marking them written; their err is set. */
static void write_large(int dfd, unsigned gen, Job *batch) {
    Job *big[BATCH_JOBS];
    int n = 0;
    for (Job *j = batch; j; j = j->next)
        if (!j->pack && !j->link && j->len >= PAR_MIN) big[n++] = j;
    if (!n) return;
    pthread_mutex_lock(&hmu);
    if (n == 1) { /* one file: written here, the way d_choose says */
        h_jobs = big;
        h_n = h_left = 1;
        h_next = 0;
        h_dfd = dfd;
        h_gen = gen;
        h_share(0);
        h_jobs = NULL;
        h_n = h_next = 0;
        pthread_mutex_unlock(&hmu);
        big[0]->written = 1;
        return;
    }
    if (!h_running) {
        pthread_t t;
        h_quit = 0;
        h_first = h_round; /* (the round posted below: the helper joins it when it starts) */
        if (start_detached(&t, helper)) { /* no helper: the batch's loop writes them in turn */
            pthread_mutex_unlock(&hmu);
            return;
        }
        h_running = 1;
    }
    h_quit = 0; /* (a helper told to quit that has not left yet stays) */
    h_jobs = big;
    h_n = n;
    h_next = 0;
    h_left = n;
    h_dfd = dfd;
    h_gen = gen;
    h_round++;
    pthread_cond_signal(&hcv_work);
    h_share(0);
    while (h_left) pthread_cond_wait(&hcv_done, &hmu);
    h_jobs = NULL;
    h_n = h_next = 0;
    pthread_mutex_unlock(&hmu);
    for (int k = 0; k < n; k++) big[k]->written = 1;
}

/* the helper stops (the worker is leaving) */
static void helper_quit(void) {
    pthread_mutex_lock(&hmu);
    h_quit = 1;
    pthread_cond_signal(&hcv_work);
    pthread_mutex_unlock(&hmu);
}

/* How long the writer waits for more jobs once its queue runs dry, before it sleeps until a
 * submit wakes it. Meanwhile a submit does not signal it (``idle`` is 0): a program that
 * dumps steadily costs one timed wake-up per LINGER_NS, not a futex wake-up (and two
 * context switches) per dump. A dump is written at most this much later; ``wait`` (the log
 * writer's barrier) still returns as soon as its jobs are done. */
#define LINGER_NS 1000000L

static void *worker(void *unused) {
    (void)unused;
    int lingered = 0;
    pthread_mutex_lock(&mu);
    for (;;) {
        while ((!q_head || held) && !stopping) {
            if (!lingered) {
                lingered = 1;
                struct timespec until;
                clock_gettime(CLOCK_REALTIME, &until);
                until.tv_nsec += LINGER_NS;
                if (until.tv_nsec >= 1000000000L) {
                    until.tv_sec++;
                    until.tv_nsec -= 1000000000L;
                }
                pthread_cond_timedwait(&cv_work, &mu, &until);
                continue;
            }
            idle = 1;
            pthread_cond_wait(&cv_work, &mu);
            idle = 0;
        }
        lingered = 0;
        if (!q_head) break; /* stopping and drained */
        /* A batch: the jobs queued now, up to BATCH_JOBS of them or BATCH_BYTES (at least
         * one), written without the lock and accounted for under it once (one lock round per
         * batch, not two per job: the program's submits meet a held lock less often), their
         * pack entries grouped into few writev calls. Their bytes stay in q_bytes until the
         * batch is done, so the queue's memory bound holds. */
        Job *batch = q_head, *last = q_head;
        size_t taken = last->len;
        for (int k = 1; k < BATCH_JOBS && last->next && taken + last->next->len <= BATCH_BYTES;
             k++) {
            last = last->next;
            taken += last->len;
        }
        q_head = last->next;
        if (!q_head) q_tail = NULL;
        last->next = NULL;
        q_busy = batch;
        int dfd = dirfd_;
        unsigned gen = dir_gen;
        pthread_mutex_unlock(&mu);
        write_large(dfd, gen, batch);
        for (Job *j = batch; j;) {
            if (j->pack) {
                j = append_group(dfd, gen, j);
                continue;
            }
            if (j->written) {
                j = j->next;
                continue;
            }
            j->err = j->link ? (linkat(dfd, j->link, dfd, j->name, 0) < 0 ? errno : 0)
                             : write_file(dfd, j->name, j->data, j->len);
            j = j->next;
        }
        pthread_mutex_lock(&mu);
        for (Job *j = batch; j; j = j->next) {
            q_bytes -= j->len;
            n_completed++;
            if (j->err) {
                n_failed++;
                Failure *f = malloc(sizeof(Failure));
                if (f && !(f->name = strdup(j->name))) {
                    free(f); /* (counted in n_failed all the same) */
                    f = NULL;
                }
                if (f) {
                    f->err = j->err;
                    f->next = failures;
                    failures = f;
                }
            } else if (j->link) {
                n_links++;
            } else {
                n_files++;
                bytes_written += j->len;
            }
        }
        q_busy = NULL;
        pthread_cond_broadcast(&cv_done);
        pthread_mutex_unlock(&mu);
        while (batch) { /* outside the lock: freeing a large block is a syscall */
            Job *next = batch->next;
            free_job(batch);
            batch = next;
        }
        pthread_mutex_lock(&mu);
    }
    pack_trim(); /* closed (drained): the pack's preallocated blocks given back */
    helper_quit();
    running = 0;
    pthread_cond_broadcast(&cv_done);
    pthread_mutex_unlock(&mu);
    pool_clear(0); /* (a dump submitted meanwhile takes a fresh block) */
    return NULL;
}

/* with mu held */
static int ensure_thread(void) {
    if (running) return 0;
    stopping = 0;
    int rc = start_detached(&thread, worker);
    if (rc) return rc;
    running = 1;
    return 0;
}

static void atfork_prepare(void) {
    pthread_mutex_lock(&mu);
    pthread_mutex_lock(&pmu);
}
static void atfork_parent(void) {
    pthread_mutex_unlock(&pmu);
    pthread_mutex_unlock(&mu);
}
static void atfork_child(void) {
    /* The parent's jobs are the parent's: the child starts with an empty queue and no thread
     * (one starts at its first dump). */
    pthread_mutex_init(&mu, NULL);
    pthread_mutex_init(&pmu, NULL);
    pthread_cond_init(&cv_work, NULL);
    pthread_cond_init(&cv_done, NULL);
    pthread_mutex_init(&hmu, NULL); /* (no helper in the child: one starts when needed) */
    pthread_cond_init(&hcv_work, NULL);
    pthread_cond_init(&hcv_done, NULL);
    h_jobs = NULL;
    h_n = h_next = h_left = h_running = h_quit = 0;
    h_files = 0;
    held = 0;
    d_files = 0;
    d_ns[0] = d_ns[1] = 0;
    d_since = 0;
    d_retry = DIRECT_RETRY;
    for (int k = 0; k < 2; k++) { /* the queue, and the batch the parent's writer held */
        Job *j = k ? q_busy : q_head;
        while (j) {
            Job *n = j->next;
            free_job(j);
            j = n;
        }
    }
    q_busy = NULL;
    pool_clear(1); /* (after the jobs: their blocks went back to the pool) */
    pool_hits = pool_misses = 0;
    Failure *f = failures;
    while (f) {
        Failure *n = f->next;
        free(f->name);
        free(f);
        f = n;
    }
    failures = NULL;
    if (pack_fd >= 0) close(pack_fd); /* the parent's pack: the child starts its own */
    pack_fd = -1;
    pack_alloc = 0;
    pack_k = 0;
    q_head = q_tail = NULL;
    q_bytes = 0;
    n_submitted = n_completed = n_files = n_links = n_failed = bytes_written = 0;
    running = stopping = 0;
}

/* s's UTF-8 (the str's own, NUL-terminated) and its length in *n, or NULL with an error
 * set: a dump name is one non-empty path component */
static const char *name_utf8(PyObject *s, size_t *n) {
    Py_ssize_t k;
    const char *c = PyUnicode_AsUTF8AndSize(s, &k);
    if (!c) return NULL;
    if ((Py_ssize_t)strlen(c) != k || !k || memchr(c, '/', (size_t)k)) {
        PyErr_SetString(PyExc_ValueError, "a dump name is one non-empty path component");
        return NULL;
    }
    *n = (size_t)k;
    return c;
}

/* open(dirfd, max_bytes): the run folder's descriptor (duplicated) and the queue's memory */
static PyObject *dq_open(PyObject *self, PyObject *args) {
    int fd;
    Py_ssize_t maxb;
    if (!PyArg_ParseTuple(args, "in", &fd, &maxb)) return NULL;
    int d = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (d < 0) return PyErr_SetFromErrno(PyExc_OSError);
    pthread_mutex_lock(&mu);
    int old = dirfd_;
    dirfd_ = d;
    dir_gen++;
    stopping = 0; /* reopened: a writer still draining after close() stays for the new jobs */
    q_max = maxb > 0 ? (size_t)maxb : 1;
    unsigned gen = dir_gen;
    pthread_mutex_unlock(&mu);
    pthread_mutex_lock(&pmu);
    pool_max = q_max / 2;
    pthread_mutex_unlock(&pmu);
    if (old >= 0) close(old);
    pthread_mutex_lock(&hmu);
    /* a new folder: O_DIRECT is tried again there (a refusal from a batch of the old one,
     * still being written, does not count for it) */
    if ((int)(gen - d_gen) > 0) {
        d_gen = gen;
        d_ok = 1;
    }
    pthread_mutex_unlock(&hmu);
    Py_RETURN_NONE;
}

/* with mu held: queue j (the thread is started if needed); 0 or an errno */
static int enqueue(Job *j) {
    int rc = ensure_thread();
    if (rc) return rc;
    if (q_tail)
        q_tail->next = j;
    else
        q_head = j;
    q_tail = j;
    q_bytes += j->len;
    n_submitted++;
    if (idle) pthread_cond_signal(&cv_work); /* a busy writer finds the job by itself */
    return 0;
}

static inline int has_room(size_t need) {
    return (!q_head && !q_busy) || q_bytes + need <= q_max;
}

/* set_host(host): the host part of this process's pack names (a safe file-name part) */
static PyObject *dq_set_host(PyObject *self, PyObject *arg) {
    Py_ssize_t n;
    const char *c = PyUnicode_Check(arg) ? PyUnicode_AsUTF8AndSize(arg, &n) : NULL;
    if (!c) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "set_host(str)");
        return NULL;
    }
    if (!n || n >= (Py_ssize_t)sizeof pack_host || memchr(c, '/', (size_t)n) ||
        (Py_ssize_t)strlen(c) != n) {
        PyErr_SetString(PyExc_ValueError, "set_host: a short file-name part");
        return NULL;
    }
    pthread_mutex_lock(&mu);
    memcpy(pack_host, c, (size_t)n + 1);
    pthread_mutex_unlock(&mu);
    Py_RETURN_NONE;
}

/* A strided view's elements gathered into dst in C order: PyBuffer_ToContiguous(..., 'C')'s
 * result for a view without suboffsets (an ndarray's), with one loop per row and a load and
 * store per element of the common sizes, where CPython's makes two memcpy calls per element
 * (a slice with a step, a transpose of 3 dimensions or more). */
#define GATHER_ROW(T)                                   \
    for (Py_ssize_t i = 0; i < n; i++) {                \
        T e;                                            \
        memcpy(&e, p + i * is, sizeof(T));              \
        memcpy(dst + i * (Py_ssize_t)sizeof(T), &e, sizeof(T)); \
    }
static int gather_c(char *dst, const Py_buffer *v) {
    int nd = v->ndim;
    if (v->suboffsets || !v->shape || !v->strides || nd < 1 || nd > PyBUF_MAX_NDIM)
        return PyBuffer_ToContiguous(dst, v, v->len, 'C');
    if (v->len == 0) return 0;
    const Py_ssize_t *shape = v->shape, *st = v->strides, isz = v->itemsize;
    const Py_ssize_t n = shape[nd - 1], is = st[nd - 1];
    Py_ssize_t idx[PyBUF_MAX_NDIM] = {0}, off = 0;
    for (;;) {
        const char *p = (const char *)v->buf + off;
        if (is == isz) {
            memcpy(dst, p, (size_t)(n * isz));
        } else if (isz == 1) {
            GATHER_ROW(uint8_t)
        } else if (isz == 2) {
            GATHER_ROW(uint16_t)
        } else if (isz == 4) {
            GATHER_ROW(uint32_t)
        } else if (isz == 8) {
            GATHER_ROW(uint64_t)
        } else {
            for (Py_ssize_t i = 0; i < n; i++) memcpy(dst + i * isz, p + i * is, (size_t)isz);
        }
        dst += n * isz;
        int d = nd - 2;
        for (; d >= 0; d--) { /* the next row: an odometer over the outer dimensions */
            off += st[d];
            if (++idx[d] < shape[d]) break;
            off -= st[d] * shape[d];
            idx[d] = 0;
        }
        if (d < 0) return 0;
    }
}
#undef GATHER_ROW

/* submit(name, header: bytes, data: buffer | None, link: str | None, wait: bool[, pack: bool
 * [, digest: bytes | None]]) -> bool; pack: append to the process's pack (data), or an alias
 * entry there (link); digest: the XXH3-128 digest of data's bytes (16 bytes), which then
 * checks its pack entry (version 2) instead of a CRC of those bytes
 * Queue one file. data's bytes are copied now (C order). False: the queue is full and
 * wait is false (nothing queued). A job larger than the queue is taken when the queue is
 * empty, so memory stays within max(queue size, one array). */
static PyObject *dq_submit(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    if (n < 5 || n > 7 || !PyUnicode_Check(a[0]) || !PyBytes_Check(a[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "submit(name, header, data, link, wait[, pack[, digest]])");
        return NULL;
    }
    if (n == 7 && a[6] != Py_None && !(PyBytes_Check(a[6]) && PyBytes_GET_SIZE(a[6]) == 16)) {
        PyErr_SetString(PyExc_TypeError, "submit: digest is 16 bytes or None");
        return NULL;
    }
    int wait = PyObject_IsTrue(a[4]);
    if (wait < 0) return NULL;
    int pack = n >= 6 ? PyObject_IsTrue(a[5]) : 0;
    if (pack < 0) return NULL;
    /* One block: the job, its data (the .npy header and the array's bytes), its name and the
     * name it links to (one malloc and one free a dump). */
    size_t nl = 0, ll = 0;
    const char *nm = name_utf8(a[0], &nl), *lk = NULL;
    if (!nm) return NULL;
    if (a[3] != Py_None) {
        if (!PyUnicode_Check(a[3])) {
            PyErr_SetString(PyExc_TypeError, "link: str or None");
            return NULL;
        }
        if (!(lk = name_utf8(a[3], &ll))) return NULL;
    }
    Py_buffer view;
    int have = 0;
    Py_ssize_t hl = lk ? 0 : PyBytes_GET_SIZE(a[1]);
    size_t dl = 0;
    if (!lk && a[2] != Py_None) {
        if (PyObject_GetBuffer(a[2], &view, PyBUF_STRIDES) < 0) return NULL;
        have = 1;
        dl = (size_t)view.len;
    }
    size_t len = (size_t)hl + dl, extra = nl + 1 + (lk ? ll + 1 : 0);
    Job *j = NULL;
    char *data = NULL;
    if (len > SIZE_MAX / 2 - sizeof(Job) - extra - DIRECT_ALIGN) {
        /* (no such block) */
    } else if (!lk && len >= POOL_MIN) { /* a pooled block (a file that may go O_DIRECT) */
        size_t at = (len + 63) & ~(size_t)63; /* (where the job starts: aligned) */
        size_t cap = 0;
        void *blk = pool_take(at + sizeof(Job) + extra, &cap);
        if (blk) {
            data = blk;
            j = (Job *)(data + at);
            memset(j, 0, sizeof *j);
            j->block = blk;
            j->cap = cap;
        }
    } else if ((j = malloc(sizeof(Job) + len + extra))) {
        memset(j, 0, sizeof *j);
        j->block = j;
        data = (char *)(j + 1);
    }
    if (!j) {
        if (have) PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    j->pack = pack;
    j->data = data;
    j->name = (char *)(j + 1) + (j->block == (void *)j ? len : 0); /* (see Job) */
    memcpy(j->name, nm, nl + 1);
    if (lk) {
        j->link = j->name + nl + 1;
        memcpy(j->link, lk, ll + 1);
        j->data = NULL; /* (an alias has no data) */
    } else {
        j->len = len;
        memcpy(j->data, PyBytes_AS_STRING(a[1]), (size_t)hl);
        if (have) {
            int contiguous = PyBuffer_IsContiguous(&view, 'C');
            int rc = contiguous ? (memcpy(j->data + hl, view.buf, dl), 0)
                                : gather_c(j->data + hl, &view);
            PyBuffer_Release(&view);
            if (rc < 0) goto fail;
            /* (a digest is of a C-contiguous buffer's memory: the bytes copied here) */
            if (n == 7 && a[6] != Py_None && contiguous && hl <= 0xffffffff) {
                memcpy(j->dg, PyBytes_AS_STRING(a[6]), 16);
                j->has_dg = 1;
                j->hlen = (uint32_t)hl;
            }
        }
    }
    /* mu is never held while the GIL is being taken: the slow path releases the GIL first */
    int rc = 0, queued = 0, closed = 0;
    pthread_mutex_lock(&mu);
    if (dirfd_ < 0) {
        closed = 1;
    } else if (has_room(j->len)) {
        rc = enqueue(j);
        queued = !rc;
    }
    pthread_mutex_unlock(&mu);
    if (!closed && !queued && !rc && wait) {
        Py_BEGIN_ALLOW_THREADS;
        pthread_mutex_lock(&mu);
        while (!has_room(j->len) && running) pthread_cond_wait(&cv_done, &mu);
        rc = enqueue(j);
        queued = !rc;
        pthread_mutex_unlock(&mu);
        Py_END_ALLOW_THREADS;
    }
    if (closed) {
        PyErr_SetString(PyExc_RuntimeError, "the dump queue is not open");
        goto fail;
    }
    if (rc) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        goto fail;
    }
    if (!queued) {
        free_job(j);
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
fail:
    free_job(j);
    return NULL;
}

/* ticket() -> the number of jobs submitted so far */
static PyObject *dq_ticket(PyObject *self, PyObject *unused) {
    pthread_mutex_lock(&mu);
    uint64_t t = n_submitted;
    pthread_mutex_unlock(&mu);
    return PyLong_FromUnsignedLongLong(t);
}

/* wait(ticket, timeout_s) -> bool: every job up to ticket is done (GIL released meanwhile) */
static PyObject *dq_wait(PyObject *self, PyObject *args) {
    unsigned long long ticket;
    double timeout;
    if (!PyArg_ParseTuple(args, "Kd", &ticket, &timeout)) return NULL;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double whole = floor(timeout);
    until.tv_sec += (time_t)whole;
    until.tv_nsec += (long)((timeout - whole) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS;
    pthread_mutex_lock(&mu);
    while (n_completed < ticket && running)
        if (pthread_cond_timedwait(&cv_done, &mu, &until) == ETIMEDOUT) break;
    ok = n_completed >= ticket;
    pthread_mutex_unlock(&mu);
    Py_END_ALLOW_THREADS;
    return PyBool_FromLong(ok);
}

/* failures() -> [(name, errno, message)], cleared */
static PyObject *dq_failures(PyObject *self, PyObject *unused) {
    pthread_mutex_lock(&mu);
    Failure *f = failures;
    failures = NULL;
    pthread_mutex_unlock(&mu);
    PyObject *out = PyList_New(0);
    while (f) {
        Failure *next = f->next;
        if (out) {
            PyObject *t = Py_BuildValue("(sis)", f->name, f->err, strerror(f->err));
            if (!t || PyList_Append(out, t) < 0) Py_CLEAR(out);
            Py_XDECREF(t);
        }
        free(f->name);
        free(f);
        f = next;
    }
    return out;
}

/* counters() -> (queued bytes, submitted, completed, files, links, failed, bytes written) */
/* pool() -> (bytes of the blocks kept, most it keeps, blocks handed out again, blocks taken
 * fresh) */
static PyObject *dq_pool(PyObject *self, PyObject *unused) {
    pthread_mutex_lock(&pmu); /* (the tuple is built after: a collection it may start can
                               * run a finalizer that dumps, which takes pmu) */
    size_t kept = pool_bytes, most = pool_max;
    uint64_t hits = pool_hits, misses = pool_misses;
    pthread_mutex_unlock(&pmu);
    return Py_BuildValue("(nnKK)", (Py_ssize_t)kept, (Py_ssize_t)most, hits, misses);
}

static PyObject *dq_counters(PyObject *self, PyObject *unused) {
    pthread_mutex_lock(&mu); /* (the tuple is built after: see dq_pool) */
    size_t qb = q_bytes;
    uint64_t c[6] = {n_submitted, n_completed, n_files, n_links, n_failed, bytes_written};
    pthread_mutex_unlock(&mu);
    return Py_BuildValue("(nKKKKKK)", (Py_ssize_t)qb, c[0], c[1], c[2], c[3], c[4], c[5]);
}

/* helper_files() -> the files the second writer thread has written (write_large) */
static PyObject *dq_helper_files(PyObject *self, PyObject *unused) {
    pthread_mutex_lock(&hmu);
    uint64_t n = h_files;
    pthread_mutex_unlock(&hmu);
    return PyLong_FromUnsignedLongLong(n);
}

/* hold(flag) (tests): while held, the writer takes no job off the queue, so that the jobs
 * submitted meanwhile make one batch once it is released */
static PyObject *dq_hold(PyObject *self, PyObject *flag) {
    int v = PyObject_IsTrue(flag);
    if (v < 0) return NULL;
    pthread_mutex_lock(&mu);
    held = v;
    if (!v) pthread_cond_broadcast(&cv_work);
    pthread_mutex_unlock(&mu);
    Py_RETURN_NONE;
}

/* direct([setting[, refuse_test]]) -> (setting, the folder takes O_DIRECT, files written
 * with O_DIRECT): setting 0 off, 1 auto, 2 on (PPROBE_DUMP_DIRECT); refuse_test (tests): the
 * file system creates each file, then refuses O_DIRECT */
static PyObject *dq_direct(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    int v = -1, refuse = -1;
    if (n > 2 || (n >= 1 && ((v = PyLong_AsLong(a[0])) < DIRECT_OFF || v > DIRECT_ON)) ||
        (n == 2 && (refuse = PyObject_IsTrue(a[1])) < 0)) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "direct([setting]): 0 off, 1 auto or 2 on");
        }
        return NULL;
    }
    pthread_mutex_lock(&hmu);
    if (refuse >= 0) d_refuse_test = refuse;
    if (n >= 1) {
        d_setting = v;
        d_ns[0] = d_ns[1] = 0;
        d_since = 0;
        d_retry = DIRECT_RETRY;
    }
    PyObject *r = Py_BuildValue("(iiK)", d_setting, d_ok, (unsigned long long)d_files);
    pthread_mutex_unlock(&hmu);
    return r;
}

/* close(timeout_s) -> bool: drain the queue, stop the thread, close the folder descriptor */
static PyObject *dq_close(PyObject *self, PyObject *args) {
    double timeout;
    if (!PyArg_ParseTuple(args, "d", &timeout)) return NULL;
    PyObject *t = dq_ticket(self, NULL);
    if (!t) return NULL;
    PyObject *wargs = Py_BuildValue("(Od)", t, timeout);
    Py_DECREF(t);
    if (!wargs) return NULL;
    PyObject *ok = dq_wait(self, wargs);
    Py_DECREF(wargs);
    if (!ok) return NULL;
    pthread_mutex_lock(&mu);
    stopping = 1;
    pthread_cond_broadcast(&cv_work);
    pthread_mutex_unlock(&mu);
    if (ok == Py_True) {
        /* drained: the writer exits now, giving its pack's preallocated blocks back
         * (pack_trim); wait for that, briefly, so that a process ending right after close()
         * leaves its packs at their size */
        Py_BEGIN_ALLOW_THREADS;
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 2;
        pthread_mutex_lock(&mu);
        while (running && stopping)
            if (pthread_cond_timedwait(&cv_done, &mu, &until) == ETIMEDOUT) break;
        pthread_mutex_unlock(&mu);
        Py_END_ALLOW_THREADS;
    }
    return ok;
}

/* ------------------------------------------------------------------ content hash */
static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t rd64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static inline uint64_t round64(uint64_t acc, uint64_t in) {
    acc += in * P2;
    acc = rotl(acc, 31);
    return acc * P1;
}
static inline uint64_t avalanche(uint64_t h) {
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

/* Two XXH64-style digests of the same bytes with different seeds and lane orders: 128 bits. */
static void hash128(const unsigned char *p, size_t n, uint64_t out[2]) {
    uint64_t a[4] = {P1 + P2, P2, 0, (uint64_t)0 - P1};
    uint64_t b[4] = {P3, P4 ^ 0x5bd1e995u, P5, P1 ^ 0x2545F4914F6CDD1DULL};
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint64_t w0 = rd64(p + i), w1 = rd64(p + i + 8), w2 = rd64(p + i + 16),
                 w3 = rd64(p + i + 24);
        a[0] = round64(a[0], w0);
        a[1] = round64(a[1], w1);
        a[2] = round64(a[2], w2);
        a[3] = round64(a[3], w3);
        b[0] = round64(b[0], w3);
        b[1] = round64(b[1], w0);
        b[2] = round64(b[2], w1);
        b[3] = round64(b[3], w2);
    }
    uint64_t ha = rotl(a[0], 1) + rotl(a[1], 7) + rotl(a[2], 12) + rotl(a[3], 18);
    uint64_t hb = rotl(b[0], 1) + rotl(b[1], 7) + rotl(b[2], 12) + rotl(b[3], 18);
    for (int k = 0; k < 4; k++) {
        ha = (ha ^ round64(0, a[k])) * P1 + P4;
        hb = (hb ^ round64(0, b[k])) * P1 + P4;
    }
    ha += (uint64_t)n;
    hb += (uint64_t)n * P5;
    for (; i + 8 <= n; i += 8) {
        uint64_t w = rd64(p + i);
        ha = rotl(ha ^ round64(0, w), 27) * P1 + P4;
        hb = rotl(hb ^ round64(P5, w), 29) * P2 + P3;
    }
    for (; i < n; i++) {
        ha = rotl(ha ^ (p[i] * P5), 11) * P1;
        hb = rotl(hb ^ (p[i] * P1), 13) * P2;
    }
    out[0] = avalanche(ha);
    out[1] = avalanche(hb ^ out[0]);
}

/* digest(buffer) -> 16 bytes, or None when the buffer is not contiguous */
static PyObject *py_digest(PyObject *self, PyObject *obj) {
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_STRIDES) < 0) return NULL;
    if (!PyBuffer_IsContiguous(&v, 'A')) {
        PyBuffer_Release(&v);
        Py_RETURN_NONE;
    }
    uint64_t h[2];
    if (v.len > (1 << 20)) {
        Py_BEGIN_ALLOW_THREADS;
        hash128((const unsigned char *)v.buf, (size_t)v.len, h);
        Py_END_ALLOW_THREADS;
    } else {
        hash128((const unsigned char *)v.buf, (size_t)v.len, h);
    }
    PyBuffer_Release(&v);
    return PyBytes_FromStringAndSize((const char *)h, 16);
}

/* ------------------------------------------------------------------ statistics */
typedef struct {
    double n, mean, m2, mn, mx;
    int64_t nan, inf;
} Acc;

/* a block's count, mean, sum of squared deviations, min and max into the running statistics
 * (Chan et al.'s pairwise combination) */
static inline __attribute__((always_inline)) void acc_merge(Acc *acc, double bn, double bm,
                                                          double bm2, double mn, double mx) {
    if (acc->n == 0) {
        acc->n = bn;
        acc->mean = bm;
        acc->m2 = bm2;
        acc->mn = mn;
        acc->mx = mx;
        return;
    }
    double n = acc->n + bn, d = bm - acc->mean;
    acc->mean += d * bn / n;
    acc->m2 += bm2 + d * d * acc->n * bn / n;
    acc->n = n;
    if (mn < acc->mn) acc->mn = mn;
    if (mx > acc->mx) acc->mx = mx;
}

static __attribute__((noinline)) void acc_block(Acc *acc, const double *x, size_t k) {
    /* x: k finite values; two passes while they are in cache, then Chan's combination */
    if (!k) return;
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= k; i += 4) {
        s0 += x[i];
        s1 += x[i + 1];
        s2 += x[i + 2];
        s3 += x[i + 3];
    }
    for (; i < k; i++) s0 += x[i];
    double bm = ((s0 + s1) + (s2 + s3)) / (double)k;
    double q0 = 0, q1 = 0, q2 = 0, q3 = 0;
    double mn0 = x[0], mn1 = x[0], mn2 = x[0], mn3 = x[0];
    double mx0 = x[0], mx1 = x[0], mx2 = x[0], mx3 = x[0];
    for (i = 0; i + 4 <= k; i += 4) {
        double d0 = x[i] - bm, d1 = x[i + 1] - bm, d2 = x[i + 2] - bm, d3 = x[i + 3] - bm;
        q0 += d0 * d0;
        q1 += d1 * d1;
        q2 += d2 * d2;
        q3 += d3 * d3;
        mn0 = x[i] < mn0 ? x[i] : mn0;
        mn1 = x[i + 1] < mn1 ? x[i + 1] : mn1;
        mn2 = x[i + 2] < mn2 ? x[i + 2] : mn2;
        mn3 = x[i + 3] < mn3 ? x[i + 3] : mn3;
        mx0 = x[i] > mx0 ? x[i] : mx0;
        mx1 = x[i + 1] > mx1 ? x[i + 1] : mx1;
        mx2 = x[i + 2] > mx2 ? x[i + 2] : mx2;
        mx3 = x[i + 3] > mx3 ? x[i + 3] : mx3;
    }
    for (; i < k; i++) {
        double d0 = x[i] - bm;
        q0 += d0 * d0;
        mn0 = x[i] < mn0 ? x[i] : mn0;
        mx0 = x[i] > mx0 ? x[i] : mx0;
    }
    double mn = mn0 < mn1 ? mn0 : mn1, mx = mx0 > mx1 ? mx0 : mx1;
    if (mn2 < mn) mn = mn2;
    if (mn3 < mn) mn = mn3;
    if (mx2 > mx) mx = mx2;
    if (mx3 > mx) mx = mx3;
    acc_merge(acc, (double)k, bm, (q0 + q1) + (q2 + q3), mn, mx);
}

/* A block of converted values: the non-finite ones (floating types) are counted and
 * dropped first. One branch-free pass tells whether there are any: x * 0 is NaN only for
 * NaN and inf. */
static void flush_block(Acc *acc, double *x, size_t k, int floating) {
    if (floating) {
        double c0 = 0, c1 = 0, c2 = 0, c3 = 0;
        size_t i = 0;
        for (; i + 4 <= k; i += 4) {
            c0 += x[i] * 0.0;
            c1 += x[i + 1] * 0.0;
            c2 += x[i + 2] * 0.0;
            c3 += x[i + 3] * 0.0;
        }
        for (; i < k; i++) c0 += x[i] * 0.0;
        if ((c0 + c1) + (c2 + c3) != 0.0) {
            size_t j = 0;
            for (i = 0; i < k; i++) {
                double v = x[i];
                if (isfinite(v))
                    x[j++] = v;
                else if (isnan(v))
                    acc->nan++;
                else
                    acc->inf++;
            }
            k = j;
        }
    }
    acc_block(acc, x, k);
}

/* Contiguous float32 / float64 runs of finite values, straight from the array's memory: no
 * conversion into the block, 16 (float) or 8 (double) values per step with GCC/clang vector
 * extensions, an AVX2 clone where the CPU has it (target_clones, resolved once at load; for
 * float32, hand-written AVX2 intrinsics, the same operations in the same order).
 * Sums and squared deviations are accumulated in double, min and max in the element type
 * (exact either way). A chunk with a NaN or an inf returns 0 and takes the general path,
 * which counts and drops them. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__aarch64__))
#define VEC_STATS 1
typedef float v8f __attribute__((vector_size(32)));
typedef double v4d __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef int64_t v4l __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
#if defined(__x86_64__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

/* the low and high four floats of v, as doubles (macros: a function returning a 32-byte
 * vector would change the ABI of the non-AVX clone) */
#define LO4(v) __builtin_convertvector(((v4f){(v)[0], (v)[1], (v)[2], (v)[3]}), v4d)
#define HI4(v) __builtin_convertvector(((v4f){(v)[4], (v)[5], (v)[6], (v)[7]}), v4d)

/* the scalar tails of f32_run / f64_run (the values past the last full 8-lane step):
 * min, max and sum (a non-finite value sends the run to the general path), then the squared
 * deviations from the run's mean */
#define RUN_TAIL_SUM(x, i, m, mn, mx, s)          \
    for (; (i) < (m); (i)++) {                   \
        if (!isfinite((x)[i])) return 0;         \
        if ((x)[i] < (mn)) (mn) = (x)[i];        \
        if ((x)[i] > (mx)) (mx) = (x)[i];        \
        (s) += (x)[i];                           \
    }
#define RUN_TAIL_SQ(x, i, m, bm, q)              \
    for (; (i) < (m); (i)++) {                   \
        double d_ = (x)[i] - (bm);               \
        (q) += d_ * d_;                          \
    }

#if defined(__x86_64__)
#include <immintrin.h>
#define F32_AVX2 1
static int g_avx2 = 0; /* the CPU has AVX2 (set when the module loads) */

/* f32_run for AVX2 CPUs, with intrinsics (GCC's vector extensions split the float-to-double
 * conversions and spill the accumulators here): the same operations in the same order as
 * the portable f32_run below, hence the same numbers. No FMA: a fused multiply-add would
 * round the squared deviations differently. Each half of 8 floats is converted straight from
 * memory (no extract instruction): 18 % less time per value than converting the halves of
 * the loaded vector. Measured and not kept: one pass with the deviations from a shift (the
 * same number of additions, slower), and FMA (its latency bounds four accumulators). */
__attribute__((target("avx2"))) static int f32_run_avx2(Acc *acc, const float *x, size_t m) {
    size_t i = 0, m16 = m & ~(size_t)15;
    float mn = x[0], mx = x[0];
    double s = 0;
    if (m16) {
        __m256 mn0 = _mm256_loadu_ps(x), mn1 = mn0, mx0 = mn0, mx1 = mn0;
        __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
        for (; i < m16; i += 16) {
            __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
            mn0 = _mm256_min_ps(a, mn0); /* a < mn0 ? a : mn0, as the blend below */
            mn1 = _mm256_min_ps(b, mn1);
            mx0 = _mm256_max_ps(a, mx0);
            mx1 = _mm256_max_ps(b, mx1);
            s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm_loadu_ps(x + i)));
            s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4)));
            s2 = _mm256_add_pd(s2, _mm256_cvtps_pd(_mm_loadu_ps(x + i + 8)));
            s3 = _mm256_add_pd(s3, _mm256_cvtps_pd(_mm_loadu_ps(x + i + 12)));
        }
        double t[4];
        _mm256_storeu_pd(t, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
        s = (t[0] + t[1]) + (t[2] + t[3]);
        if (!isfinite(s)) return 0; /* see f32_run */
        float l0[8], l1[8], h0[8], h1[8];
        _mm256_storeu_ps(l0, mn0);
        _mm256_storeu_ps(l1, mn1);
        _mm256_storeu_ps(h0, mx0);
        _mm256_storeu_ps(h1, mx1);
        for (int j = 0; j < 8; j++) {
            if (l0[j] < mn) mn = l0[j];
            if (l1[j] < mn) mn = l1[j];
            if (h0[j] > mx) mx = h0[j];
            if (h1[j] > mx) mx = h1[j];
        }
    }
    RUN_TAIL_SUM(x, i, m, mn, mx, s);
    double bm = s / (double)m, q = 0;
    i = 0;
    if (m16) {
        const __m256d vb = _mm256_set1_pd(bm);
        __m256d q0 = _mm256_setzero_pd(), q1 = q0, q2 = q0, q3 = q0;
        for (; i < m16; i += 16) {
            __m256d d0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i)), vb);
            __m256d d1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i + 4)), vb);
            __m256d d2 = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i + 8)), vb);
            __m256d d3 = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i + 12)), vb);
            q0 = _mm256_add_pd(q0, _mm256_mul_pd(d0, d0));
            q1 = _mm256_add_pd(q1, _mm256_mul_pd(d1, d1));
            q2 = _mm256_add_pd(q2, _mm256_mul_pd(d2, d2));
            q3 = _mm256_add_pd(q3, _mm256_mul_pd(d3, d3));
        }
        double t[4];
        _mm256_storeu_pd(t, _mm256_add_pd(_mm256_add_pd(q0, q1), _mm256_add_pd(q2, q3)));
        q = (t[0] + t[1]) + (t[2] + t[3]);
    }
    RUN_TAIL_SQ(x, i, m, bm, q);
    acc_merge(acc, (double)m, bm, q, mn, mx);
    return 1;
}
#endif

/* 16 floats a step: two 8-lane vectors, four double accumulators per sum (with one or two,
 * the additions' latency bounds the loop), min and max in two vectors each */
CLONES static int f32_run(Acc *acc, const float *x, size_t m) {
#ifdef F32_AVX2
    if (g_avx2) return f32_run_avx2(acc, x, m);
#endif
    size_t i = 0, m16 = m & ~(size_t)15;
    float mn = x[0], mx = x[0];
    double s = 0;
    if (m16) {
        v8f mn0, mn1, mx0, mx1;
        v4d s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        memcpy(&mn0, x, 32);
        mn1 = mx0 = mx1 = mn0;
        for (; i < m16; i += 16) {
            v8f a, b;
            memcpy(&a, x + i, 32);
            memcpy(&b, x + i + 8, 32);
            v8i l0 = a < mn0, l1 = b < mn1, g0 = a > mx0, g1 = b > mx1;
            mn0 = (v8f)(((v8i)a & l0) | ((v8i)mn0 & ~l0));
            mn1 = (v8f)(((v8i)b & l1) | ((v8i)mn1 & ~l1));
            mx0 = (v8f)(((v8i)a & g0) | ((v8i)mx0 & ~g0));
            mx1 = (v8f)(((v8i)b & g1) | ((v8i)mx1 & ~g1));
            s0 += LO4(a);
            s1 += HI4(a);
            s2 += LO4(b);
            s3 += HI4(b);
        }
        v4d t = (s0 + s1) + (s2 + s3);
        s = (t[0] + t[1]) + (t[2] + t[3]);
        /* a NaN or an inf among the values, and only then, makes the sum NaN or inf: float
         * values summed in double cannot overflow (2048 times FLT_MAX is far below DBL_MAX) */
        if (!isfinite(s)) return 0;
        for (int j = 0; j < 8; j++) {
            if (mn0[j] < mn) mn = mn0[j];
            if (mn1[j] < mn) mn = mn1[j];
            if (mx0[j] > mx) mx = mx0[j];
            if (mx1[j] > mx) mx = mx1[j];
        }
    }
    RUN_TAIL_SUM(x, i, m, mn, mx, s);
    double bm = s / (double)m, q = 0;
    i = 0;
    if (m16) {
        v4d q0 = {0}, q1 = {0}, q2 = {0}, q3 = {0}, vb = {bm, bm, bm, bm};
        for (; i < m16; i += 16) {
            v8f a, b;
            memcpy(&a, x + i, 32);
            memcpy(&b, x + i + 8, 32);
            v4d d0 = LO4(a) - vb, d1 = HI4(a) - vb, d2 = LO4(b) - vb, d3 = HI4(b) - vb;
            q0 += d0 * d0;
            q1 += d1 * d1;
            q2 += d2 * d2;
            q3 += d3 * d3;
        }
        v4d t = (q0 + q1) + (q2 + q3);
        q = (t[0] + t[1]) + (t[2] + t[3]);
    }
    RUN_TAIL_SQ(x, i, m, bm, q);
    acc_merge(acc, (double)m, bm, q, mn, mx);
    return 1;
}

CLONES static int f64_run(Acc *acc, const double *x, size_t m) {
    size_t i = 0, m8 = m & ~(size_t)7;
    double mn = x[0], mx = x[0], s = 0;
    if (m8) {
        v4d mn0, mn1, mx0, mx1, s0 = {0}, s1 = {0};
        v4l bad = {0};
        memcpy(&mn0, x, 32);
        memcpy(&mn1, x + 4, 32);
        mx0 = mn0;
        mx1 = mn1;
        for (; i < m8; i += 8) {
            v4d a, b;
            v4l ba, bb;
            memcpy(&a, x + i, 32);
            memcpy(&b, x + i + 4, 32);
            memcpy(&ba, x + i, 32);
            memcpy(&bb, x + i + 4, 32);
            const int64_t E = 0x7ff0000000000000LL;
            bad |= ((ba & E) == E) | ((bb & E) == E);
            v4l l0 = a < mn0, l1 = b < mn1, g0 = a > mx0, g1 = b > mx1;
            mn0 = (v4d)(((v4l)a & l0) | ((v4l)mn0 & ~l0));
            mn1 = (v4d)(((v4l)b & l1) | ((v4l)mn1 & ~l1));
            mx0 = (v4d)(((v4l)a & g0) | ((v4l)mx0 & ~g0));
            mx1 = (v4d)(((v4l)b & g1) | ((v4l)mx1 & ~g1));
            s0 += a;
            s1 += b;
        }
        int64_t any = 0;
        for (int j = 0; j < 4; j++) any |= bad[j];
        if (any) return 0;
        for (int j = 0; j < 4; j++) {
            if (mn0[j] < mn) mn = mn0[j];
            if (mn1[j] < mn) mn = mn1[j];
            if (mx0[j] > mx) mx = mx0[j];
            if (mx1[j] > mx) mx = mx1[j];
        }
        v4d t = s0 + s1;
        s = (t[0] + t[1]) + (t[2] + t[3]);
    }
    RUN_TAIL_SUM(x, i, m, mn, mx, s);
    double bm = s / (double)m, q = 0;
    i = 0;
    if (m8) {
        v4d q0 = {0}, q1 = {0}, vb = {bm, bm, bm, bm};
        for (; i < m8; i += 8) {
            v4d a, b;
            memcpy(&a, x + i, 32);
            memcpy(&b, x + i + 4, 32);
            a -= vb;
            b -= vb;
            q0 += a * a;
            q1 += b * b;
        }
        v4d t = q0 + q1;
        q = (t[0] + t[1]) + (t[2] + t[3]);
    }
    RUN_TAIL_SQ(x, i, m, bm, q);
    acc_merge(acc, (double)m, bm, q, mn, mx);
    return 1;
}
#endif

#define BLOCK 2048

/* Element types, by the codes Python passes (pprobe/stats.py's _CODES keep the same numbers) */
enum { T_BOOL, T_I8, T_U8, T_I16, T_U16, T_I32, T_U32, T_I64, T_U64, T_F16, T_BF16, T_F32,
       T_F64, T_NTYPES };
static const int t_size[T_NTYPES] = {1, 1, 1, 2, 2, 4, 4, 8, 8, 2, 2, 4, 8};

static inline double half_to_double(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15), e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v;
    if (e == 0)
        v = ldexp((double)m, -24); /* zero, subnormal */
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexp((double)(m | 0x400), (int)e - 25);
    return sign ? -v : v;
}

static inline double bf16_to_double(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return (double)f;
}

/* one value of type t at p, as a double */
#define LOAD(TYPE, p) (*(const TYPE *)(p))
static inline double load(int t, const char *p) {
    switch (t) {
    case T_BOOL: return LOAD(uint8_t, p) != 0;
    case T_I8: return LOAD(int8_t, p);
    case T_U8: return LOAD(uint8_t, p);
    case T_I16: return LOAD(int16_t, p);
    case T_U16: return LOAD(uint16_t, p);
    case T_I32: return LOAD(int32_t, p);
    case T_U32: return LOAD(uint32_t, p);
    case T_I64: return (double)LOAD(int64_t, p);
    case T_U64: return (double)LOAD(uint64_t, p);
    case T_F16: return half_to_double(LOAD(uint16_t, p));
    case T_BF16: return bf16_to_double(LOAD(uint16_t, p));
    case T_F32: return LOAD(float, p);
    default: return LOAD(double, p);
    }
}

/* k values of one row: n elements from p, step bytes apart, into the block (flushed by blocks
 * of BLOCK finite values: the memory used is the block, whatever the array's size) */
/* n elements from p, step bytes apart, converted into the block; each full block is flushed
 * (the memory used is the block, whatever the array's size) */
#define ROW_LOOP(T, CONV, FLOAT)                                                  \
    while (n > 0) {                                                               \
        Py_ssize_t m = (Py_ssize_t)(BLOCK - *k);                                  \
        if (m > n) m = n;                                                         \
        double *dst = blk + *k;                                                   \
        if (step == (Py_ssize_t)sizeof(T)) {                                      \
            const T *src = (const T *)p;                                          \
            for (Py_ssize_t i = 0; i < m; i++) dst[i] = CONV(src[i]);             \
        } else {                                                                  \
            for (Py_ssize_t i = 0; i < m; i++) dst[i] = CONV(*(const T *)(p + i * step)); \
        }                                                                         \
        p += m * step;                                                            \
        n -= m;                                                                   \
        *k += (size_t)m;                                                          \
        if (*k == BLOCK) {                                                        \
            flush_block(acc, blk, *k, FLOAT);                                     \
            *k = 0;                                                               \
        }                                                                         \
    }

/* m contiguous values of type T from p into the block, flushing each full block */
#define ROW_LOOP_N(T, M)                                                          \
    {                                                                             \
        const T *src = (const T *)p;                                              \
        for (Py_ssize_t i = 0; i < (M); i++) {                                    \
            blk[(*k)++] = (double)src[i];                                         \
            if (*k == BLOCK) {                                                    \
                flush_block(acc, blk, *k, 1);                                     \
                *k = 0;                                                           \
            }                                                                     \
        }                                                                         \
    }

/* How many of n bytes are not zero (true bools: NumPy reads any byte but 0 as true). 32 bytes
 * a step with vector extensions where the compiler has them: each lane counts in a byte (a
 * lane's -1 where a byte is not zero, subtracted), at most 255 steps before the lanes are
 * added up; ~20 times the byte-at-a-time loop's speed, which GCC -O2 does not vectorise. */
#ifdef VEC_STATS
typedef uint8_t v32u8 __attribute__((vector_size(32)));
#define COUNT_CLONES CLONES
#else
#define COUNT_CLONES
#endif
COUNT_CLONES static size_t count_true(const uint8_t *b, size_t n) {
    size_t c = 0, i = 0;
#ifdef VEC_STATS
    while (n - i >= 32) {
        size_t steps = (n - i) / 32;
        if (steps > 255) steps = 255;
        v32u8 lanes = {0};
        for (size_t k = 0; k < steps; k++, i += 32) {
            v32u8 v;
            memcpy(&v, b + i, 32);
            lanes -= (v32u8)(v != 0);
        }
        for (int k = 0; k < 32; k++) c += lanes[k];
    }
#endif
    for (; i < n; i++) c += b[i] != 0;
    return c;
}

#define AS_DOUBLE(x) ((double)(x))
#define AS_BOOL(x) ((double)((x) != 0))
static void stats_row(Acc *acc, double *blk, size_t *k, int t, const char *p, Py_ssize_t n,
                      Py_ssize_t step) {
#ifdef VEC_STATS
    /* contiguous float32 / float64: BLOCK-long runs straight from memory; a run holding a
     * NaN or an inf goes through the block below, which counts them */
    if ((t == T_F32 || t == T_F64) && step == t_size[t]) {
        while (n > 0) {
            Py_ssize_t m = n < BLOCK ? n : BLOCK;
            int done = t == T_F32 ? f32_run(acc, (const float *)p, (size_t)m)
                                  : f64_run(acc, (const double *)p, (size_t)m);
            if (!done) {
                if (t == T_F32) {
                    ROW_LOOP_N(float, m)
                } else {
                    ROW_LOOP_N(double, m)
                }
            }
            p += m * step;
            n -= m;
        }
        return;
    }
#endif
    if (t == T_BOOL && step == 1 && n > 0) {
        /* a contiguous bool run: its statistics follow from the count of true values
         * (mean p = c / n, squared deviations c (n - c) / n, exact) */
        size_t c = count_true((const uint8_t *)p, (size_t)n);
        double dn = (double)n, dc = (double)c;
        acc_merge(acc, dn, dc / dn, dc * (dn - dc) / dn, c < (size_t)n ? 0.0 : 1.0,
                  c > 0 ? 1.0 : 0.0);
        return;
    }
    switch (t) {
    case T_BOOL: ROW_LOOP(uint8_t, AS_BOOL, 0) break;
    case T_I8: ROW_LOOP(int8_t, AS_DOUBLE, 0) break;
    case T_U8: ROW_LOOP(uint8_t, AS_DOUBLE, 0) break;
    case T_I16: ROW_LOOP(int16_t, AS_DOUBLE, 0) break;
    case T_U16: ROW_LOOP(uint16_t, AS_DOUBLE, 0) break;
    case T_I32: ROW_LOOP(int32_t, AS_DOUBLE, 0) break;
    case T_U32: ROW_LOOP(uint32_t, AS_DOUBLE, 0) break;
    case T_I64: ROW_LOOP(int64_t, AS_DOUBLE, 0) break;
    case T_U64: ROW_LOOP(uint64_t, AS_DOUBLE, 0) break;
    case T_F16: ROW_LOOP(uint16_t, half_to_double, 1) break;
    case T_BF16: ROW_LOOP(uint16_t, bf16_to_double, 1) break;
    case T_F32: ROW_LOOP(float, AS_DOUBLE, 1) break;
    case T_F64: ROW_LOOP(double, AS_DOUBLE, 1) break;
    }
}

/* Statistics of an n-d strided array (strides in bytes, any sign): the innermost dimension
 * is read row by row, the others walked with an odometer; no copy of the array is made.
 * The statistics do not depend on the order the elements are read in (only the sums'
 * rounding does), so the dimensions are first put in memory order: negative strides
 * flipped, then sorted by stride, largest first. A transposed or reversed view of dense
 * memory (``a.T``, ``a[::-1]``) is then one contiguous run, read by the vector kernels. */
static void stats_strided(Acc *acc, int t, const char *base, int ndim, const Py_ssize_t *shape,
                          const Py_ssize_t *strides) {
    double blk[BLOCK];
    size_t k = 0;
    Py_ssize_t idx[64];
    int nd = 0, nm = 0;
    Py_ssize_t sh[64], st[64], msh[64], mst[64];
    /* drop dimensions of size 1; flip negative strides; sort by stride (insertion) */
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 0) return;
        if (shape[i] == 1) continue;
        Py_ssize_t s_ = strides[i];
        if (s_ < 0) {
            base += (shape[i] - 1) * s_;
            s_ = -s_;
        }
        int j = nm++;
        while (j > 0 && mst[j - 1] < s_) {
            mst[j] = mst[j - 1];
            msh[j] = msh[j - 1];
            j--;
        }
        mst[j] = s_;
        msh[j] = shape[i];
    }
    /* merge dimensions that are contiguous with each other */
    for (int i = 0; i < nm; i++) {
        if (nd && st[nd - 1] == mst[i] * msh[i]) {
            sh[nd - 1] *= msh[i];
            st[nd - 1] = mst[i];
            continue;
        }
        sh[nd] = msh[i];
        st[nd] = mst[i];
        nd++;
    }
    if (nd == 0) {
        sh[0] = 1;
        st[0] = t_size[t];
        nd = 1;
    }
    Py_ssize_t n = sh[nd - 1], step = st[nd - 1];
    for (int i = 0; i < nd - 1; i++) idx[i] = 0;
    for (;;) {
        const char *p = base;
        for (int i = 0; i < nd - 1; i++) p += idx[i] * st[i];
        stats_row(acc, blk, &k, t, p, n, step);
        int d = nd - 2;
        while (d >= 0 && ++idx[d] == sh[d]) idx[d--] = 0;
        if (d < 0) break;
    }
    flush_block(acc, blk, k, t >= T_F16);
}

static PyObject *acc_result(const Acc *acc) {
    if (acc->n == 0)
        return Py_BuildValue("(OOOOLL)", Py_None, Py_None, Py_None, Py_None,
                             (long long)acc->nan, (long long)acc->inf);
    return Py_BuildValue("(ddddLL)", acc->mn, acc->mx, acc->mean, sqrt(acc->m2 / acc->n),
                         (long long)acc->nan, (long long)acc->inf);
}

static void run_acc(Acc *acc, int t, const char *buf, int ndim, const Py_ssize_t *shape,
                    const Py_ssize_t *strides) {
    size_t count = 1;
    for (int i = 0; i < ndim; i++) count *= (size_t)shape[i];
    PyThreadState *ts = count > 65536 ? PyEval_SaveThread() : NULL;
    stats_strided(acc, t, buf, ndim, shape, strides);
    if (ts) PyEval_RestoreThread(ts);
}

static PyObject *run_stats(int t, const char *buf, int ndim, const Py_ssize_t *shape,
                           const Py_ssize_t *strides) {
    Acc acc = {0, 0, 0, 0, 0, 0, 0};
    run_acc(&acc, t, buf, ndim, shape, strides);
    return acc_result(&acc);
}

/* the element type of a buffer (PEP 3118 format, native or little-endian), or -1 */
static int buffer_type(const Py_buffer *v) {
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    int t = -1;
    if (!f[0] || f[1] || v->ndim > 64) return -1;
    switch (f[0]) {
    case '?': t = T_BOOL; break;
    case 'b': t = T_I8; break;
    case 'B': t = T_U8; break;
    case 'h': t = T_I16; break;
    case 'H': t = T_U16; break;
    case 'i': t = T_I32; break;
    case 'I': t = T_U32; break;
    case 'l': case 'q': t = T_I64; break;
    case 'L': case 'Q': t = T_U64; break;
    case 'e': t = T_F16; break;
    case 'f': t = T_F32; break;
    case 'd': t = T_F64; break;
    }
    if (t >= 0 && v->itemsize != t_size[t]) return -1;
    if (t >= 0 && v->ndim > 0 && (!v->shape || !v->strides)) return -1;
    return t;
}

/* stats(array) -> (min, max, mean, std, nan, inf), or None: not an array of a type handled
 * here (the caller's Python path takes it). Any strides: no copy is made. */
static PyObject *py_stats(PyObject *self, PyObject *obj) {
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    int t = buffer_type(&v);
    if (t < 0) {
        PyBuffer_Release(&v);
        Py_RETURN_NONE;
    }
    PyObject *r = run_stats(t, (const char *)v.buf, v.ndim, v.shape, v.strides);
    PyBuffer_Release(&v);
    return r;
}

/* An Acc as the capsules give it: v4 min, max, mean, std (NaN where there are no finite
 * values), c2 the NaN and inf counts */
static void acc_out(const Acc *acc, double *v4, long long *c2) {
    if (acc->n == 0) {
        v4[0] = v4[1] = v4[2] = v4[3] = Py_NAN;
    } else {
        v4[0] = acc->mn;
        v4[1] = acc->mx;
        v4[2] = acc->mean;
        v4[3] = sqrt(acc->m2 / acc->n);
    }
    c2[0] = acc->nan;
    c2[1] = acc->inf;
}

/* The same for pprobe._native (through the capsule _C_STATS, no Python call): 1 done (v: min,
 * max, mean, std, NaN where there are no finite values; c: NaN and inf counts), 0 not handled
 * here (no exception set). */
static int c_stats(PyObject *obj, double *v4, long long *c2) {
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        return 0;
    }
    int t = buffer_type(&v);
    if (t < 0) {
        PyBuffer_Release(&v);
        return 0;
    }
    Acc acc = {0, 0, 0, 0, 0, 0, 0};
    run_acc(&acc, t, (const char *)v.buf, v.ndim, v.shape, v.strides);
    PyBuffer_Release(&v);
    acc_out(&acc, v4, c2);
    return 1;
}

/* The statistics of the elements at addr (shape, strides in bytes), into acc: 1 done, 0 not
 * readable here (a null address with elements; no exception set). */
static int acc_at(Acc *acc, int t, void *addr, Py_ssize_t nd, const Py_ssize_t *shape,
                  const Py_ssize_t *strides) {
    if (!addr) {
        for (Py_ssize_t i = 0; i < nd; i++)
            if (shape[i] == 0) return 1; /* no elements: the empty result */
        return 0;
    }
    run_acc(acc, t, (const char *)addr, (int)nd, shape, strides);
    return 1;
}

/* shape and strides (elements) from two tuples of ints into byte strides: 0 done, -1 an
 * exception set (not ints, a negative dimension, too many dimensions) */
static int take_dims(int t, PyObject *shp, PyObject *std, Py_ssize_t *nd, Py_ssize_t *shape,
                     Py_ssize_t *strides) {
    Py_ssize_t n = PyTuple_GET_SIZE(shp);
    if (n > 64 || PyTuple_GET_SIZE(std) != n) {
        PyErr_SetString(PyExc_ValueError, "stats_at: bad type code or dimensions");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        shape[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shp, i));
        strides[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(std, i)) * t_size[t];
        if (PyErr_Occurred()) return -1;
        if (shape[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "stats_at: negative dimension");
            return -1;
        }
    }
    *nd = n;
    return 0;
}

/* stats_at(address, type code, shape, strides in elements) -> the same tuple: the elements of
 * a tensor whose owner keeps the memory alive for the call (a CPU torch tensor, read through
 * data_ptr(), shape and stride(): no ndarray is made). */
static PyObject *py_stats_at(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    if (na != 4 || !PyTuple_Check(a[2]) || !PyTuple_Check(a[3])) {
        PyErr_SetString(PyExc_TypeError, "stats_at(address, code, shape, strides)");
        return NULL;
    }
    void *addr = PyLong_AsVoidPtr(a[0]);
    long t = PyLong_AsLong(a[1]);
    if (PyErr_Occurred()) return NULL;
    if (t < 0 || t >= T_NTYPES) {
        PyErr_SetString(PyExc_ValueError, "stats_at: bad type code or dimensions");
        return NULL;
    }
    Py_ssize_t nd, shape[64], strides[64];
    if (take_dims((int)t, a[2], a[3], &nd, shape, strides) < 0) return NULL;
    Acc acc = {0, 0, 0, 0, 0, 0, 0};
    if (!acc_at(&acc, (int)t, addr, nd, shape, strides)) {
        PyErr_SetString(PyExc_ValueError, "stats_at: null address");
        return NULL;
    }
    return acc_result(&acc);
}

/* ------------------------------------------------------------------ CPU torch tensors */
/* stats_tensor(x): torch_values.native_cpu_stats's checks and reads done here through the
 * CPython API (no torch headers), in the same order and with the same conditions: a plain
 * tensor type, no torch function mode, a dtype of the table, on the CPU, strided, not nested,
 * not a negative view, not functorch-wrapped; then data_ptr(), shape and stride() into the
 * kernel. Set up once by tensor_setup() with the types, the table and the functions it calls;
 * before that, and for anything else, the answer is "not handled" (None, or 0 through the
 * capsule _C_TENSOR_STATS that pprobe._native calls). */
static PyObject *tz_plain = NULL;     /* tuple of the plain tensor types */
static PyObject *tz_codes = NULL;     /* dict: torch.dtype -> type code */
static PyObject *tz_strided = NULL;   /* torch.strided */
static PyObject *tz_tf_mode = NULL;   /* torch._C._is_torch_function_mode_enabled */
static PyObject *tz_functorch = NULL; /* is_functorch_wrapped_tensor, or None */
static PyObject *tz_typestr = NULL;   /* dict: torch.dtype -> NumPy's type string (dumps) */
static PyObject *tz_dtype, *tz_is_cpu, *tz_layout, *tz_is_nested, *tz_is_neg, *tz_data_ptr,
    *tz_shape, *tz_stride, *tz_is_contiguous, *tz_is_conj, *tz_numel;

/* the attribute and method names both tensor readers look up (stats_tensor, grad_columns),
 * interned once: 0, or -1 with an exception */
static int tz_intern(void) {
    static const char *names[11] = {"dtype",  "is_cpu",   "layout", "is_nested",
                                    "is_neg", "data_ptr", "shape",  "stride",
                                    "is_contiguous", "is_conj", "numel"};
    PyObject **slots[11] = {&tz_dtype,  &tz_is_cpu,   &tz_layout, &tz_is_nested,
                            &tz_is_neg, &tz_data_ptr, &tz_shape,  &tz_stride,
                            &tz_is_contiguous, &tz_is_conj, &tz_numel};
    for (int i = 0; i < 11; i++)
        if (!*slots[i] && !(*slots[i] = PyUnicode_InternFromString(names[i]))) return -1;
    return 0;
}

static int tz_plain_type(PyTypeObject *tp) {
    Py_ssize_t n = PyTuple_GET_SIZE(tz_plain);
    for (Py_ssize_t i = 0; i < n; i++)
        if ((PyObject *)tp == PyTuple_GET_ITEM(tz_plain, i)) return 1;
    return 0;
}

/* the truth of v, a new reference it releases: 1, 0, or -1 (v NULL: an exception is set) */
static int tz_true(PyObject *v) {
    if (!v) return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* 1: true, 0: false, -1: an exception (the attribute or the call failed) */
static int tz_attr_true(PyObject *x, PyObject *name) { return tz_true(PyObject_GetAttr(x, name)); }

static int tz_call_true(PyObject *fn, PyObject *x) {
    return tz_true(x ? PyObject_CallOneArg(fn, x) : PyObject_CallNoArgs(fn));
}

static PyObject *tz_method(PyObject *x, PyObject *name) {
    PyObject *args[1] = {x};
    return PyObject_VectorcallMethod(name, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* x.name() is true: 1, 0, or -1 (an exception) */
static int tz_method_true(PyObject *x, PyObject *name) { return tz_true(tz_method(x, name)); }

/* The statistics' reads of this thread's tensors, kept for the dump of the same tensors in
 * the same phase of a call (pprobe._native arms it, through the capsule _C_TENSOR_MEMO,
 * before it describes a dump-mode call's inputs or outputs, and clears it when it has dumped
 * them): a call's arrays are all described, then dumped, with no program code in between,
 * so each tensor's checked read (ten attribute reads and calls through torch) is made once,
 * and its dump asks only what the statistics did not (is_conj). Keyed by the tensor
 * object, alive for the whole phase (the call holds it); cleared at every arming, so that an
 * entry never outlives its phase. Thread-local: each thread records its own calls. */
#define MEMO_N 16
#define MEMO_DIMS 8
typedef struct {
    PyObject *x;  /* borrowed: the phase's descriptions hold it */
    PyObject *dt; /* its dtype (a new reference) */
    int t;
    void *addr;
    Py_ssize_t nd, shape[MEMO_DIMS], strides[MEMO_DIMS];
} Memo;
static __thread Memo memo[MEMO_N];
static __thread int memo_n = 0, memo_on = 0;

static void memo_clear(void) {
    for (int i = 0; i < memo_n; i++) Py_CLEAR(memo[i].dt);
    memo_n = 0;
}

/* for pprobe._native (the capsule _C_TENSOR_MEMO): on 1, forget and keep the reads from now
 * on; 0, forget and keep none (the GIL held) */
static void c_tensor_memo(int on) {
    memo_clear();
    memo_on = on;
}

/* A plain CPU tensor's elements, with the checks both readers make (stats_tensor, the
 * dumps' tensor_mem): 1 read (its type code, address, shape and byte strides; *dt the
 * tensor's dtype, a new reference, when dt is not NULL), 0 not handled here (no exception
 * set). conj: a conjugate view is not handled either (the dumps' rule, torch_values.dumpable). */
static int tensor_read(PyObject *x, int *t_out, void **addr_out, Py_ssize_t *nd,
                       Py_ssize_t *shape, Py_ssize_t *strides, PyObject **dt_out, int conj) {
    if (!tz_plain || !tz_plain_type(Py_TYPE(x))) return 0;
    int t = -1, r;
    if (conj) { /* a dump: the statistics' read of the same tensor in this phase, if kept */
        for (int i = 0; i < memo_n; i++) {
            Memo *m = &memo[i];
            if (m->x != x) continue;
            int c = tz_method_true(x, tz_is_conj);
            PyErr_Clear();
            if (c != 0) return 0;
            *t_out = m->t;
            *addr_out = m->addr;
            *nd = m->nd;
            memcpy(shape, m->shape, (size_t)m->nd * sizeof *shape);
            memcpy(strides, m->strides, (size_t)m->nd * sizeof *strides);
            if (dt_out) *dt_out = Py_NewRef(m->dt);
            return 1;
        }
    }
    PyObject *dt = NULL, *layout = NULL, *ptr = NULL, *shp = NULL, *std = NULL;
    if ((r = tz_call_true(tz_tf_mode, NULL)) != 0) goto out;
    if (!(dt = PyObject_GetAttr(x, tz_dtype))) goto out;
    PyObject *code = PyDict_GetItemWithError(tz_codes, dt); /* borrowed */
    if (!code) goto out;
    t = (int)PyLong_AsLong(code);
    if (t < 0 || t >= T_NTYPES) goto out;
    if ((r = tz_attr_true(x, tz_is_cpu)) != 1) goto out;
    if (!(layout = PyObject_GetAttr(x, tz_layout)) || layout != tz_strided) goto out;
    if ((r = tz_attr_true(x, tz_is_nested)) != 0) goto out;
    if (conj && (r = tz_method_true(x, tz_is_conj)) != 0) goto out;
    if ((r = tz_method_true(x, tz_is_neg)) != 0) goto out;
    if (tz_functorch != Py_None && (r = tz_call_true(tz_functorch, x)) != 0) goto out;
    if (!(ptr = tz_method(x, tz_data_ptr)) || !(shp = PyObject_GetAttr(x, tz_shape)) ||
        !(std = tz_method(x, tz_stride)))
        goto out;
    if (!PyTuple_Check(shp) || !PyTuple_Check(std)) goto out;
    void *addr = PyLong_AsVoidPtr(ptr);
    if (PyErr_Occurred() || take_dims(t, shp, std, nd, shape, strides) < 0) goto out;
    *t_out = t;
    *addr_out = addr;
    if (dt_out) *dt_out = Py_NewRef(dt);
    if (!conj && memo_on && memo_n < MEMO_N && *nd <= MEMO_DIMS) { /* kept for its dump */
        Memo *m = &memo[memo_n++];
        m->x = x;
        m->dt = Py_NewRef(dt);
        m->t = t;
        m->addr = addr;
        m->nd = *nd;
        memcpy(m->shape, shape, (size_t)*nd * sizeof *shape);
        memcpy(m->strides, strides, (size_t)*nd * sizeof *strides);
    }
    Py_DECREF(dt);
    Py_DECREF(layout);
    Py_DECREF(ptr);
    Py_DECREF(shp);
    Py_DECREF(std);
    return 1;
out:
    PyErr_Clear(); /* whatever failed, the general path sees the same tensor */
    Py_XDECREF(dt);
    Py_XDECREF(layout);
    Py_XDECREF(ptr);
    Py_XDECREF(shp);
    Py_XDECREF(std);
    return 0;
}

/* 1: statted into acc; 0: not handled here (no exception set) */
static int tensor_acc(PyObject *x, Acc *acc) {
    int t;
    void *addr;
    Py_ssize_t nd, shape[64], strides[64];
    if (!tensor_read(x, &t, &addr, &nd, shape, strides, NULL, 0)) return 0;
    return acc_at(acc, t, addr, nd, shape, strides);
}

/* for pprobe._native (the capsule _C_TENSOR_MEM): the memory of a plain CPU tensor whose
 * dump is its memory as it is, as torch_values.dumpable reads it (host_array) for a dtype
 * NumPy has: C-contiguous (NumPy's relaxed rule: dimensions of 1 have any stride), with
 * elements, not a conjugate or negative view. 1: *addr, *nbytes, *nd, shape (up to 64) and
 * *typestr (NumPy's type string, borrowed from the table); 0: not handled (no exception). */
static int c_tensor_mem(PyObject *x, void **addr, Py_ssize_t *nbytes, int *nd_out,
                        Py_ssize_t *shape, PyObject **typestr) {
    if (!tz_typestr) return 0;
    int t;
    Py_ssize_t nd, strides[64];
    PyObject *dt = NULL;
    if (!tensor_read(x, &t, addr, &nd, shape, strides, &dt, 1)) return 0;
    PyObject *ts = PyDict_GetItemWithError(tz_typestr, dt); /* borrowed, the table holds it */
    Py_DECREF(dt);
    if (!ts) {
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t n = t_size[t];
    for (Py_ssize_t i = nd - 1; i >= 0; i--) {
        if (shape[i] == 0) return 0; /* no elements: Python's empty array */
        if (shape[i] != 1 && strides[i] != n) return 0;
        n *= shape[i];
    }
    if (!*addr) return 0;
    *nbytes = n;
    *nd_out = (int)nd;
    *typestr = ts;
    return 1;
}

static PyObject *py_stats_tensor(PyObject *self, PyObject *x) {
    Acc acc = {0, 0, 0, 0, 0, 0, 0};
    if (!tensor_acc(x, &acc)) Py_RETURN_NONE;
    return acc_result(&acc);
}

/* for pprobe._native (the capsule _C_TENSOR_STATS): as c_stats */
static int c_tensor_stats(PyObject *x, double *v4, long long *c2) {
    Acc acc = {0, 0, 0, 0, 0, 0, 0};
    if (!tensor_acc(x, &acc)) return 0;
    acc_out(&acc, v4, c2);
    return 1;
}

/* tensor_setup(plain types, {dtype: code}, torch.strided, tf_mode_enabled, functorch|None[,
 * {dtype: NumPy type string}]): the last for the dumps (c_tensor_mem) */
static PyObject *py_tensor_setup(PyObject *self, PyObject *args) {
    PyObject *plain, *codes, *strided, *tf, *ft, *typestr = NULL;
    if (!PyArg_ParseTuple(args, "O!O!OOO|O!:tensor_setup", &PyTuple_Type, &plain, &PyDict_Type,
                          &codes, &strided, &tf, &ft, &PyDict_Type, &typestr))
        return NULL;
    if (!PyCallable_Check(tf) || (ft != Py_None && !PyCallable_Check(ft))) {
        PyErr_SetString(PyExc_TypeError, "tensor_setup: the checks must be callable");
        return NULL;
    }
    if (tz_intern() < 0) return NULL;
    Py_XSETREF(tz_codes, Py_NewRef(codes));
    Py_XSETREF(tz_strided, Py_NewRef(strided));
    Py_XSETREF(tz_tf_mode, Py_NewRef(tf));
    Py_XSETREF(tz_functorch, Py_NewRef(ft));
    Py_XSETREF(tz_typestr, Py_XNewRef(typestr));
    Py_XSETREF(tz_plain, Py_NewRef(plain)); /* last: it turns the reads on */
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ gradient statistics */
/* GradientFlowHook's per-gradient numbers: sum of squares, sum, min, max, non-zeros, NaNs and
 * infs of contiguous float16/bfloat16/float32/float64 memory, accumulated in double. Sums
 * and the sum of squares take every element as torch's norm() and sum() do (a NaN or an inf
 * makes them NaN or inf); min and max are NaN when a NaN is there, as torch.aminmax says. */
typedef struct {
    const char *p;
    int t;
    Py_ssize_t n;
    double ss, s, lo, hi;
    long long nz, nan, inf;
} GJob;

#define GRAD_LOOP(T, CONV)                                   \
    do {                                                     \
        const T *x = (const T *)j->p;                        \
        for (Py_ssize_t i = 0; i < n; i++) {                 \
            double v = CONV(x[i]);                           \
            s += v;                                          \
            ss += v * v;                                     \
            lo = v < lo ? v : lo;                            \
            hi = v > hi ? v : hi;                            \
            nz += v != 0;                                    \
        }                                                    \
    } while (0)
#define F16_D(h) half_to_double(h)
#define BF16_D(h) bf16_to_double(h)

#ifdef VEC_STATS
#ifdef F32_AVX2
/* grad_f32 for AVX2 CPUs, with intrinsics (see f32_run_avx2): 16 floats a step, four double
 * accumulators per sum, min and max with vminps / vmaxps (a NaN lane keeps the running
 * value: NaN never wins, as in GRAD_LOOP), non-zeros counted by lane masks (unordered: a NaN
 * is not zero). grad_f32's scalar tail takes the rest. Sums may differ from the portable
 * loop's in the last bits (another order of additions). */
__attribute__((target("avx2"))) static Py_ssize_t grad_f32_avx2(const float *x, Py_ssize_t n16,
                                                                  double *s_, double *ss_,
                                                                  float *lo_, float *hi_,
                                                                  long long *nz_) {
    const __m256 zero = _mm256_setzero_ps();
    __m256 mn0 = _mm256_set1_ps(INFINITY), mn1 = mn0, mx0 = _mm256_set1_ps(-INFINITY),
           mx1 = mx0;
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0, q0 = s0, q1 = s0, q2 = s0,
            q3 = s0;
    __m256i c0 = _mm256_setzero_si256(), c1 = c0;
    Py_ssize_t i = 0;
    for (; i < n16; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        mn0 = _mm256_min_ps(a, mn0);
        mn1 = _mm256_min_ps(b, mn1);
        mx0 = _mm256_max_ps(a, mx0);
        mx1 = _mm256_max_ps(b, mx1);
        c0 = _mm256_sub_epi32(c0, _mm256_castps_si256(_mm256_cmp_ps(a, zero, _CMP_NEQ_UQ)));
        c1 = _mm256_sub_epi32(c1, _mm256_castps_si256(_mm256_cmp_ps(b, zero, _CMP_NEQ_UQ)));
        __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(a));
        __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1));
        __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(b));
        __m256d d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1));
        s0 = _mm256_add_pd(s0, d0);
        s1 = _mm256_add_pd(s1, d1);
        s2 = _mm256_add_pd(s2, d2);
        s3 = _mm256_add_pd(s3, d3);
        q0 = _mm256_add_pd(q0, _mm256_mul_pd(d0, d0));
        q1 = _mm256_add_pd(q1, _mm256_mul_pd(d1, d1));
        q2 = _mm256_add_pd(q2, _mm256_mul_pd(d2, d2));
        q3 = _mm256_add_pd(q3, _mm256_mul_pd(d3, d3));
    }
    double t[4], u[4];
    _mm256_storeu_pd(t, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
    _mm256_storeu_pd(u, _mm256_add_pd(_mm256_add_pd(q0, q1), _mm256_add_pd(q2, q3)));
    *s_ = (t[0] + t[1]) + (t[2] + t[3]);
    *ss_ = (u[0] + u[1]) + (u[2] + u[3]);
    float l[8], h[8];
    int32_t c[8];
    _mm256_storeu_ps(l, _mm256_min_ps(mn0, mn1));
    _mm256_storeu_ps(h, _mm256_max_ps(mx0, mx1));
    _mm256_storeu_si256((__m256i *)c, _mm256_add_epi32(c0, c1));
    float lo = INFINITY, hi = -INFINITY;
    long long nz = 0;
    for (int k = 0; k < 8; k++) {
        if (l[k] < lo) lo = l[k];
        if (h[k] > hi) hi = h[k];
        nz += c[k];
    }
    *lo_ = lo, *hi_ = hi, *nz_ = nz;
    return i;
}
#endif

/* GRAD_LOOP for float32, 8 lanes (the common gradient): sums in double, min/max in float
 * (NaN never wins a comparison, as in GRAD_LOOP), non-zeros counted by lane masks */
CLONES static void grad_f32(const float *x, Py_ssize_t n, double *s_, double *ss_, double *lo_,
                            double *hi_, long long *nz_) {
    Py_ssize_t i = 0, n8 = n & ~(Py_ssize_t)7;
    double s = 0, ss = 0, lo = INFINITY, hi = -INFINITY;
    long long nz = 0;
#ifdef F32_AVX2
    if (g_avx2 && n >= 16) {
        float flo, fhi;
        i = grad_f32_avx2(x, n & ~(Py_ssize_t)15, &s, &ss, &flo, &fhi, &nz);
        lo = flo, hi = fhi;
        n8 = 0; /* the scalar tail below takes the rest */
    }
#endif
    if (n8) {
        v4d s0 = {0}, s1 = {0}, q0 = {0}, q1 = {0};
        v8f vmn = {INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY,
                   INFINITY};
        v8f vmx = -vmn;
        v8i cnt = {0};
        for (; i < n8; i += 8) {
            v8f v;
            memcpy(&v, x + i, 32);
            v4d a = LO4(v), b = HI4(v);
            s0 += a;
            s1 += b;
            q0 += a * a;
            q1 += b * b;
            v8i lt = v < vmn, gt = v > vmx;
            vmn = (v8f)(((v8i)v & lt) | ((v8i)vmn & ~lt));
            vmx = (v8f)(((v8i)v & gt) | ((v8i)vmx & ~gt));
            cnt -= v != 0; /* a true lane is -1 */
        }
        v4d t = s0 + s1, u = q0 + q1;
        s = (t[0] + t[1]) + (t[2] + t[3]);
        ss = (u[0] + u[1]) + (u[2] + u[3]);
        for (int k = 0; k < 8; k++) {
            if (vmn[k] < lo) lo = vmn[k];
            if (vmx[k] > hi) hi = vmx[k];
            nz += cnt[k];
        }
    }
    for (; i < n; i++) {
        double v = x[i];
        s += v;
        ss += v * v;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        nz += v != 0;
    }
    *s_ = s, *ss_ = ss, *lo_ = lo, *hi_ = hi, *nz_ = nz;
}
#endif

static void grad_one(GJob *j) {
    double ss = 0, s = 0, lo = INFINITY, hi = -INFINITY;
    long long nz = 0, nan = 0, inf = 0;
    Py_ssize_t n = j->n;
    switch (j->t) {
#ifdef VEC_STATS
    case T_F32:
        if (n < ((Py_ssize_t)1 << 34)) { /* each lane's non-zero count fits in 32 bits */
            grad_f32((const float *)j->p, n, &s, &ss, &lo, &hi, &nz);
            break;
        }
        GRAD_LOOP(float, AS_DOUBLE);
        break;
#else
    case T_F32: GRAD_LOOP(float, AS_DOUBLE); break;
#endif
    case T_F64: GRAD_LOOP(double, AS_DOUBLE); break;
    case T_F16: GRAD_LOOP(uint16_t, F16_D); break;
    default: GRAD_LOOP(uint16_t, BF16_D); break;
    }
    if (!isfinite(ss)) { /* rare: count what is not finite (a second pass) */
        for (Py_ssize_t i = 0; i < n; i++) {
            double v = load(j->t, j->p + i * t_size[j->t]);
            nan += v != v;
            inf += isinf(v) != 0;
        }
    }
    if (nan) lo = hi = NAN;
    if (n == 0) lo = hi = 0;
    j->ss = ss, j->s = s, j->lo = lo, j->hi = hi, j->nz = nz, j->nan = nan, j->inf = inf;
}

/* grad_columns(grads, tensor_type, strided, codes) -> (norm, max_abs, mean, zero_frac,
 * nan_count, inf_count), a list each, one item per grad: GradientFlowHook's columns of
 * plain contiguous CPU tensors, read and computed here (the attribute reads included: the
 * caller has disabled torch function modes). None when one grad is not such a tensor
 * (``type(g) is tensor_type``, ``g.is_cpu``, ``g.layout is strided``, ``codes[g.dtype]`` a
 * floating code, ``g.is_contiguous()``, not ``g.is_neg()`` / ``g.is_conj()``): the caller's
 * general path then gives the same numbers. max_abs is Python's max(-min, max) (NaN: max). */
/* the job of one grad: 1 done, 0 not such a tensor, -1 error */
static int grad_job(PyObject *g, PyObject *tensor_type, PyObject *strided, PyObject *codes,
                    GJob *j) {
    if ((PyObject *)Py_TYPE(g) != tensor_type) return 0;
    int r = tz_attr_true(g, tz_is_cpu);
    if (r != 1) return r;
    PyObject *v = PyObject_GetAttr(g, tz_layout);
    if (!v) return -1;
    Py_DECREF(v); /* identity only: strided is kept alive by the caller */
    if (v != strided) return 0;
    if (!(v = PyObject_GetAttr(g, tz_dtype))) return -1;
    PyObject *code = PyDict_GetItemWithError(codes, v);
    Py_DECREF(v);
    if (!code) return PyErr_Occurred() ? -1 : 0;
    long t = PyLong_AsLong(code);
    if (t == -1 && PyErr_Occurred()) return -1;
    if (t != T_F16 && t != T_BF16 && t != T_F32 && t != T_F64) return 0;
    if ((r = tz_method_true(g, tz_is_contiguous)) != 1) return r;
    if ((r = tz_method_true(g, tz_is_neg)) != 0) return r == 1 ? 0 : -1;
    if ((r = tz_method_true(g, tz_is_conj)) != 0) return r == 1 ? 0 : -1;
    if (!(v = tz_method(g, tz_data_ptr))) return -1;
    j->p = (const char *)PyLong_AsVoidPtr(v);
    Py_DECREF(v);
    if (!(v = tz_method(g, tz_numel))) return -1;
    j->n = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    if (PyErr_Occurred()) return -1;
    if (j->n < 0 || (!j->p && j->n)) return 0;
    j->t = (int)t;
    return 1;
}

static PyObject *py_grad_columns(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    if (na != 4 || !PyDict_Check(a[3])) {
        PyErr_SetString(PyExc_TypeError, "grad_columns(grads, tensor_type, strided, codes)");
        return NULL;
    }
    if (tz_intern() < 0) return NULL;
    PyObject *fast = PySequence_Fast(a[0], "grad_columns: a list of tensors");
    if (!fast) return NULL;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(fast);
    GJob *jobs = PyMem_Calloc(m ? (size_t)m : 1, sizeof(GJob));
    PyObject *out = NULL, *cols[6] = {NULL};
    if (!jobs) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        int r = grad_job(PySequence_Fast_GET_ITEM(fast, i), a[1], a[2], a[3], &jobs[i]);
        if (r < 0) goto done;
        if (r == 0) {
            out = Py_NewRef(Py_None);
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < m; i++) grad_one(&jobs[i]);
    Py_END_ALLOW_THREADS;
    for (int c = 0; c < 6; c++)
        if (!(cols[c] = PyList_New(m))) goto done;
    for (Py_ssize_t i = 0; i < m; i++) {
        GJob *j = &jobs[i];
        double size = j->n > 0 ? (double)j->n : 1.0;
        double mx = (j->lo != j->lo || j->hi != j->hi) ? j->hi : (j->hi > -j->lo ? j->hi : -j->lo);
        PyObject *v[6] = {PyFloat_FromDouble(sqrt(j->ss)), PyFloat_FromDouble(mx),
                          PyFloat_FromDouble(j->s / size),
                          PyFloat_FromDouble((double)(j->n - j->nz) / size),
                          PyLong_FromLongLong(j->nan), PyLong_FromLongLong(j->inf)};
        for (int c = 0; c < 6; c++) {
            if (!v[c]) {
                for (int k = 0; k < 6; k++) Py_XDECREF(v[k]);
                goto done;
            }
        }
        for (int c = 0; c < 6; c++) PyList_SET_ITEM(cols[c], i, v[c]);
    }
    out = PyTuple_Pack(6, cols[0], cols[1], cols[2], cols[3], cols[4], cols[5]);
done:
    for (int c = 0; c < 6; c++) Py_XDECREF(cols[c]);
    PyMem_Free(jobs);
    Py_DECREF(fast);
    return out;
}

/* crc32(data, value=0, portable=False): zlib.crc32 by the pack writer's code (the tests
 * compare both implementations with zlib; portable: the tables even where folding runs) */
static PyObject *py_crc32(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"data", "value", "portable", NULL};
    Py_buffer b;
    unsigned int value = 0;
    int portable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|Ip:crc32", kwlist, &b, &value, &portable))
        return NULL;
    uint32_t crc;
    if (b.len >= 65536) {
        Py_BEGIN_ALLOW_THREADS;
        crc = crc32_any(value, b.buf, (size_t)b.len, portable);
        Py_END_ALLOW_THREADS;
    } else {
        crc = crc32_any(value, b.buf, (size_t)b.len, portable);
    }
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(crc);
}

/* ------------------------------------------------------------------ module */
static PyMethodDef methods[] = {
    {"open", dq_open, METH_VARARGS, "open(dirfd, max_bytes): the run folder and queue size"},
    {"submit", (PyCFunction)(void (*)(void))dq_submit, METH_FASTCALL,
     "submit(name, header, data, link, wait) -> queued"},
    {"set_host", dq_set_host, METH_O, "set_host(host): the host part of the pack names"},
    {"ticket", dq_ticket, METH_NOARGS, "jobs submitted so far"},
    {"wait", dq_wait, METH_VARARGS, "wait(ticket, timeout) -> every job up to ticket done"},
    {"failures", dq_failures, METH_NOARGS, "[(name, errno, message)] since the last call"},
    {"counters", dq_counters, METH_NOARGS,
     "(queued bytes, submitted, completed, files, links, failed, bytes written)"},
    {"direct", (PyCFunction)(void (*)(void))dq_direct, METH_FASTCALL,
     "direct([setting[, refuse_test]]) -> (setting, the folder takes O_DIRECT, files written "
     "O_DIRECT): large dumps written with O_DIRECT, 0 never, 1 when faster (default), 2 "
     "always; refuse_test (tests): each open creates the file, then fails with EINVAL"},
    {"hold", dq_hold, METH_O, "hold(flag) (tests): the writer takes no job until released"},
    {"helper_files", dq_helper_files, METH_NOARGS,
     "files written by the second writer thread (large files, two at once)"},
    {"pool", dq_pool, METH_NOARGS,
     "pool() -> (bytes kept, most kept, blocks reused, blocks taken fresh): the dump blocks"},
    {"close", dq_close, METH_VARARGS, "close(timeout): drain and stop the writer thread"},
    {"digest", py_digest, METH_O, "128-bit content hash of a contiguous buffer"},
    {"crc32", (PyCFunction)(void (*)(void))py_crc32, METH_VARARGS | METH_KEYWORDS,
     "crc32(data, value=0, portable=False) -> zlib.crc32(data, value); portable: the tables"},
    {"stats", py_stats, METH_O, "(min, max, mean, std, nan, inf) of an array (any strides)"},
    {"stats_at", (PyCFunction)(void (*)(void))py_stats_at, METH_FASTCALL,
     "stats_at(address, code, shape, strides) -> the same, from a tensor's memory"},
    {"grad_columns", (PyCFunction)(void (*)(void))py_grad_columns, METH_FASTCALL,
     "grad_columns(grads, tensor_type, strided, codes) -> (norm, max_abs, mean, zero_frac, "
     "nan_count, inf_count) lists, or None"},
    {"stats_tensor", py_stats_tensor, METH_O,
     "stats_tensor(tensor) -> the same of a plain CPU tensor, or None: the general path"},
    {"tensor_setup", py_tensor_setup, METH_VARARGS,
     "tensor_setup(plain types, {dtype: code}, strided, tf_mode_enabled, functorch|None)"},
    {NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "pprobe._dumpio",
                                       "pprobe's native dump writer and statistics.", -1,
                                       methods};

PyMODINIT_FUNC PyInit__dumpio(void) {
    static int forked = 0;
    if (!forked) {
        if (pthread_atfork(atfork_prepare, atfork_parent, atfork_child)) return NULL;
        forked = 1;
        crc_init();
#ifdef F32_AVX2
        __builtin_cpu_init();
        g_avx2 = __builtin_cpu_supports("avx2") != 0;
#endif
#ifdef CRC_CLMUL
        __builtin_cpu_init();
        g_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
    }
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    PyObject *cap = PyCapsule_New((void *)c_stats, "pprobe._dumpio._C_STATS", NULL);
    if (!cap || PyModule_AddObject(m, "_C_STATS", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }
    cap = PyCapsule_New((void *)c_tensor_stats, "pprobe._dumpio._C_TENSOR_STATS", NULL);
    if (!cap || PyModule_AddObject(m, "_C_TENSOR_STATS", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }
    cap = PyCapsule_New((void *)c_tensor_memo, "pprobe._dumpio._C_TENSOR_MEMO", NULL);
    if (!cap || PyModule_AddObject(m, "_C_TENSOR_MEMO", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }
    cap = PyCapsule_New((void *)c_tensor_mem, "pprobe._dumpio._C_TENSOR_MEM", NULL);
    if (!cap || PyModule_AddObject(m, "_C_TENSOR_MEM", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }
#ifdef CRC_CLMUL
    int clmul = g_clmul;
#else
    int clmul = 0;
#endif
    /* 1 where crc32 folds with PCLMULQDQ (the tests say which implementation they compared) */
    if (PyModule_AddIntConstant(m, "CRC_CLMUL", clmul) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "API", DUMPIO_API) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
