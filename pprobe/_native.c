/* pprobe's native recording core (the "native" engine; pprobe/recorder.py is its Python twin).
 *
 * What runs here, on every call of a recorded NumPy op:
 *   - the interception: each public ufunc and array-function dispatcher instance carries its
 *     own vectorcall pointer (at its type's tp_vectorcall_offset); it is pointed at
 *     probe_vectorcall, which calls the saved original. ndarray methods and ufunc methods are
 *     replaced in their type's dict by MethodProbe descriptors. No Python frame is added;
 *   - the guard: active flag (session on, step inside the window), this thread's depth,
 *     selection and every-N/first-N sampling of the op;
 *   - the call site: the first frame outside pprobe and the frameworks, cached per
 *     (code, instruction); an ndarray operator (a + b) is told from a call by the caller's
 *     opcode there;
 *   - the array descriptions (shape, dtype) of ndarrays and NumPy scalars, timestamps;
 *   - fixed-size records (pprobe/records.py) appended to a preallocated buffer.
 * Everything else (statistics and dumps, PPROBE_DTYPES, argument types it does not know) is
 * handed to the Python engine's recorder._record for that call, which appends to the same
 * buffer. Names, sites and texts are resolved by the writer, off the per-call path.
 *
 * Requires the GIL (a free-threaded build is refused at import by pprobe.core).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <unistd.h>
#include <errno.h>
#include <sys/uio.h>

#if PY_VERSION_HEX < 0x030A0000 || PY_VERSION_HEX >= 0x030E0000
#error "pprobe._native supports CPython 3.10 to 3.13"
#endif
#ifdef Py_GIL_DISABLED
#error "pprobe._native needs the GIL"
#endif

#define INTERNAL (1L << 20)
/* The interface version pprobe/core.py expects (core.API): bump on any change of init(),
 * configure() or the record layout. */
#define PPROBE_NATIVE_API 18
#define MAX_INLINE_DIMS 8

/* ------------------------------------------------------------------ records (records.py) */
typedef struct {
    int64_t seq, t0, t1;
    uint64_t thread;
    int64_t step, parent;
    int32_t op, site, depth, status, module, phase, n_descs, args;
} OpRec;

typedef struct {
    int64_t seq;
    double mn, mx, mean, std;
    int64_t nan, inf;
    int64_t dims[MAX_INLINE_DIMS];
    int32_t role, idx, ndim, dtype, device, grad, stats, path, note, shape_ref;
} DescRec;

#define STATS_NONE (-2)

/* ------------------------------------------------------------------ NumPy's array struct
 * PyArrayObject_fields from numpy/ndarraytypes.h: public and ABI-stable since NumPy 1.7.
 * Checked against the Python-visible values of a live array by numpy_init(). */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} NpyArrayFields;
#define NPY_C_CONTIGUOUS 0x0001
#define NPY_F_CONTIGUOUS 0x0002

/* Whether a dump holds the array's memory as it is, in Fortran order (the header says so, as
 * np.save's does): an array of 2 dimensions or more that is Fortran- but not C-contiguous (a
 * transpose); pprobe.dumps.fortran_order's twin */
static inline int npy_fortran(const NpyArrayFields *a) {
    return a->nd > 1 && !(a->flags & NPY_C_CONTIGUOUS) && (a->flags & NPY_F_CONTIGUOUS);
}

/* ------------------------------------------------------------------ global state */
static int g_active = 0, g_nested = 0, g_parents = 0, g_mode = 0, g_slow = 0;
static Py_ssize_t g_flush_rows = 16384;
static int64_t g_seq = 0;
static int64_t g_step = 0;

static _Thread_local long tl_depth = 0;
static _Thread_local int tl_writer = 0; /* this thread is pprobe's writer (mark_writer) */
static _Thread_local int64_t tl_parent = -1;
static _Thread_local PyObject *tl_module = NULL; /* str or NULL */
static _Thread_local PyObject *tl_phase = NULL;
/* The phase of a row when no hook set this thread's (tl_phase NULL): "init" before training
 * starts, "other" after (pprobe.phases). NULL: none. */
static PyObject *g_phase_default = NULL;
static _Thread_local int64_t tl_thread = 0; /* this thread's serial (state.note_thread) */

/* Python helpers, set by init() */
static PyObject *py_begin = NULL;        /* recorder._begin(op, args, kwargs, depth) */
static PyObject *py_end = NULL;          /* recorder._end(op, state, t0, t1, result, error, depth) */
static PyObject *py_not_a_row = NULL;    /* recorder._NOT_A_ROW */
static PyObject *py_is_internal = NULL;  /* recorder._is_internal(code) */
static PyObject *py_site_id = NULL;      /* recorder._site_id(code, line) -> int */
static PyObject *py_stack_id = NULL;     /* recorder._stack_id(inner stack, site) -> int */
static int g_stack_depth = 1;            /* user frames per call stack (PPROBE_STACK_DEPTH) */
static PyObject *py_sid = NULL;          /* records.sid(str) -> int */
static PyObject *py_ids = NULL;          /* records._ids (dict str -> int) */
static PyObject *py_outputs = NULL;      /* recorder._native_outputs(seq, result) */
static PyObject *py_dtype_sid = NULL;    /* numpy: dtype -> string id */
static PyObject *py_error = NULL;        /* _report.internal_error(where, exc) */
static PyObject *py_note_thread = NULL;  /* state.note_thread() */
/* py_wake (writer.wake or None) is declared with the buffer */
static PyObject *py_import_frame = NULL; /* recorder._IMPORT_FRAME */
/* Dump mode: py_dump(x, op, seq, kind, idx, header) -> (path, note) | None, the Python
 * engine's dump of one array (recorder._native_dump: the dumper's budget, dedup, queue and
 * names); kind 0: an input (idx: its name's string id), 1: the one output, 2: one of several
 * outputs (idx: its position in the result); header: its .npy header (npy_header_of) or
 * None. Set by set_dump. */
static PyObject *py_dump = NULL;
static PyObject *g_records_mod = NULL; /* pprobe.records (its strings), for dump names */
static PyObject *py_idx_strs = NULL;     /* tuple of "0".."63" */
static int32_t s_ok, s_input, s_output, s_cpu, s_idx0;

/* Attribute names, interned: a lookup with a name made from a C string each time misses the
 * type attribute cache and walks the whole MRO (torch.Tensor's is large). */
static PyObject *str_shape, *str_dtype, *str_is_cpu, *str_requires_grad, *str_name, *str_index;

/* NumPy */
static PyTypeObject *np_ndarray = NULL, *np_generic = NULL;
static PyObject *np_scalar_sids = NULL; /* dict: scalar type -> dtype string id */
static PyObject *np_descr_sids = NULL;  /* dict: id(builtin descr) -> string id */

/* ------------------------------------------------------------------ ops */
typedef struct {
    int selected, sampled;
    long every, first;
    int framework; /* 1 numpy, 2 torch, 0 other */
    int64_t calls;
    int uninit; /* outputs are uninitialised memory (Op.uninit): 0 not looked up, 1 no, 2 yes */
} OpInfo;
static OpInfo *g_ops = NULL;
static Py_ssize_t g_nops = 0;

static OpInfo *op_info(Py_ssize_t i) {
    if (i < 0 || i >= g_nops) return NULL;
    return &g_ops[i];
}

/* ------------------------------------------------------------------ pointer hash map
 * Open addressing, keys are object addresses (kept alive by a reference the map holds). */
static size_t ptr_hash(void *p, intptr_t k2) {
    uintptr_t x = (uintptr_t)p ^ ((uintptr_t)k2 * 0x9E3779B97F4A7C15ull);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x;
}

/* Maps keyed by (pointer, k2); k2 = 0 for single-pointer maps. */
typedef struct {
    void *key;
    intptr_t k2;
    intptr_t a, b;
} Slot2;
typedef struct {
    Slot2 *slots;
    size_t cap, n;
} Map2;

static Slot2 *map2_find(Map2 *m, void *key, intptr_t k2) {
    if (!m->cap) return NULL;
    size_t mask = m->cap - 1, i = ptr_hash(key, k2) & mask;
    for (;;) {
        Slot2 *s = &m->slots[i];
        if (s->key == NULL) return NULL;
        if (s->key == key && s->k2 == k2) return s;
        i = (i + 1) & mask;
    }
}

static int map2_grow(Map2 *m) {
    size_t ncap = m->cap ? m->cap * 2 : 256;
    Slot2 *ns = PyMem_Calloc(ncap, sizeof(Slot2));
    if (!ns) return -1;
    for (size_t j = 0; j < m->cap; j++) {
        Slot2 *s = &m->slots[j];
        if (!s->key) continue;
        size_t i = ptr_hash(s->key, s->k2) & (ncap - 1);
        while (ns[i].key) i = (i + 1) & (ncap - 1);
        ns[i] = *s;
    }
    PyMem_Free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    return 0;
}

static Slot2 *map2_put(Map2 *m, void *key, intptr_t k2) {
    Slot2 *s = map2_find(m, key, k2);
    if (s) return s;
    if ((m->n + 1) * 2 > m->cap && map2_grow(m) < 0) return NULL;
    size_t mask = m->cap - 1, i = ptr_hash(key, k2) & mask;
    while (m->slots[i].key) i = (i + 1) & mask;
    s = &m->slots[i];
    s->key = key;
    s->k2 = k2;
    s->a = s->b = 0;
    m->n++;
    return s;
}

static void map2_clear(Map2 *m, int decref_keys) {
    for (size_t j = 0; j < m->cap; j++) {
        if (m->slots[j].key && decref_keys) Py_DECREF((PyObject *)m->slots[j].key);
    }
    PyMem_Free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

/* code -> classification: 0 the program, 1 pprobe, 2 import machinery, 3+k a framework */
static Map2 g_codes;
/* (code, lasti) -> (site id, opcode class) */
static Map2 g_sites;
/* (inner stack id + 2 as a key, site id of the next user frame out) -> stack id */
static Map2 g_stacks;
/* hooked ufunc/dispatcher instance -> (op index, original vectorcall) */
static Map2 g_hooked;
/* dtype descr -> string id (builtin descriptors only) */
static Map2 g_descrs;

enum { C_USER = 0, C_PPROBE = 1, C_IMPORT = 2, C_NUMPY = 3, C_TORCH = 4, C_OTHERFW = 5 };

/* ------------------------------------------------------------------ the buffer */
typedef struct {
    PyObject_HEAD
    PyObject *ops;   /* bytearray of cap_ops records; the first n_ops are rows */
    size_t n_ops, cap_ops;
    PyObject *descs; /* bytearray of cap_descs records */
    size_t n_descs, cap_descs;
    PyObject *objs;  /* list */
    /* bytearrays the writer gave back (recycle): their pages are mapped already, so the
     * next batch does not page-fault its way through fresh memory */
    PyObject *spare_ops, *spare_descs;
    /* back-pressure: at most max_rows rows (0: no limit); when full, the recording thread
     * waits for the writer to take them (GIL released), or the row is dropped and counted */
    Py_ssize_t max_rows;
    int drop, writer_alive;
    long long dropped;
    int woken; /* wake() was called: its writer's wait() returns (under g_park_mu) */
    /* when the oldest buffered row was appended (CLOCK_MONOTONIC ns; set by the append that
     * finds the buffer empty, read by wait() without the GIL) */
    int64_t first_ns;
} BufferObject;

static PyObject *py_wake = NULL; /* writer.wake or None (configure) */

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define FULL_WAIT_MAX_S 60.0
static void wake_writer(BufferObject *b);

/* The buffer is full. 1: there is room now; 0: drop this row (counted). */
static int buffer_full(BufferObject *b) {
    if (tl_writer) return 1; /* the writer thread itself never waits */
    if (b->drop || !b->writer_alive) {
        b->dropped++;
        return 0;
    }
    double until = mono_s() + FULL_WAIT_MAX_S;
    while ((Py_ssize_t)b->n_ops >= b->max_rows) {
        wake_writer(b);
        Py_BEGIN_ALLOW_THREADS;
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
        Py_END_ALLOW_THREADS;
        if (b->drop || !b->writer_alive || mono_s() > until) {
            b->dropped++;
            return 0;
        }
    }
    return 1;
}


/* ------------------------------------------------------------------ the writer's flush window
 * CPython's GIL goes to a waiting thread only when its holder has kept it for a whole switch
 * interval: a program thread that releases it often (in every LAPACK call, every torch op)
 * takes it back before the waiting writer thread wakes, over and over, and each time the
 * writer takes the GIL (after its wait, after each NumPy pass over a long column, after each
 * file write) can cost it hundreds of futile wake-ups (docs/performance.md, "The log writer").
 * So the writer announces its flush. From the end of Buffer.wait() to Buffer.end_flush(), a
 * recording thread that appends a row (buffer_append, once the row is in) lets the GIL go and
 * waits for the flush to end, at most PARK_MAX_NS at a time: the writer takes the GIL without
 * a race, and the program's thread waits for it asleep instead of contending for it. Only
 * Buffer.wait() opens the window: the writer thread itself (tl_writer) never waits, and a
 * flush on another thread (close, a fork, pprobe.flush()) holds no thread back. The window
 * state is process-wide, like the buffer (one a process). */
#define PARK_MAX_NS 10000000L
static int g_flushing = 0; /* __atomic, relaxed: a stale value costs one needless turn */
static pthread_mutex_t g_park_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_park_cv; /* the flush ended (CLOCK_MONOTONIC: window_init) */
static pthread_cond_t g_wake_cv; /* a writer is asked to flush */
static int64_t g_parks = 0, g_park_timeouts = 0, g_park_ns = 0; /* under the GIL */

static inline int flushing_now(void) { return __atomic_load_n(&g_flushing, __ATOMIC_RELAXED); }
static inline void set_flushing(int f) { __atomic_store_n(&g_flushing, f, __ATOMIC_RELAXED); }

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void deadline_in(struct timespec *ts, int64_t ns) { /* on the conds' CLOCK_MONOTONIC */
    clock_gettime(CLOCK_MONOTONIC, ts);
    ns += ts->tv_nsec;
    ts->tv_sec += (time_t)(ns / 1000000000LL);
    ts->tv_nsec = (long)(ns % 1000000000LL);
}

static int window_init(void) {
    pthread_condattr_t a;
    if (pthread_condattr_init(&a) != 0) return -1;
    int r = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    if (r == 0) r = pthread_cond_init(&g_park_cv, &a);
    if (r == 0) r = pthread_cond_init(&g_wake_cv, &a);
    pthread_condattr_destroy(&a);
    return r == 0 ? 0 : -1;
}

static void park_for_flush(void) {
    struct timespec dl;
    int64_t t0 = mono_ns();
    int timed_out = 0;
    deadline_in(&dl, PARK_MAX_NS);
    Py_BEGIN_ALLOW_THREADS;
    pthread_mutex_lock(&g_park_mu);
    while (flushing_now()) {
        if (pthread_cond_timedwait(&g_park_cv, &g_park_mu, &dl) != 0) { /* ETIMEDOUT */
            timed_out = 1;
            break;
        }
    }
    pthread_mutex_unlock(&g_park_mu);
    Py_END_ALLOW_THREADS;
    g_parks++;
    g_park_timeouts += timed_out;
    g_park_ns += mono_ns() - t0;
}

static inline void maybe_park(void) {
    if (flushing_now() && !tl_writer) park_for_flush();
}

/* The main thread may hold the GIL for long without appending a row (an import, pure Python,
 * or a loop of calls that are not recorded) while releasing it often (file reads, small C
 * calls): it is asked to wait for the flush at its next safe point too, through CPython's
 * pending calls (what Python's own signal handling uses; Py_AddPendingCall needs no GIL). One
 * request at a time: a main thread that runs no Python never fills CPython's small queue. */
static int g_yield_asked = 0;

static int yield_for_flush(void *unused) {
    __atomic_store_n(&g_yield_asked, 0, __ATOMIC_RELAXED);
    maybe_park();
    return 0; /* never an exception: this runs between two bytecodes of the program */
}

static void ask_main_to_yield(void) { /* with or without the GIL */
    if (__atomic_exchange_n(&g_yield_asked, 1, __ATOMIC_RELAXED)) return;
    if (Py_AddPendingCall(yield_for_flush, NULL) < 0)
        __atomic_store_n(&g_yield_asked, 0, __ATOMIC_RELAXED);
}

static void window_open(void) {
    set_flushing(1);
    ask_main_to_yield();
}

/* wait(timeout) -> woken: the writer thread's wait for its next flush: until wake(), until
   the oldest buffered row has waited `timeout` seconds since it was appended, or, with rows
   dropped, the timeout; an idle writer looks every `timeout` seconds without taking the GIL.
   A burst of rows is written `timeout` after its first row, not at the next tick of a clock
   that started before it (one flush, not two, for a burst shorter than the period). On return
   the flush window is open (end_flush() closes it): it opens before the GIL is taken back, so
   that the recording threads let the GIL go. */
static PyObject *Buffer_wait(BufferObject *self, PyObject *arg) {
    double t = PyFloat_AsDouble(arg);
    if (t == -1.0 && PyErr_Occurred()) return NULL;
    if (!(t >= 0.001)) t = 0.001;
    if (t > 86400) t = 86400;
    int64_t t_ns = (int64_t)(t * 1e9);
    int woken;
    Py_BEGIN_ALLOW_THREADS;
    struct timespec dl;
    pthread_mutex_lock(&g_park_mu);
    int64_t seen = 0; /* when a look first found rows: they are older, whatever first_ns says */
    for (int first = 1;; first = 0) {
        /* racy reads of the counts and of first_ns (no GIL): a row appended just now is seen
         * at the next look; a stale first_ns is an older one, an earlier flush */
        int64_t wait_ns = t_ns;
        if (self->n_ops) {
            int64_t now = mono_ns(), oldest = __atomic_load_n(&self->first_ns, __ATOMIC_RELAXED);
            if (!seen) seen = now;
            wait_ns = (oldest < seen ? oldest : seen) + t_ns - now;
            if (wait_ns <= 0) break;
        } else if (self->dropped && !first) {
            break;
        }
        deadline_in(&dl, wait_ns);
        while (!self->woken) {
            if (pthread_cond_timedwait(&g_wake_cv, &g_park_mu, &dl) != 0) break;
        }
        if (self->woken) break;
    }
    woken = self->woken;
    self->woken = 0;
    set_flushing(1);
    pthread_mutex_unlock(&g_park_mu);
    ask_main_to_yield();
    Py_END_ALLOW_THREADS;
    return PyBool_FromLong(woken);
}

/* wake(): this buffer's writer's wait() returns now (a flush is due, or the writer stops) */
static void wake_buffer(BufferObject *b) {
    pthread_mutex_lock(&g_park_mu);
    b->woken = 1;
    pthread_cond_broadcast(&g_wake_cv); /* the cond is shared: wake every waiter to look */
    pthread_mutex_unlock(&g_park_mu);
}

static PyObject *Buffer_wake(BufferObject *self, PyObject *unused) {
    wake_buffer(self);
    Py_RETURN_NONE;
}

/* The writer's wake from the recording path (configure's wake: set while a writer runs), in C:
   writer.wake() is this buffer's wake(), and a Python call here would be a place where a
   signal handler's exception (Ctrl-C's KeyboardInterrupt) could be raised and lost. */
static void wake_writer(BufferObject *b) {
    if (py_wake && py_wake != Py_None) wake_buffer(b);
}

/* end_flush(): the flush window closes; the threads waiting for it go on */
static PyObject *Buffer_end_flush(BufferObject *self, PyObject *unused) {
    pthread_mutex_lock(&g_park_mu);
    set_flushing(0);
    pthread_cond_broadcast(&g_park_cv);
    pthread_mutex_unlock(&g_park_mu);
    Py_RETURN_NONE;
}

/* begin_flush(): the window opens again (the writer closed it for a wait of its own that
   needs no GIL: a dump barrier) */
static PyObject *Buffer_begin_flush(BufferObject *self, PyObject *unused) {
    window_open();
    Py_RETURN_NONE;
}

/* parks() -> (waits, waits cut short by PARK_MAX_NS, seconds waited): the window's toll */
static PyObject *Buffer_parks(BufferObject *self, PyObject *unused) {
    return Py_BuildValue("(LLd)", (long long)g_parks, (long long)g_park_timeouts,
                         g_park_ns * 1e-9);
}

/* fork: the forking thread holds the window's lock across fork() (pthread_atfork), so that
   the child never inherits it locked by a thread it lacks; the child starts with the window
   closed and its counts at zero, before any at-fork hook of Python's can record a row. */
static void window_prefork(void) { pthread_mutex_lock(&g_park_mu); }
static void window_parent(void) { pthread_mutex_unlock(&g_park_mu); }
static void window_child(void) {
    pthread_mutex_init(&g_park_mu, NULL);
    window_init();
    set_flushing(0);
    g_yield_asked = 0;
    g_parks = g_park_timeouts = g_park_ns = 0;
}

static BufferObject *g_buffer = NULL;

/* Make room for `need` records of `item` bytes in the bytearray *ba (used: n records). */
static int reserve(PyObject **ba, size_t *cap, size_t n, size_t need, size_t item,
                   PyObject **spare) {
    if (need <= *cap && *ba) return 0;
    size_t ncap = *cap ? *cap : 1024;
    while (ncap < need) ncap *= 2;
    PyObject *nb = NULL;
    if (*spare && (size_t)PyByteArray_GET_SIZE(*spare) >= ncap * item) {
        nb = *spare; /* a recycled buffer at least as large */
        *spare = NULL;
        ncap = (size_t)PyByteArray_GET_SIZE(nb) / item;
    } else {
        Py_CLEAR(*spare);
        nb = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(ncap * item));
    }
    if (!nb) return -1;
    if (*ba && n) memcpy(PyByteArray_AS_STRING(nb), PyByteArray_AS_STRING(*ba), n * item);
    Py_XSETREF(*ba, nb);
    *cap = ncap;
    return 0;
}

static void Buffer_dealloc(BufferObject *self) {
    Py_XDECREF(self->ops);
    Py_XDECREF(self->descs);
    Py_XDECREF(self->objs);
    Py_XDECREF(self->spare_ops);
    Py_XDECREF(self->spare_descs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Buffer_new(PyTypeObject *tp, PyObject *a, PyObject *k) {
    BufferObject *self = (BufferObject *)tp->tp_alloc(tp, 0);
    if (!self) return NULL;
    self->objs = PyList_New(0);
    if (!self->objs) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static Py_ssize_t Buffer_len(BufferObject *self) { return (Py_ssize_t)self->n_ops; }

/* Rebase object indices of one row's records by `base` (>= 0 fields only). */
static void rebase_row(OpRec *op, DescRec *d, Py_ssize_t nd, int32_t base) {
    if (op->args >= 0) op->args += base;
    for (Py_ssize_t i = 0; i < nd; i++) {
        if (d[i].stats >= 0) d[i].stats += base;
        if (d[i].path >= 0) d[i].path += base;
        if (d[i].note >= 0) d[i].note += base;
        if (d[i].shape_ref >= 0) d[i].shape_ref += base;
    }
}

/* Append one row: the op record, its desc records, and its objects (indices relative). */
static int buffer_append(BufferObject *b, OpRec *op, DescRec *d, Py_ssize_t nd, PyObject **objs,
                         Py_ssize_t nobj) {
    if (b->max_rows > 0 && (Py_ssize_t)b->n_ops >= b->max_rows && !buffer_full(b)) return 0;
    if (reserve(&b->ops, &b->cap_ops, b->n_ops, b->n_ops + 1, sizeof(OpRec), &b->spare_ops) < 0)
        return -1;
    if (nd && reserve(&b->descs, &b->cap_descs, b->n_descs, b->n_descs + nd, sizeof(DescRec),
                      &b->spare_descs) < 0)
        return -1;
    int32_t base = (int32_t)PyList_GET_SIZE(b->objs);
    for (Py_ssize_t i = 0; i < nobj; i++) {
        if (PyList_Append(b->objs, objs[i]) < 0) return -1;
    }
    OpRec *o = (OpRec *)PyByteArray_AS_STRING(b->ops) + b->n_ops;
    *o = *op;
    if (!b->n_ops) __atomic_store_n(&b->first_ns, mono_ns(), __ATOMIC_RELAXED);
    DescRec *dd = nd ? (DescRec *)PyByteArray_AS_STRING(b->descs) + b->n_descs : NULL;
    if (nd) memcpy(dd, d, nd * sizeof(DescRec));
    if (base) rebase_row(o, dd, nd, base);
    b->n_ops++;
    b->n_descs += nd;
    maybe_park();
    return 0;
}

static PyObject *Buffer_append(BufferObject *self, PyObject *args) {
    Py_buffer head, descs;
    PyObject *objs;
    if (!PyArg_ParseTuple(args, "y*y*O", &head, &descs, &objs)) return NULL;
    PyObject *res = NULL;
    if (head.len != (Py_ssize_t)sizeof(OpRec) || descs.len % sizeof(DescRec)) {
        PyErr_SetString(PyExc_ValueError, "records of the wrong size");
        goto done;
    }
    Py_ssize_t nobj = 0;
    PyObject **items = NULL;
    if (objs != Py_None) {
        if (!PyTuple_Check(objs)) {
            PyErr_SetString(PyExc_TypeError, "objects must be a tuple or None");
            goto done;
        }
        nobj = PyTuple_GET_SIZE(objs);
        items = &PyTuple_GET_ITEM(objs, 0);
    }
    OpRec op;
    memcpy(&op, head.buf, sizeof(OpRec));
    Py_ssize_t nd = descs.len / sizeof(DescRec);
    DescRec *tmp = NULL;
    if (nd) {
        tmp = PyMem_Malloc(descs.len);
        if (!tmp) {
            PyErr_NoMemory();
            goto done;
        }
        memcpy(tmp, descs.buf, descs.len);
    }
    int r = buffer_append(self, &op, tmp, nd, items, nobj);
    PyMem_Free(tmp);
    if (r == 0) res = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&head);
    PyBuffer_Release(&descs);
    return res;
}

/* The used part of a bytearray, handed over without a copy (a memoryview of it); *ba starts
 * anew. The bytearray keeps its size, so recycle() can reuse all of it. */
static PyObject *hand_over(PyObject **ba, size_t *cap, size_t n, size_t item) {
    PyObject *whole = *ba ? *ba : PyByteArray_FromStringAndSize(NULL, 0);
    if (!whole) return NULL;
    PyObject *mv = PyMemoryView_FromObject(whole);
    Py_DECREF(whole); /* the memoryview holds it now */
    *ba = NULL;
    if (!mv) return NULL;
    PyObject *stop = PyLong_FromSize_t(n * item);
    PyObject *sl = stop ? PySlice_New(NULL, stop, NULL) : NULL;
    PyObject *out = sl ? PyObject_GetItem(mv, sl) : NULL;
    Py_XDECREF(stop);
    Py_XDECREF(sl);
    Py_DECREF(mv);
    /* a normal batch's room is kept; what a burst grew past 65536 records is given back */
    if (*cap > 65536) *cap = 65536;
    return out;
}

static PyObject *Buffer_take(BufferObject *self, PyObject *unused) {
    PyObject *nobjs = PyList_New(0);
    if (!nobjs) return NULL;
    PyObject *ops = hand_over(&self->ops, &self->cap_ops, self->n_ops, sizeof(OpRec));
    if (!ops) {
        Py_DECREF(nobjs);
        return NULL;
    }
    PyObject *descs = hand_over(&self->descs, &self->cap_descs, self->n_descs, sizeof(DescRec));
    if (!descs) {
        Py_DECREF(nobjs);
        Py_DECREF(ops);
        return NULL;
    }
    PyObject *objs = self->objs;
    self->objs = nobjs;
    Py_ssize_t n = (Py_ssize_t)self->n_ops;
    self->n_ops = self->n_descs = 0;
    return Py_BuildValue("(NNNn)", ops, descs, objs, n);
}

/* The writer gives a batch's memory back once written: reused for the next batches. Only a
 * bytearray that nothing but this memoryview exports any more is taken, and only while no
 * array still reads the memoryview itself: a one-row column is a NumPy view of the records,
 * and a batch handed to the collector's tap may wait in its queue after the flush (the
 * memoryview's own exports count those; the bytearray's count only the memoryview's). */
static void take_back(PyObject *mv, PyObject **spare) {
    if (!PyMemoryView_Check(mv) || *spare) return;
    PyMemoryViewObject *m = (PyMemoryViewObject *)mv;
    if (m->exports != 0 || !m->mbuf || m->mbuf->exports != 1) return;
    PyObject *base = PyMemoryView_GET_BUFFER(mv)->obj;
    if (base && PyByteArray_CheckExact(base) && ((PyByteArrayObject *)base)->ob_exports == 1)
        *spare = Py_NewRef(base);
}

static PyObject *Buffer_recycle(BufferObject *self, PyObject *args) {
    PyObject *ops, *descs;
    if (!PyArg_ParseTuple(args, "OO", &ops, &descs)) return NULL;
    take_back(ops, &self->spare_ops);
    take_back(descs, &self->spare_descs);
    Py_RETURN_NONE;
}

static PyObject *Buffer_clear(BufferObject *self, PyObject *unused) {
    self->n_ops = self->n_descs = 0;
    PyObject *n = PyList_New(0);
    if (!n) return NULL;
    Py_SETREF(self->objs, n);
    Py_RETURN_NONE;
}

/* limit(max_rows, drop, writer_alive): the back-pressure settings */
static PyObject *Buffer_limit(BufferObject *self, PyObject *args) {
    Py_ssize_t max_rows;
    int drop, alive;
    if (!PyArg_ParseTuple(args, "npp", &max_rows, &drop, &alive)) return NULL;
    self->max_rows = max_rows;
    self->drop = drop;
    self->writer_alive = alive;
    Py_RETURN_NONE;
}

/* mark_writer(flag) -> the previous flag: while set, a full buffer never makes the calling
 * thread wait (the writer thread, or a thread while it flushes) */
static PyObject *Buffer_mark_writer(BufferObject *self, PyObject *flag) {
    int prev = tl_writer;
    int f = PyObject_IsTrue(flag);
    if (f < 0) return NULL;
    tl_writer = f;
    return PyBool_FromLong(prev);
}

/* take_dropped() -> rows dropped since the last call */
static PyObject *Buffer_take_dropped(BufferObject *self, PyObject *unused) {
    long long d = self->dropped;
    self->dropped = 0;
    return PyLong_FromLongLong(d);
}

static PyMethodDef Buffer_methods[] = {
    {"limit", (PyCFunction)Buffer_limit, METH_VARARGS,
     "limit(max_rows, drop, writer_alive): back-pressure (0: no limit)"},
    {"wait", (PyCFunction)Buffer_wait, METH_O,
     "wait(timeout) -> woken: the writer's wait; on return its flush window is open"},
    {"wake", (PyCFunction)Buffer_wake, METH_NOARGS, "wait() returns now"},
    {"end_flush", (PyCFunction)Buffer_end_flush, METH_NOARGS,
     "the flush window closes: the recording threads waiting for it go on"},
    {"begin_flush", (PyCFunction)Buffer_begin_flush, METH_NOARGS,
     "the flush window opens again (after a wait of the writer's that needs no GIL)"},
    {"parks", (PyCFunction)Buffer_parks, METH_NOARGS,
     "(waits, waits cut short, seconds waited) of recording threads for the writer's flushes"},
    {"mark_writer", (PyCFunction)Buffer_mark_writer, METH_O,
     "mark_writer(flag) -> previous: while set, this thread never waits for room"},
    {"take_dropped", (PyCFunction)Buffer_take_dropped, METH_NOARGS,
     "rows dropped (buffer full) since the last call"},
    {"append", (PyCFunction)Buffer_append, METH_VARARGS,
     "append(op record, desc records, objects or None)"},
    {"take", (PyCFunction)Buffer_take, METH_NOARGS,
     "take() -> (op records, desc records, objects, rows): every buffered row"},
    {"clear", (PyCFunction)Buffer_clear, METH_NOARGS, "drop every buffered row"},
    {"recycle", (PyCFunction)Buffer_recycle, METH_VARARGS,
     "recycle(op records, desc records): give a written batch's memory back"},
    {NULL}};

static PySequenceMethods Buffer_seq = {.sq_length = (lenfunc)Buffer_len};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pprobe._native.Buffer",
    .tp_basicsize = sizeof(BufferObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Buffer_new,
    .tp_dealloc = (destructor)Buffer_dealloc,
    .tp_methods = Buffer_methods,
    .tp_as_sequence = &Buffer_seq,
    .tp_doc = "Rows waiting for the writer, in the layout of pprobe.records.",
};

/* ------------------------------------------------------------------ small helpers */
static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* what time.perf_counter_ns() reads on Linux */
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Report a failure inside pprobe (the current exception) once, and clear it. */
/* A KeyboardInterrupt or SystemExit that reaches pprobe's own code on the main thread was
 * raised there by a signal handler (Ctrl-C, a handler calling sys.exit) at the first bytecode
 * pprobe's helper ran: it is the program's, not a failure of pprobe's. It is raised again at
 * the program's next bytecode (a pending call that fails with it), as it would have been
 * without the probe, instead of being reported and lost. */
static PyObject *g_kept_t = NULL, *g_kept_v = NULL, *g_kept_tb = NULL;
static unsigned long g_main_ident = 0;

static int raise_kept(void *unused) {
    if (!g_kept_v) return 0;
    PyErr_Restore(g_kept_t, g_kept_v, g_kept_tb);
    g_kept_t = g_kept_v = g_kept_tb = NULL;
    return -1;
}

static int keep_for_program(PyObject *t, PyObject *v, PyObject *tb) { /* steals on 1 */
    if (!v || PyObject_IsInstance(v, PyExc_Exception) != 0 || g_kept_v ||
        PyThread_get_thread_ident() != g_main_ident)
        return 0;
    g_kept_t = t;
    g_kept_v = v;
    g_kept_tb = tb;
    if (Py_AddPendingCall(raise_kept, NULL) < 0) {
        g_kept_t = g_kept_v = g_kept_tb = NULL;
        return 0;
    }
    return 1;
}

/* Clear the current exception, if any, as a failure of pprobe's own that is not reported:
 * every helper call whose failure pprobe shrugs off ends here. Unless it is the program's: a
 * KeyboardInterrupt or SystemExit raised on the main thread by a signal handler at the first
 * bytecode of a Python helper the core called (a name lookup, a description, a hook) goes
 * back to the program through keep_for_program, as report() does. The common case, an
 * Exception, is told by its type alone (no normalisation). */
static void drop_error(void) {
    PyObject *t = PyErr_Occurred();
    if (!t) return;
    if (PyErr_GivenExceptionMatches(t, PyExc_Exception)) {
        PyErr_Clear();
        return;
    }
    PyObject *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (keep_for_program(t, v, tb)) return;
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
}

static void report(const char *where) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (keep_for_program(t, v, tb)) return;
    if (py_error && v) {
        long saved = tl_depth;
        tl_depth = INTERNAL;
        PyObject *r = PyObject_CallFunction(py_error, "sO", where, v);
        tl_depth = saved;
        if (!r) drop_error();
        Py_XDECREF(r);
    }
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
}

static int32_t sid_of(PyObject *s) {
    /* records.sid(s), looking the dict up first */
    if (s == NULL || s == Py_None) return -1;
    PyObject *v = PyDict_GetItemWithError(py_ids, s);
    if (v) return (int32_t)PyLong_AsLong(v);
    if (PyErr_Occurred()) return -1;
    PyObject *r = PyObject_CallOneArg(py_sid, s);
    if (!r) return -1;
    long i = PyLong_AsLong(r);
    Py_DECREF(r);
    return (int32_t)i;
}

/* ------------------------------------------------------------------ call sites */
static int classify_code(PyCodeObject *code) {
    Slot2 *s = map2_find(&g_codes, code, 0);
    if (s) return (int)s->a;
    PyObject *r = PyObject_CallOneArg(py_is_internal, (PyObject *)code);
    if (!r) return -1;
    int c;
    if (r == Py_False || r == Py_None)
        c = C_USER;
    else if (r == Py_True)
        c = C_PPROBE;
    else if (r == py_import_frame)
        c = C_IMPORT;
    else if (PyUnicode_Check(r) && PyUnicode_CompareWithASCIIString(r, "numpy") == 0)
        c = C_NUMPY;
    else if (PyUnicode_Check(r) && PyUnicode_CompareWithASCIIString(r, "torch") == 0)
        c = C_TORCH;
    else
        c = PyObject_IsTrue(r) ? C_OTHERFW : C_USER;
    Py_DECREF(r);
    s = map2_put(&g_codes, code, 0);
    if (!s) return -1;
    Py_INCREF(code);
    s->a = c;
    return c;
}

/* operator detection: opclass per (opcode << 8 | oparg), filled by set_opcodes() */
static unsigned char g_opclass[65536];
enum { K_CALL = 0, K_BINARY = 1, K_INPLACE = 2, K_COMPARE = 3, K_UNARY = 4 };

static int opclass_at(PyCodeObject *code, int lasti) {
    if (lasti < 0) return K_CALL;
#if PY_VERSION_HEX >= 0x030B0000
    PyObject *bytes = PyCode_GetCode(code);
#else
    PyObject *bytes = code->co_code;
    Py_INCREF(bytes);
#endif
    if (!bytes) {
        drop_error();
        return K_CALL;
    }
    int k = K_CALL;
    Py_ssize_t n = PyBytes_GET_SIZE(bytes);
    if (lasti + 1 < n) {
        const unsigned char *c = (const unsigned char *)PyBytes_AS_STRING(bytes);
        k = g_opclass[(c[lasti] << 8) | c[lasti + 1]];
    }
    Py_DECREF(bytes);
    return k;
}

#define NOT_A_ROW (-2)

/* The site id of a program frame (cached per (code, lasti)); -3 on error. *opclass gets how
 * it called (K_*). */
static int frame_site(PyFrameObject *f, PyCodeObject *code, int *opclass) {
#if PY_VERSION_HEX >= 0x030B0000
    int lasti = PyFrame_GetLasti(f);
#else
    int lasti = f->f_lasti * 2;
#endif
    Slot2 *s = map2_find(&g_sites, code, lasti);
    if (!s) {
        int line = PyFrame_GetLineNumber(f);
        PyObject *r = PyObject_CallFunction(py_site_id, "Oi", (PyObject *)code, line);
        if (!r) return -3;
        long id = PyLong_AsLong(r);
        Py_DECREF(r);
        if (id == -1 && PyErr_Occurred()) return -3;
        s = map2_put(&g_sites, code, lasti);
        if (!s) return -3;
        Py_INCREF(code);
        s->a = id;
        s->b = opclass_at(code, lasti);
    }
    *opclass = (int)s->b;
    return (int)s->a;
}

/* The stack id of (the stack of the inner frames, or -1; the next frame's site id), interned
 * by recorder._stack_id on a miss; -3 on error. */
static int intern_stack(int inner, int site) {
    void *key = (void *)(intptr_t)(inner + 2);
    Slot2 *s = map2_find(&g_stacks, key, site);
    if (s) return (int)s->a;
    PyObject *r = PyObject_CallFunction(py_stack_id, "ii", inner, site);
    if (!r) return -3;
    long id = PyLong_AsLong(r);
    Py_DECREF(r);
    if (id == -1 && PyErr_Occurred()) return -3;
    s = map2_put(&g_stacks, key, site);
    if (!s) return -3;
    s->a = id;
    return (int)id;
}

/* The call stack of the current call: stack id (>= 0) of its g_stack_depth innermost program
 * frames (the first one the call site), -1 (none), NOT_A_ROW, or -3 on error. *opclass gets
 * how the call site called (K_*). recorder._caller is the Python twin. */
static int caller_site(int framework, int *opclass) {
    PyThreadState *ts = PyThreadState_Get();
    PyFrameObject *f = PyThreadState_GetFrame(ts);
    int first = 1;
    *opclass = K_CALL;
    while (f) {
        PyCodeObject *code = PyFrame_GetCode(f);
        int c = classify_code(code);
        if (c < 0) {
            Py_DECREF(code);
            Py_DECREF(f);
            return -3;
        }
        if (c == C_USER) {
            int site = frame_site(f, code, opclass);
            Py_DECREF(code);
            int st = site < 0 ? -3 : intern_stack(-1, site);
            int n = g_stack_depth - 1;
            PyFrameObject *b = PyFrame_GetBack(f);
            Py_DECREF(f);
            while (st >= 0 && n > 0 && b) {
                PyCodeObject *bc = PyFrame_GetCode(b);
                int cc = classify_code(bc);
                if (cc < 0) {
                    st = -3;
                } else if (cc == C_USER) {
                    int ocls;
                    int bs = frame_site(b, bc, &ocls);
                    st = bs < 0 ? -3 : intern_stack(st, bs);
                    n--;
                }
                Py_DECREF(bc);
                PyFrameObject *nb = PyFrame_GetBack(b);
                Py_DECREF(b);
                b = nb;
            }
            Py_XDECREF(b);
            return st;
        }
        Py_DECREF(code);
        if (c != C_PPROBE) {
            if (c == C_IMPORT || (first && c == framework)) {
                Py_DECREF(f);
                return NOT_A_ROW;
            }
            first = 0;
        }
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    return -1;
}

/* ------------------------------------------------------------------ as_caller
 * recorder.as_caller in C: the trampoline that calls a function from a frame looking like
 * the innermost frame outside pprobe (warnings then name the program's line). Classes come
 * from recorder._classify (1 pprobe, 2 dispatch machinery, 0 other), trampolines from
 * recorder._tramp_for(code, line, globals); both are kept per code object (a reference held,
 * so a pointer is never reused), trampolines per (code, instruction offset). */
static PyObject *py_classify = NULL, *py_tramp_for = NULL, *py_plain = NULL;
static Map2 g_mine, g_tramps;

static PyObject *set_as_caller(PyObject *self, PyObject *args) {
    PyObject *c, *t, *p;
    if (!PyArg_ParseTuple(args, "OOO", &c, &t, &p)) return NULL;
    Py_XSETREF(py_classify, Py_NewRef(c));
    Py_XSETREF(py_tramp_for, Py_NewRef(t));
    Py_XSETREF(py_plain, Py_NewRef(p));
    Py_RETURN_NONE;
}

static int mine_class(PyCodeObject *code) {
    Slot2 *s = map2_find(&g_mine, code, 0);
    if (s) return (int)s->a;
    PyObject *r = PyObject_CallOneArg(py_classify, (PyObject *)code);
    if (!r) return -1;
    long c = PyLong_AsLong(r);
    Py_DECREF(r);
    if (c == -1 && PyErr_Occurred()) return -1;
    s = map2_put(&g_mine, code, 0);
    if (!s) return -1;
    Py_INCREF(code);
    s->a = c;
    return (int)c;
}

static PyObject *as_caller(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs > 1 || !py_classify) {
        PyErr_SetString(PyExc_TypeError, "as_caller(fn=None), after set_as_caller()");
        return NULL;
    }
    PyObject *fn = nargs ? args[0] : Py_None;
    PyFrameObject *f = PyEval_GetFrame(); /* borrowed: as_caller's caller */
    Py_XINCREF(f);
    int dispatched = 0;
    PyCodeObject *code = NULL;
    while (f) {
        code = PyFrame_GetCode(f);
        int m = mine_class(code);
        if (m < 0) {
            Py_DECREF(code);
            Py_DECREF(f);
            return NULL;
        }
        if (m == 0) {
            if (!dispatched) break;
            PyObject *fc = PyObject_GetAttrString(fn, "__code__");
            if (!fc) drop_error();
            Py_XDECREF(fc); /* compared by identity only */
            if (fc != (PyObject *)code) break;
            dispatched = 0;
        } else if (m == 2) {
            dispatched = 1;
        }
        Py_DECREF(code);
        code = NULL;
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    if (!f) return Py_NewRef(py_plain);
#if PY_VERSION_HEX >= 0x030B0000
    int lasti = PyFrame_GetLasti(f);
#else
    int lasti = f->f_lasti * 2;
#endif
    Slot2 *s = map2_find(&g_tramps, code, lasti);
    if (!s) {
        PyObject *g = PyObject_GetAttrString((PyObject *)f, "f_globals");
        PyObject *t = g ? PyObject_CallFunction(py_tramp_for, "OiO", (PyObject *)code,
                                                PyFrame_GetLineNumber(f), g)
                        : NULL;
        Py_XDECREF(g);
        if (!t || !(s = map2_put(&g_tramps, code, lasti))) {
            Py_XDECREF(t);
            Py_DECREF(code);
            Py_DECREF(f);
            return NULL;
        }
        Py_INCREF(code);
        s->a = (intptr_t)t; /* owned */
    }
    Py_DECREF(code);
    Py_DECREF(f);
    return Py_NewRef((PyObject *)s->a);
}

/* ------------------------------------------------------------------ descriptions */
/* In dump mode, what each desc record describes: the object (borrowed: an argument or an
 * item of the result, alive for the call; NULL: nothing to dump, e.g. records the Python side
 * made) and, for an output, its position in the result. */
typedef struct {
    PyObject *x;
    Py_ssize_t pos;
} DescSrc;

typedef struct {
    DescRec *d;
    DescSrc *src; /* parallel to d */
    Py_ssize_t n, cap;
    DescRec inline_[8];
    DescSrc src_inline[8];
    PyObject **objs; /* the row's objects (new references) */
    Py_ssize_t nobj, objcap;
    PyObject *objs_inline[16];
    PyObject *pairs; /* list of (idx, value) pairs, or NULL */
} Descs;

static void descs_init(Descs *ds) {
    memset(ds, 0, sizeof(*ds));
    ds->d = ds->inline_;
    ds->src = ds->src_inline;
    ds->cap = 8;
    ds->objs = ds->objs_inline;
    ds->objcap = 16;
}

static void descs_free(Descs *ds) {
    if (ds->d != ds->inline_) PyMem_Free(ds->d);
    if (ds->src != ds->src_inline) PyMem_Free(ds->src);
    for (Py_ssize_t i = 0; i < ds->nobj; i++) Py_DECREF(ds->objs[i]);
    if (ds->objs != ds->objs_inline) PyMem_Free(ds->objs);
    Py_XDECREF(ds->pairs);
}

/* Add an object to the row (steals the reference); its index, or -1 (memory; the reference is
 * released and the error set). */
static int32_t descs_obj(Descs *ds, PyObject *o) {
    if (ds->nobj == ds->objcap) {
        Py_ssize_t ncap = ds->objcap * 2;
        PyObject **no = PyMem_Malloc(ncap * sizeof(PyObject *));
        if (!no) {
            Py_DECREF(o);
            PyErr_NoMemory();
            return -1;
        }
        memcpy(no, ds->objs, ds->nobj * sizeof(PyObject *));
        if (ds->objs != ds->objs_inline) PyMem_Free(ds->objs);
        ds->objs = no;
        ds->objcap = ncap;
    }
    ds->objs[ds->nobj] = o;
    return (int32_t)ds->nobj++;
}

static DescRec *descs_add(Descs *ds) {
    if (ds->n == ds->cap) {
        Py_ssize_t ncap = ds->cap * 2;
        DescRec *nd = PyMem_Malloc(ncap * sizeof(DescRec));
        DescSrc *ns = PyMem_Malloc(ncap * sizeof(DescSrc));
        if (!nd || !ns) {
            PyMem_Free(nd);
            PyMem_Free(ns);
            PyErr_NoMemory();
            return NULL;
        }
        memcpy(nd, ds->d, ds->n * sizeof(DescRec));
        memcpy(ns, ds->src, ds->n * sizeof(DescSrc));
        if (ds->d != ds->inline_) PyMem_Free(ds->d);
        if (ds->src != ds->src_inline) PyMem_Free(ds->src);
        ds->d = nd;
        ds->src = ns;
        ds->cap = ncap;
    }
    ds->src[ds->n].x = NULL;
    ds->src[ds->n].pos = 0;
    DescRec *r = &ds->d[ds->n++];
    memset(r, 0, sizeof(DescRec));
    r->mn = r->mx = r->mean = r->std = Py_NAN;
    r->nan = r->inf = -1;
    r->grad = -1;
    r->stats = STATS_NONE;
    r->path = r->note = r->shape_ref = -1;
    r->device = s_cpu;
    return r;
}

static int32_t descr_sid(PyObject *descr) {
    Slot2 *s = map2_find(&g_descrs, descr, 0);
    if (s) return (int32_t)s->a;
    PyObject *r = PyObject_CallOneArg(py_dtype_sid, descr);
    if (!r) return -2;
    long id = PyLong_AsLong(r);
    Py_DECREF(r);
    /* builtin descriptors are static singletons: cache them (others may be freed). No
     * reference is taken: they are never freed, and NumPy's tests count their references
     * around a call (a new cache entry would be one more). */
    PyObject *key = PyLong_FromVoidPtr(descr);
    if (key) {
        int builtin = PyDict_Contains(np_descr_sids, key) == 1;
        Py_DECREF(key);
        if (builtin) {
            s = map2_put(&g_descrs, descr, 0);
            if (s) s->a = id;
        }
    }
    drop_error();
    return (int32_t)id;
}

/* torch tensors of the plain types (torch.Tensor, nn.Parameter): shape, dtype, device,
 * requires_grad read through their Python attributes (no torch headers are needed); anything
 * unusual (symbolic or nested sizes, a new dtype) is left to the Python path. */
static PyObject *torch_plain = NULL;      /* tuple of types */
static PyObject *torch_dtype_sids = NULL; /* dict: torch.dtype -> string id */
static PyObject *py_device_name = NULL;   /* torch_values.device_name(tensor) -> str */

static int describe_tensor_type(PyTypeObject *tp) {
    Py_ssize_t n = PyTuple_GET_SIZE(torch_plain);
    for (Py_ssize_t i = 0; i < n; i++)
        if ((PyObject *)tp == PyTuple_GET_ITEM(torch_plain, i)) return 1;
    return 0;
}

/* The four attributes a description reads, per plain tensor type: where the type's lookup
 * finds a getset descriptor (a data descriptor: it wins over the instance dict) and the type
 * uses generic attribute lookup, its getter is called directly, which is what
 * PyObject_GetAttr would end up calling. Valid while the type's version tag is the one seen
 * when the getters were taken (any change to the type or its bases resets the tag). */
#define N_TATTRS 4
typedef struct {
    PyTypeObject *tp;
    unsigned int tag;
    getter get[N_TATTRS];
    void *closure[N_TATTRS];
} TensorGetters;
static TensorGetters g_tgetters[4];
static int g_ntgetters = 0;

static PyObject *mro_lookup(PyTypeObject *tp, PyObject *name) {
    PyObject *mro = tp->tp_mro;
    if (!mro || !PyTuple_Check(mro)) return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); i++) {
        PyObject *d = ((PyTypeObject *)PyTuple_GET_ITEM(mro, i))->tp_dict;
        PyObject *v = d ? PyDict_GetItemWithError(d, name) : NULL;
        if (v || PyErr_Occurred()) return v;
    }
    return NULL;
}

/* Take the getters of the plain tensor types (from torch_init); types where any attribute
 * is not a plain getset descriptor keep PyObject_GetAttr. */
static void take_tensor_getters(void) {
    g_ntgetters = 0;
    PyObject *names[N_TATTRS] = {str_shape, str_dtype, str_is_cpu, str_requires_grad};
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(torch_plain) && g_ntgetters < 4; i++) {
        PyTypeObject *tp = (PyTypeObject *)PyTuple_GET_ITEM(torch_plain, i);
        if (!PyType_Check(tp) || tp->tp_getattro != PyObject_GenericGetAttr) continue;
        TensorGetters *g = &g_tgetters[g_ntgetters];
        int ok = 1;
        for (int k = 0; k < N_TATTRS && ok; k++) {
            PyObject *d = mro_lookup(tp, names[k]);
            if (!d || !Py_IS_TYPE(d, &PyGetSetDescr_Type) ||
                !((PyGetSetDescrObject *)d)->d_getset->get) {
                drop_error();
                ok = 0;
                break;
            }
            g->get[k] = ((PyGetSetDescrObject *)d)->d_getset->get;
            g->closure[k] = ((PyGetSetDescrObject *)d)->d_getset->closure;
        }
        if (!ok) continue;
        /* a type lookup gives the type its version tag (assigned lazily) */
        PyObject *d = PyObject_GetAttr((PyObject *)tp, str_shape);
        Py_XDECREF(d);
        drop_error();
        g->tp = tp;
        g->tag = tp->tp_version_tag;
        if (g->tag && PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG)) g_ntgetters++;
    }
}

static inline TensorGetters *tensor_getters(PyTypeObject *tp) {
    for (int i = 0; i < g_ntgetters; i++)
        if (g_tgetters[i].tp == tp)
            return tp->tp_version_tag == g_tgetters[i].tag &&
                           PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG)
                       ? &g_tgetters[i]
                       : NULL;
    return NULL;
}

static PyObject *torch_getters(PyObject *self, PyObject *unused) {
    /* the tensor types whose attributes are read through their getters now (tests) */
    PyObject *l = PyList_New(0);
    for (int i = 0; l && i < g_ntgetters; i++)
        if (tensor_getters(g_tgetters[i].tp) &&
            PyList_Append(l, (PyObject *)g_tgetters[i].tp) < 0)
            Py_CLEAR(l);
    return l;
}

static int describe_tensor(Descs *ds, PyObject *x, int32_t role, int32_t idx, int64_t seq) {
    int ok = 0;
    PyObject *shape, *dtype, *is_cpu, *grad;
    TensorGetters *g = tensor_getters(Py_TYPE(x));
    if (g) {
        shape = g->get[0](x, g->closure[0]);
        dtype = shape ? g->get[1](x, g->closure[1]) : NULL;
        is_cpu = dtype ? g->get[2](x, g->closure[2]) : NULL;
        grad = is_cpu ? g->get[3](x, g->closure[3]) : NULL;
    } else {
        shape = PyObject_GetAttr(x, str_shape);
        dtype = shape ? PyObject_GetAttr(x, str_dtype) : NULL;
        is_cpu = dtype ? PyObject_GetAttr(x, str_is_cpu) : NULL;
        grad = is_cpu ? PyObject_GetAttr(x, str_requires_grad) : NULL;
    }
    if (!grad) {
        drop_error(); /* nested tensors have no shape: the Python path */
        goto done;
    }
    if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) > MAX_INLINE_DIMS) goto done;
    PyObject *dt = PyDict_GetItemWithError(torch_dtype_sids, dtype);
    if (!dt) {
        drop_error();
        goto done;
    }
    Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    int64_t dims[MAX_INLINE_DIMS];
    for (Py_ssize_t i = 0; i < nd; i++) {
        PyObject *d = PyTuple_GET_ITEM(shape, i);
        if (!PyLong_CheckExact(d)) goto done; /* a symbolic size */
        dims[i] = PyLong_AsLongLong(d);
        if (dims[i] == -1 && PyErr_Occurred()) {
            drop_error();
            goto done;
        }
    }
    int32_t dev = s_cpu;
    if (is_cpu != Py_True) {
        long saved = tl_depth;
        tl_depth = INTERNAL;
        PyObject *name = PyObject_CallOneArg(py_device_name, x);
        tl_depth = saved;
        if (!name) {
            drop_error();
            goto done;
        }
        dev = sid_of(name);
        Py_DECREF(name);
        if (dev < 0) {
            drop_error();
            goto done;
        }
    }
    DescRec *r = descs_add(ds);
    if (!r) {
        ok = -1;
        goto done;
    }
    r->seq = seq;
    r->role = role;
    r->idx = idx;
    r->ndim = (int32_t)nd;
    for (Py_ssize_t i = 0; i < nd; i++) r->dims[i] = dims[i];
    r->dtype = (int32_t)PyLong_AsLong(dt);
    r->device = dev;
    r->grad = grad == Py_True;
    ok = 1;
done:
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_XDECREF(is_cpu);
    Py_XDECREF(grad);
    return ok;
}

/* 1: described; 0: not a NumPy array or scalar; -1: error */
/* Statistics in stats mode (set_stats): NumPy arrays and scalars are statted here, through
 * pprobe._dumpio's one-pass C code on their buffer (its capsule _C_STATS), with the Python
 * engine's rules (recorder._describe): an out= input and the outputs of an op whose outputs
 * are uninitialised memory get a note instead; what the C code does not take (complex,
 * byte-swapped, object, string dtypes) is statted by the Python handler (fallback). Torch
 * tensors (NumPy calls and the torch api level) are described here and statted by the torch
 * handler (tensor_stats: one Python call, CPU tensors read in C from their data pointer).
 * Dumps, PPROBE_DTYPES and PPROBE_ON_NAN stay with the Python engine. */
typedef int (*stats_fn)(PyObject *, double *, long long *);
static stats_fn g_stats_c = NULL;
static PyObject *py_stats_fallback = NULL; /* x -> (6-tuple) | None | str (the reason) */
static PyObject *py_tensor_stats = NULL;   /* tensor -> (6-tuple) | Lazy | None | str */
static stats_fn g_tstats_c = NULL; /* plain CPU tensors (_dumpio's _C_TENSOR_STATS), or NULL */
static PyObject *str_out_note = NULL, *str_uninit_note = NULL;
static int32_t s_out_kw = -3;
static int g_cur_uninit = 0; /* the outputs being described are uninitialised memory */

/* Statistics here: stats mode, and dump mode (statistics and a dump of each array: the dump
 * through py_dump, see dump_descs) */
static inline int stats_on(void) { return g_mode >= 1 && g_stats_c != NULL; }

static int desc_note(Descs *ds, DescRec *r, PyObject *note) {
    int32_t k = descs_obj(ds, Py_NewRef(note));
    if (k < 0) return -1;
    r->note = k;
    return 0;
}

static double null_nan(PyObject *v) { return v == Py_None ? Py_NAN : PyFloat_AsDouble(v); }

static int64_t null_count(PyObject *v) {
    if (v == Py_None) return -1;
    return (int64_t)PyFloat_AsDouble(v); /* ints and floats alike */
}

static int desc_stats_py(Descs *ds, DescRec *r, PyObject *x, PyObject *fn);

/* 1: statted in C by f (inline in the record); 0: not handled there */
static int desc_stats_c(DescRec *r, PyObject *x, stats_fn f) {
    double v[4];
    long long c[2];
    if (!f(x, v, c)) return 0;
    r->stats = -1; /* inline */
    r->mn = v[0];
    r->mx = v[1];
    r->mean = v[2];
    r->std = v[3];
    r->nan = c[0];
    r->inf = c[1];
    return 1;
}

/* Dump mode: the statistics of an array whose content was seen before are that content's,
 * taken from a table keyed by the content's digest and dtype, the digest that the dump needs
 * anyway (kept for it: dmemo). An op's output is the next op's input, and weights are read
 * again by the backward pass (their transposes too: the digest is of the memory): in the NumPy
 * MLP, more than half of the arrays dumped are contents seen before. Arrays of SMEMO_MIN bytes
 * and more, C- or Fortran-contiguous, while the dumper (g_dumper) takes dumps. */
#define SMEMO_MIN 4096
#define SMEMO_SLOTS 512
typedef struct {
    unsigned char h[16];
    int32_t dtype; /* the string id of the dtype's name; -1: an empty slot */
    double v[4];
    long long c[2];
} SMemo;
static SMemo *g_smemo = NULL;
/* this thread's digests of the arrays of the phase being recorded (describe, then dump): x
 * borrowed (an argument or an item of the result, alive for the call), the digest owned;
 * cleared when a phase starts and once it is dumped (memo_arm) */
#define DMEMO_N 32
static _Thread_local PyObject *tl_dm_x[DMEMO_N], *tl_dm_d[DMEMO_N];
static _Thread_local int tl_dm_n = 0;
static void dmemo_clear(void) {
    for (int i = 0; i < tl_dm_n; i++) {
        tl_dm_x[i] = NULL;
        Py_CLEAR(tl_dm_d[i]);
    }
    tl_dm_n = 0;
}
static PyObject *dmemo_get(PyObject *x) { /* borrowed, or NULL */
    for (int i = 0; i < tl_dm_n; i++)
        if (tl_dm_x[i] == x) return tl_dm_d[i];
    return NULL;
}
static PyObject *g_dumper;
static PyObject *str_c_digest, *str_nbytes, *str_n, *str_lock, *str_seen, *str_pack,
    *str_acquire, *str_release, *str_content_hash, *str_stop_note;

/* The dumper's fields that every dump reads (Dumper._view, pprobe/dumps.py), taken again only
 * when Dumper._n[DUMPER_VIEW] (a number per state of those fields; 0: Python takes every dump)
 * or the _n array itself (a forked child's) changes: no attribute lookup per dump. */
#define DUMPER_VIEW 6
typedef struct {
    PyObject *n; /* the _n array they were taken with (owned: its address is not reused) */
    int64_t view;
    PyObject *acquire, *release, *seen, *dg; /* the lock's methods, the seen dict, c_digest */
    long long pack;
    int xxh3; /* content_hash is "xxh3_128": the digest checks a pack entry (packs.py, v2) */
} DView;
static DView g_dv; /* the last view taken; callers hold their own copy (dview_take) */

static void dview_release(DView *v) {
    Py_CLEAR(v->n);
    Py_CLEAR(v->acquire);
    Py_CLEAR(v->release);
    Py_CLEAR(v->seen);
    Py_CLEAR(v->dg);
}

/* *out: dumper d's view, its references owned by the caller (dview_release), and *nbuf: its
 * _n's buffer (released by the caller). 0: Python takes this dump (the dumper says so, or a
 * field is not what this code expects): nothing to release, no error set. */
static int dview_take(PyObject *d, DView *out, Py_buffer *nbuf) {
    memset(out, 0, sizeof *out);
    PyObject *n = PyObject_GetAttr(d, str_n);
    if (!n) goto no;
    int got = PyObject_GetBuffer(n, nbuf, PyBUF_WRITABLE | PyBUF_FORMAT);
    Py_DECREF(n); /* (the buffer holds it) */
    if (got < 0) goto no;
    if (nbuf->itemsize != 8 || nbuf->len < (DUMPER_VIEW + 1) * 8) goto release;
    int64_t view = ((int64_t *)nbuf->buf)[DUMPER_VIEW];
    if (view <= 0) goto release; /* (0, or DUMPER_STOPPED: see dumper_stop_note) */
    if (nbuf->obj != g_dv.n || view != g_dv.view) { /* taken anew: locals, then one swap */
        DView v = {0};
        v.view = view;
        PyObject *lock = PyObject_GetAttr(d, str_lock);
        v.acquire = lock ? PyObject_GetAttr(lock, str_acquire) : NULL;
        v.release = lock ? PyObject_GetAttr(lock, str_release) : NULL;
        Py_XDECREF(lock);
        v.seen = PyObject_GetAttr(d, str_seen);
        v.dg = PyObject_GetAttr(d, str_c_digest);
        PyObject *pk = PyObject_GetAttr(d, str_pack);
        v.pack = pk ? PyLong_AsLongLong(pk) : -1;
        Py_XDECREF(pk);
        PyObject *chn = PyObject_GetAttr(d, str_content_hash);
        v.xxh3 = chn && PyUnicode_Check(chn) &&
                 PyUnicode_CompareWithASCIIString(chn, "xxh3_128") == 0;
        Py_XDECREF(chn);
        if (!v.acquire || !v.release || !v.seen || !PyDict_Check(v.seen) || !v.dg ||
            v.dg == Py_None || v.pack < 0 || PyErr_Occurred()) {
            dview_release(&v);
            goto release;
        }
        v.n = Py_NewRef(nbuf->obj);
        DView old = g_dv;
        g_dv = v;
        dview_release(&old);
    }
    *out = g_dv;
    Py_INCREF(out->n);
    Py_INCREF(out->acquire);
    Py_INCREF(out->release);
    Py_INCREF(out->seen);
    Py_INCREF(out->dg);
    return 1;
release:
    PyBuffer_Release(nbuf);
no:
    drop_error();
    return 0;
}

/* 1: r has the statistics of the content of x, nbytes at addr (seen before); 0: not seen
 * (*slot: where they go once computed, under the digest copied to h; or NULL). The digest is
 * kept for x's dump. Errors are cleared: the statistics are then computed as usual. */
static int smemo_mem(DescRec *r, PyObject *x, const void *addr, long long nbytes, SMemo **slot,
                     unsigned char h[16]) {
    if (nbytes < SMEMO_MIN || tl_dm_n >= DMEMO_N || !g_dumper) return 0;
    PyObject *dg = NULL, *mv = NULL, *d = NULL;
    DView view;
    Py_buffer nbuf;
    if (!dview_take(g_dumper, &view, &nbuf)) return 0; /* (exhausted, among others) */
    PyBuffer_Release(&nbuf);
    dg = Py_NewRef(view.dg);
    dview_release(&view);
    /* the bytes as dump_fast digests them (an array's own buffer, or a memoryview of this
     * memory: the same bytes, the same digest) */
    if (!(mv = PyMemoryView_FromMemory((char *)addr, (Py_ssize_t)nbytes, PyBUF_READ))) goto out;
    d = PyObject_CallOneArg(dg, mv);
    if (!d || !PyBytes_Check(d) || PyBytes_GET_SIZE(d) < 16) goto out;
    tl_dm_x[tl_dm_n] = x;
    tl_dm_d[tl_dm_n++] = Py_NewRef(d);
    if (!g_smemo) {
        if (!(g_smemo = PyMem_RawMalloc(sizeof(SMemo) * SMEMO_SLOTS))) goto out;
        for (int i = 0; i < SMEMO_SLOTS; i++) g_smemo[i].dtype = -1;
    }
    memcpy(h, PyBytes_AS_STRING(d), 16);
    uint64_t k;
    memcpy(&k, h, 8);
    SMemo *e = &g_smemo[(k ^ (uint64_t)r->dtype * 0x9E3779B97F4A7C15ull) % SMEMO_SLOTS];
    if (e->dtype == r->dtype && memcmp(e->h, h, 16) == 0) {
        r->stats = -1; /* inline */
        r->mn = e->v[0];
        r->mx = e->v[1];
        r->mean = e->v[2];
        r->std = e->v[3];
        r->nan = e->c[0];
        r->inf = e->c[1];
        Py_DECREF(d);
        Py_DECREF(dg);
        Py_DECREF(mv);
        return 1;
    }
    *slot = e;
out:
    drop_error();
    Py_XDECREF(d);
    Py_XDECREF(dg);
    Py_XDECREF(mv);
    return 0;
}

/* the statistics (computed by f, which takes x) into r and, where smemo_mem gave a slot, into
 * the table: 1 if f computed them */
static int smemo_stats(DescRec *r, PyObject *x, stats_fn f, SMemo *slot, const unsigned char *h) {
    if (!desc_stats_c(r, x, f)) return 0;
    if (slot) { /* all of it at once: the statistics may have let another thread run */
        memcpy(slot->h, h, 16);
        slot->v[0] = r->mn;
        slot->v[1] = r->mx;
        slot->v[2] = r->mean;
        slot->v[3] = r->std;
        slot->c[0] = r->nan;
        slot->c[1] = r->inf;
        slot->dtype = r->dtype;
    }
    return 1;
}

/* smemo_mem for a NumPy array */
static int smemo_find(DescRec *r, PyObject *x, SMemo **slot, unsigned char h[16]) {
    *slot = NULL;
    NpyArrayFields *a = (NpyArrayFields *)x;
    /* a plain ndarray of a builtin dtype (its descriptor a static singleton, cached by
     * descr_sid: native byte order, so the dtype's name and the bytes say the values) */
    if (!g_dumper || Py_TYPE(x) != np_ndarray || r->dtype < 0 ||
        !map2_find(&g_descrs, a->descr, 0))
        return 0;
    /* dense memory: the statistics read it in memory order (_dumpio's stats_strided), so
     * those of a transpose are its memory's, to the last bit */
    if (!(a->flags & NPY_C_CONTIGUOUS) && !npy_fortran(a)) return 0;
    PyObject *nb = PyObject_GetAttr(x, str_nbytes);
    long long nbytes = nb ? PyLong_AsLongLong(nb) : -1;
    Py_XDECREF(nb);
    return smemo_mem(r, x, a->data, nbytes, slot, h);
}

static int desc_stats(Descs *ds, DescRec *r, PyObject *x) {
    if (r->role == s_input && r->idx == s_out_kw) return desc_note(ds, r, str_out_note);
    if (r->role == s_output && g_cur_uninit) return desc_note(ds, r, str_uninit_note);
    SMemo *slot = NULL;
    unsigned char h[16];
    if (g_mode == 2 && smemo_find(r, x, &slot, h)) return 0;
    if (smemo_stats(r, x, g_stats_c, slot, h)) return 0;
    return desc_stats_py(ds, r, x, py_stats_fallback);
}

/* what a Python handler's stats(x) gave: a 6-tuple (inline), a str (the reason: a note),
 * None, or a Lazy resolved by the writer (an object; like the Python engine's rows) */
static int desc_stats_py(Descs *ds, DescRec *r, PyObject *x, PyObject *fn) {
    PyObject *st = PyObject_CallOneArg(fn, x);
    if (!st) {
        report("statistics");
        return 0;
    }
    if (PyTuple_CheckExact(st) && PyTuple_GET_SIZE(st) == 6) {
        r->stats = -1;
        r->mn = null_nan(PyTuple_GET_ITEM(st, 0));
        r->mx = null_nan(PyTuple_GET_ITEM(st, 1));
        r->mean = null_nan(PyTuple_GET_ITEM(st, 2));
        r->std = null_nan(PyTuple_GET_ITEM(st, 3));
        r->nan = null_count(PyTuple_GET_ITEM(st, 4));
        r->inf = null_count(PyTuple_GET_ITEM(st, 5));
        if (PyErr_Occurred()) {
            r->stats = STATS_NONE;
            r->mn = r->mx = r->mean = r->std = Py_NAN;
            r->nan = r->inf = -1;
            report("statistics");
        }
    } else if (PyUnicode_Check(st)) {
        if (desc_note(ds, r, st) < 0) {
            Py_DECREF(st);
            return -1;
        }
    } else if (st != Py_None) {
        int32_t k = descs_obj(ds, Py_NewRef(st));
        if (k < 0) {
            Py_DECREF(st);
            return -1;
        }
        r->stats = k;
    }
    Py_DECREF(st);
    return 0;
}

typedef int (*tensor_mem_fn)(PyObject *, void **, Py_ssize_t *, int *, Py_ssize_t *,
                             PyObject **);
static tensor_mem_fn g_tensor_mem; /* below */

/* a plain CPU tensor's statistics (f: _dumpio's, from its memory), in dump mode from the
 * table when its content was seen before (smemo_mem: the memory the dump reads) */
static int smemo_tensor(DescRec *r, PyObject *x, stats_fn f) {
    SMemo *slot = NULL;
    unsigned char h[16];
    if (g_mode == 2 && g_dumper && g_tensor_mem && r->dtype >= 0) {
        void *addr;
        Py_ssize_t nbytes, dims[64];
        int nd;
        PyObject *ts;
        if (g_tensor_mem(x, &addr, &nbytes, &nd, dims, &ts)) {
            if (smemo_mem(r, x, addr, nbytes, &slot, h)) return 1;
        } else {
            drop_error();
        }
    }
    return smemo_stats(r, x, f, slot, h);
}

static int describe_np(Descs *ds, PyObject *x, int32_t role, int32_t idx, int64_t seq) {
    PyTypeObject *tp = Py_TYPE(x);
    if (np_ndarray && (tp == np_ndarray || PyType_IsSubtype(tp, np_ndarray))) {
        NpyArrayFields *a = (NpyArrayFields *)x;
        int32_t dt = descr_sid(a->descr);
        if (dt == -2) return -1;
        if (a->nd > MAX_INLINE_DIMS) return 0; /* deep shapes: the Python path */
        DescRec *r = descs_add(ds);
        if (!r) return -1;
        r->seq = seq;
        r->role = role;
        r->idx = idx;
        r->ndim = a->nd;
        for (int i = 0; i < a->nd; i++) r->dims[i] = a->dimensions[i];
        r->dtype = dt;
        ds->src[ds->n - 1].x = x;
        if (stats_on() && desc_stats(ds, r, x) < 0) return -1;
        return 1;
    }
    if (torch_plain && PyTuple_GET_SIZE(torch_plain) && describe_tensor_type(tp)) {
        int st = stats_on();
        if (st && (!py_tensor_stats || py_tensor_stats == Py_None))
            return 0; /* the Python path */
        int r = describe_tensor(ds, x, role, idx, seq);
        if (r == 1) ds->src[ds->n - 1].x = x;
        if (r == 1 && st) {
            DescRec *d = &ds->d[ds->n - 1];
            if (d->role == s_input && d->idx == s_out_kw) {
                if (desc_note(ds, d, str_out_note) < 0) return -1;
            } else if (d->role == s_output && g_cur_uninit) {
                if (desc_note(ds, d, str_uninit_note) < 0) return -1;
            } else if (g_tstats_c && smemo_tensor(d, x, g_tstats_c)) {
                /* a plain CPU tensor, read in C from its memory (no Python call), or its
                 * content seen before (dump mode) */
            } else if (desc_stats_py(ds, d, x, py_tensor_stats) < 0) {
                return -1;
            }
        }
        return r;
    }
    if (np_generic && (tp == np_generic || PyType_IsSubtype(tp, np_generic))) {
        int32_t dt;
        PyObject *v = PyDict_GetItemWithError(np_scalar_sids, (PyObject *)tp);
        if (v) {
            dt = (int32_t)PyLong_AsLong(v);
        } else {
            if (PyErr_Occurred()) return -1;
            PyObject *descr = PyObject_GetAttr(x, str_dtype);
            if (!descr) return -1;
            dt = descr_sid(descr);
            Py_DECREF(descr);
            if (dt == -2) return -1;
        }
        DescRec *r = descs_add(ds);
        if (!r) return -1;
        r->seq = seq;
        r->role = role;
        r->idx = idx;
        r->ndim = 0;
        r->dtype = dt;
        ds->src[ds->n - 1].x = x;
        if (stats_on() && desc_stats(ds, r, x) < 0) return -1;
        return 1;
    }
    return 0;
}

/* The string id of position i's name ("0", "1", ...; past 63 made here: an output of a long
 * result). -1 (null) only when it cannot be made. */
static int32_t idx_sid(Py_ssize_t i) {
    if (i < 64) return s_idx0 + (int32_t)i;
    PyObject *name = PyUnicode_FromFormat("%zd", i);
    int32_t r = name ? sid_of(name) : -1;
    Py_XDECREF(name);
    if (r < 0) drop_error();
    return r;
}

/* A tuple holding nothing the garbage collector follows (str, bytes, numbers, None, or tuples
 * of those) can be in no reference cycle: untrack it now, as CPython would at a collection
 * (it untracks such tuples in the generation it collects, but an outer tuple seen before its
 * inner ones stays tracked until a later collection). A row's args wait in the buffer until
 * the flush (~1 s); tracked, they are promoted to the oldest generation, and full collections,
 * which scan every object of the program, come sooner and are charged to its threads. */
static void untrack_leaf_tuple(PyObject *t) {
    if (!PyTuple_CheckExact(t) || !PyObject_GC_IsTracked(t)) return;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); i++) {
        PyObject *e = PyTuple_GET_ITEM(t, i);
        if (PyTuple_CheckExact(e)) untrack_leaf_tuple(e);
        if (PyObject_IS_GC(e) && PyObject_GC_IsTracked(e)) return;
    }
    PyObject_GC_UnTrack(t);
}

/* untrack_sample(entry): the extension tables' sampled entry (pprobe.ext.tables.sample:
 * (step, rank, ts, sources, values)) and its values tuple, untracked. Each waits in
 * tables._raw (its one referrer) for the flush, ~1 s; tracked (the values tuple holds a
 * table's dict copy, which keeps a tuple tracked), every older-generation collection scans
 * them meanwhile. They are in no reference cycle: nothing they reach refers to them (only
 * _raw does, and the flush drops them), so refcounting frees them and the collector has
 * nothing to find through them. */
static PyObject *untrack_sample(PyObject *self, PyObject *e) {
    if (PyTuple_CheckExact(e) && PyObject_GC_IsTracked(e)) {
        Py_ssize_t n = PyTuple_GET_SIZE(e);
        PyObject *v = n ? PyTuple_GET_ITEM(e, n - 1) : NULL;
        if (v && PyTuple_CheckExact(v) && PyObject_GC_IsTracked(v)) PyObject_GC_UnTrack(v);
        PyObject_GC_UnTrack(e);
    }
    Py_RETURN_NONE;
}

/* A row's args tuple waits in the buffer for the writer's flush. Made anew for every call,
 * these tuples (and their pairs) raise the collector's count of new objects until a young
 * collection runs, and their release after it cannot lower the count again: a program that
 * allocates nothing per iteration (a SciPy loop) would see young collections only because of
 * the probe, each moving the program's own pending objects on, until a full collection (~50
 * ms on the SciPy loop) comes due in the middle of its loop. So an args tuple made only of
 * atomic values (str, int, float, bool, None, bytes and tuples of them) is shared between the
 * rows that have it: the first is kept in g_args_intern, and a later equal one, the same in
 * every type and every float's bits (1 == 1.0 == True, 0.0 == -0.0 in Python: these must not
 * meet), is released at once for it. Bounded: cleared at 4096 entries. */
static PyObject *g_args_intern = NULL; /* dict: args tuple -> itself */

static int args_atomic(PyObject *o, int depth) {
    if (o == Py_None || PyUnicode_CheckExact(o) || PyLong_CheckExact(o) || PyBool_Check(o) ||
        PyFloat_CheckExact(o) || PyBytes_CheckExact(o))
        return 1;
    if (!PyTuple_CheckExact(o) || depth >= 4) return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); i++)
        if (!args_atomic(PyTuple_GET_ITEM(o, i), depth + 1)) return 0;
    return 1;
}

static int args_same(PyObject *a, PyObject *b) {
    if (Py_TYPE(a) != Py_TYPE(b)) return 0;
    if (PyFloat_CheckExact(a)) {
        double x = PyFloat_AS_DOUBLE(a), y = PyFloat_AS_DOUBLE(b);
        return memcmp(&x, &y, sizeof x) == 0;
    }
    if (PyTuple_CheckExact(a)) {
        Py_ssize_t n = PyTuple_GET_SIZE(a);
        if (n != PyTuple_GET_SIZE(b)) return 0;
        for (Py_ssize_t i = 0; i < n; i++)
            if (!args_same(PyTuple_GET_ITEM(a, i), PyTuple_GET_ITEM(b, i))) return 0;
    }
    return 1;
}

/* t (stolen) or the equal args tuple kept before (a new reference) */
static PyObject *args_interned(PyObject *t) {
    if (!args_atomic(t, 0)) return t;
    if (!g_args_intern && !(g_args_intern = PyDict_New())) {
        drop_error();
        return t;
    }
    PyObject *c = PyDict_GetItemWithError(g_args_intern, t); /* borrowed */
    if (c) {
        if (!args_same(c, t)) return t;
        Py_DECREF(t);
        return Py_NewRef(c);
    }
    if (PyErr_Occurred()) {
        drop_error();
        return t;
    }
    if (PyDict_GET_SIZE(g_args_intern) >= 4096) PyDict_Clear(g_args_intern);
    if (PyDict_SetItem(g_args_intern, t, t) < 0) drop_error();
    return t;
}

/* Add an (idx, value) pair to the args; a cached small int becomes (None, "idx=v"). */
static int add_pair(Descs *ds, PyObject *idx, PyObject *v) {
    if (!ds->pairs) {
        ds->pairs = PyList_New(0);
        if (!ds->pairs) return -1;
    }
    PyObject *pair;
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long x = PyLong_AsLongAndOverflow(v, &overflow);
        if (!overflow && x >= -5 && x <= 256) {
            PyObject *text = PyUnicode_FromFormat("%U=%ld", idx, x);
            if (!text) return -1;
            pair = PyTuple_Pack(2, Py_None, text);
            Py_DECREF(text);
        } else {
            pair = PyTuple_Pack(2, idx, v);
        }
    } else {
        pair = PyTuple_Pack(2, idx, v);
    }
    if (!pair) return -1;
    untrack_leaf_tuple(pair);
    int r = PyList_Append(ds->pairs, pair);
    Py_DECREF(pair);
    return r;
}

static PyObject *py_other_pair = NULL; /* values.other_pair(idx, value) -> pair or None */
static PyObject *py_shown_by_type = NULL; /* values.shown_by_type(type) -> bool */

/* A tuple of at most 8 exact ints (a shape, axes): the pair values.other_pair gives for it,
 * made here. With a cached small int (-5..256) the ints are packed as native int64s, (None,
 * (idx, packed)); without one, (idx, the tuple). 1: handled; 0: not such a tuple (or an int
 * past int64): other_pair's; -1: error. */
static int int_tuple_pair(Descs *ds, PyObject *t, PyObject *idx) {
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    if (n > 8) return 0;
    int64_t v[8];
    int small = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyTuple_GET_ITEM(t, i);
        if (!PyLong_CheckExact(e)) return 0;
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(e, &overflow);
        if (overflow) return 0;
        if (x == -1 && PyErr_Occurred()) {
            drop_error();
            return 0;
        }
        if (x >= -5 && x <= 256) small = 1;
        v[i] = (int64_t)x;
    }
    PyObject *pair;
    if (!small) {
        pair = PyTuple_Pack(2, idx, t);
    } else {
        PyObject *b = PyBytes_FromStringAndSize((const char *)v, n * (Py_ssize_t)sizeof(int64_t));
        PyObject *inner = b ? PyTuple_Pack(2, idx, b) : NULL;
        Py_XDECREF(b);
        pair = inner ? PyTuple_Pack(2, Py_None, inner) : NULL;
        Py_XDECREF(inner);
    }
    if (!pair) return -1;
    untrack_leaf_tuple(pair);
    if (!ds->pairs && !(ds->pairs = PyList_New(0))) {
        Py_DECREF(pair);
        return -1;
    }
    int r = PyList_Append(ds->pairs, pair);
    Py_DECREF(pair);
    return r < 0 ? -1 : 1;
}

/* Texts of arguments recorded as (None, "idx=text") whose text depends on the object alone
 * and the object lives as long as the process (a static class such as np.float64, a builtin
 * dtype), or on its type alone (an object shown by its type, ``<numpy._CopyMode>``): key
 * (object, 1) or (type, 2) -> a = the text (a new reference), b = 1; a type whose objects
 * are not shown by their type has (type, 2) with a = NULL. Type keys are held (a type stays
 * alive while it is here), object keys are not (they live as long as the process); at most
 * ARG_TEXTS_MAX keys. values' registrations, which may change how a type's values are
 * shown, empty it (clear_arg_texts). */
static Map2 g_arg_texts;
#define ARG_TEXTS_MAX 1024

static void arg_texts_clear(void) {
    for (size_t j = 0; j < g_arg_texts.cap; j++) {
        Slot2 *s = &g_arg_texts.slots[j];
        if (!s->key) continue;
        if (s->k2 == 2) Py_DECREF((PyObject *)s->key); /* (object, 1) keys are not held */
        Py_XDECREF((PyObject *)s->a);
    }
    PyMem_Free(g_arg_texts.slots);
    g_arg_texts.slots = NULL;
    g_arg_texts.cap = g_arg_texts.n = 0;
}

static PyObject *clear_arg_texts(PyObject *self, PyObject *unused) {
    arg_texts_clear();
    Py_RETURN_NONE;
}

static int arg_text_put(PyObject *key, intptr_t k2, PyObject *text) {
    Slot2 *s = map2_put(&g_arg_texts, key, k2);
    if (!s) {
        drop_error();
        return 0;
    }
    if (s->b) return 0; /* already there */
    /* A type is held (a heap type could be freed and its address reused); an (object, 1)
     * key lives as long as the process (a static type, a builtin dtype: arg_text_learn) and
     * is not: NumPy's tests count a builtin dtype's references around a call. */
    if (k2 == 2) Py_INCREF(key);
    s->a = (intptr_t)Py_XNewRef(text);
    s->b = 1;
    return 0;
}

/* After other_pair gave `pair` for x: remember x's text when it depends on x or its type. */
static void arg_text_learn(PyObject *x, PyObject *idx, PyObject *pair) {
    if (g_arg_texts.n >= ARG_TEXTS_MAX) return;
    PyObject *tp = (PyObject *)Py_TYPE(x);
    Slot2 *st = map2_find(&g_arg_texts, tp, 2);
    int by_type;
    if (st) {
        by_type = st->a != 0;
    } else {
        if (!py_shown_by_type) return;
        PyObject *r = PyObject_CallOneArg(py_shown_by_type, tp);
        by_type = r ? PyObject_IsTrue(r) == 1 : 0;
        Py_XDECREF(r);
        drop_error();
    }
    PyObject *text = NULL;
    if (PyTuple_GET_ITEM(pair, 0) == Py_None && PyUnicode_CheckExact(PyTuple_GET_ITEM(pair, 1))) {
        PyObject *full = PyTuple_GET_ITEM(pair, 1);
        Py_ssize_t k = PyUnicode_GET_LENGTH(idx);
        if (PyUnicode_GET_LENGTH(full) > k && PyUnicode_Tailmatch(full, idx, 0, k, -1) == 1 &&
            PyUnicode_READ_CHAR(full, k) == '=')
            text = PyUnicode_Substring(full, k + 1, PyUnicode_GET_LENGTH(full));
        drop_error();
    }
    if (!st) arg_text_put(tp, 2, by_type ? text : NULL);
    if (text && !by_type) {
        int immortal = PyType_Check(x) && !(((PyTypeObject *)x)->tp_flags & Py_TPFLAGS_HEAPTYPE);
        if (!immortal && np_descr_sids) { /* a builtin dtype: a static singleton */
            PyObject *key = PyLong_FromVoidPtr(x);
            immortal = key && PyDict_Contains(np_descr_sids, key) == 1;
            Py_XDECREF(key);
            drop_error();
        }
        if (immortal) arg_text_put(x, 1, text);
    }
    Py_XDECREF(text);
}

/* x's text when known (borrowed), else NULL */
static inline PyObject *arg_text_known(PyObject *x) {
    if (!g_arg_texts.n) return NULL;
    Slot2 *s = map2_find(&g_arg_texts, x, 1);
    if (s) return (PyObject *)s->a;
    s = map2_find(&g_arg_texts, (PyObject *)Py_TYPE(x), 2);
    return s ? (PyObject *)s->a : NULL;
}

/* One argument: 1 handled, 0 unknown kind (use the Python path), -1 error. An argument that
 * is neither an array nor a plain scalar (a class, a dtype, a shape tuple, an enum) is
 * handed to values.other_pair, which gives the (name, value) pair the Python engine records
 * for it, or None when it is or holds an array: then the Python path records the call. The
 * commonest such arguments are answered here: tuples of ints (int_tuple_pair) and the texts
 * other_pair gave before for the same object or type (g_arg_texts). */
static int describe_arg(Descs *ds, PyObject *x, PyObject *idx_obj, int32_t idx, int64_t seq) {
    int r = describe_np(ds, x, s_input, idx, seq);
    if (r) return r;
    if (PyFloat_CheckExact(x) || PyLong_CheckExact(x) || x == Py_None || PyBool_Check(x) ||
        PyUnicode_CheckExact(x))
        return add_pair(ds, idx_obj, x) < 0 ? -1 : 1;
    if (!py_other_pair) return 0;
    if (PyTuple_CheckExact(x)) {
        r = int_tuple_pair(ds, x, idx_obj);
        if (r) return r;
    }
    PyObject *pair;
    PyObject *text = arg_text_known(x);
    if (text) {
        PyObject *full = PyUnicode_FromFormat("%U=%U", idx_obj, text);
        pair = full ? PyTuple_Pack(2, Py_None, full) : NULL;
        Py_XDECREF(full);
        if (!pair) return -1;
    } else {
        pair = PyObject_CallFunctionObjArgs(py_other_pair, idx_obj, x, NULL);
        if (!pair || !PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            /* an array, or the helper failed: the Python path */
            Py_XDECREF(pair);
            drop_error();
            return 0;
        }
        arg_text_learn(x, idx_obj, pair);
    }
    if (!ds->pairs && !(ds->pairs = PyList_New(0))) {
        Py_DECREF(pair);
        return -1;
    }
    untrack_leaf_tuple(pair);
    r = PyList_Append(ds->pairs, pair);
    Py_DECREF(pair);
    return r < 0 ? -1 : 1;
}

static PyObject *set_dump(PyObject *self, PyObject *fn) {
    /* set_dump(fn or None): dump mode's arrays are dumped through fn (see dump_descs) */
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "set_dump takes a callable or None");
        return NULL;
    }
    Py_XSETREF(py_dump, fn == Py_None ? NULL : Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyObject *set_other_pair(PyObject *self, PyObject *args) {
    /* set_other_pair(fn or None, shown_by_type=None) */
    PyObject *fn, *sbt = Py_None;
    if (!PyArg_ParseTuple(args, "O|O", &fn, &sbt)) return NULL;
    Py_XSETREF(py_other_pair, fn == Py_None ? NULL : Py_NewRef(fn));
    Py_XSETREF(py_shown_by_type, sbt == Py_None ? NULL : Py_NewRef(sbt));
    arg_texts_clear();
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ the hot path */
static inline PyObject *call_vc(PyObject *fn, vectorcallfunc orig, PyObject *const *args,
                                size_t nargsf, PyObject *kwnames) {
    if (orig) return orig(fn, args, nargsf, kwnames);
    return PyObject_Vectorcall(fn, args, nargsf, kwnames);
}

static PyObject *hidden_call(PyObject *fn, vectorcallfunc orig, PyObject *const *args,
                             size_t nargsf, PyObject *kwnames) {
    long depth = tl_depth;
    tl_depth = depth + 1;
    PyObject *r = call_vc(fn, orig, args, nargsf, kwnames);
    tl_depth = depth;
    return r;
}

/* Operators: op indices by (opclass, ufunc), from set_operators() */
static PyObject *g_operator_ops = NULL; /* dict: (opclass, ufunc name, reflected) -> op index */

/* (hooked ufunc, opclass * 2 + reflected) -> op index + 2 (0: not looked up; 1: none) */
static Map2 g_operator_cache;

static Py_ssize_t operator_op(int opclass, PyObject *ufunc, PyObject *const *args,
                              Py_ssize_t nargs) {
    if (!g_operator_ops || !np_ndarray || opclass == K_CALL) return -1;
    int reflected = 0;
    if ((opclass == K_BINARY || opclass == K_INPLACE) && nargs >= 2 &&
        !PyObject_TypeCheck(args[0], np_ndarray) && PyObject_TypeCheck(args[1], np_ndarray))
        reflected = 1;
    /* the ufuncs are the hooked public ones, alive for good: their address is the key */
    Slot2 *s = map2_find(&g_operator_cache, ufunc, opclass * 2 + reflected);
    if (s) return (Py_ssize_t)s->a - 2;
    Py_ssize_t found = -1;
    PyObject *name = PyObject_GetAttr(ufunc, str_name);
    PyObject *key = name ? Py_BuildValue("(iNi)", opclass, name, reflected) : NULL;
    PyObject *v = key ? PyDict_GetItemWithError(g_operator_ops, key) : NULL;
    if (v) found = PyLong_AsSsize_t(v);
    Py_XDECREF(key);
    drop_error();
    s = map2_put(&g_operator_cache, ufunc, opclass * 2 + reflected);
    if (s) s->a = found + 2;
    return found;
}

static PyObject *g_ops_list = NULL; /* recorder.ops_by_index */

/* Whether op `opi`'s outputs are uninitialised memory (its Op's `uninit`, looked up once) */
static int op_uninit(Py_ssize_t opi) {
    OpInfo *oi = op_info(opi);
    if (!oi) return 0;
    if (!oi->uninit) {
        int u = 0;
        if (g_ops_list && PyList_Check(g_ops_list) && opi < PyList_GET_SIZE(g_ops_list)) {
            PyObject *v = PyObject_GetAttrString(PyList_GET_ITEM(g_ops_list, opi), "uninit");
            u = v ? PyObject_IsTrue(v) == 1 : 0;
            Py_XDECREF(v);
            drop_error();
        }
        oi->uninit = u ? 2 : 1;
    }
    return oi->uninit == 2;
}

/* Dump mode: the .npy header of a plain ndarray (not a subclass) of a builtin numeric dtype
 * (bool, integers, floats, complex), byte for byte what pprobe.dumps.npy_header makes for it
 * (version 1.0, C order or, for an array dumped as its memory in Fortran order
 * (npy_fortran), Fortran order, padded so that the data starts at a multiple of 64); None
 * where Python makes it (other dtypes, deep shapes, subclasses, NumPy scalars).
 * g_npy_heads: (builtin descr, Fortran order) -> a = the bytes of
 * "{'descr': '<f8', 'fortran_order': False, 'shape': (" or Py_None for a dtype left to
 * Python; values held for the process, keys not (builtin descriptors are static). */
static Map2 g_npy_heads;

/* v in decimal at p (no terminator); the number of chars (at most 20) */
static int put_dec(char *p, long long v) {
    char t[24];
    int k = 0;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        t[k++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    int n = 0;
    if (v < 0) p[n++] = '-';
    while (k) p[n++] = t[--k];
    return n;
}

static PyObject *npy_header_dims(PyObject *head, int nd, const Py_ssize_t *dims);

/* the start of a header's text for NumPy's type string `typestr` (a str), C- or
 * Fortran-ordered: bytes */
static PyObject *npy_head_text(PyObject *typestr, int fortran) {
    PyObject *t = PyUnicode_FromFormat("{'descr': %R, 'fortran_order': %s, 'shape': (",
                                       typestr, fortran ? "True" : "False");
    PyObject *head = t ? PyUnicode_AsLatin1String(t) : NULL;
    Py_XDECREF(t);
    return head;
}

/* the start of the .npy header text of a builtin numeric descriptor (borrowed), or None
 * (another dtype; nothing raised) */
static PyObject *npy_head_of_descr(PyObject *descr, int fortran) {
    Slot2 *s = map2_find(&g_npy_heads, descr, fortran);
    if (!s && (descr_sid(descr) == -2 || !map2_find(&g_descrs, descr, 0))) {
        drop_error(); /* not a builtin descriptor (only those are in g_descrs) */
        return Py_None;
    }
    if (!s) {
        PyObject *head = NULL;
        PyObject *kind = PyObject_GetAttrString(descr, "kind");
        PyObject *str = kind ? PyObject_GetAttrString(descr, "str") : NULL;
        if (str && PyUnicode_Check(kind) && PyUnicode_GET_LENGTH(kind) == 1 &&
            strchr("biufc", (int)PyUnicode_READ_CHAR(kind, 0)))
            head = npy_head_text(str, fortran);
        Py_XDECREF(kind);
        Py_XDECREF(str);
        if (!head) {
            drop_error();
            head = Py_NewRef(Py_None);
        }
        s = map2_put(&g_npy_heads, descr, fortran);
        if (!s) {
            Py_DECREF(head);
            drop_error();
            return Py_None;
        }
        s->a = (intptr_t)head; /* a builtin descriptor (static): its key is not held */
    }
    return (PyObject *)s->a;
}

static PyObject *npy_header_of(PyObject *x) {
    if (!np_ndarray || Py_TYPE(x) != np_ndarray) Py_RETURN_NONE; /* a subclass: Python's */
    NpyArrayFields *a = (NpyArrayFields *)x;
    if (a->nd > MAX_INLINE_DIMS) Py_RETURN_NONE;
    PyObject *head = npy_head_of_descr(a->descr, npy_fortran(a));
    if (head == Py_None) Py_RETURN_NONE;
    Py_ssize_t dims[MAX_INLINE_DIMS];
    for (int i = 0; i < a->nd; i++) dims[i] = (Py_ssize_t)a->dimensions[i];
    return npy_header_dims(head, a->nd, dims);
}

/* The header of C-ordered elements of `nd` (<= MAX_INLINE_DIMS) dimensions after `head`, the
 * text's start up to the shape's parenthesis (g_npy_heads' values); None when too long */
static PyObject *npy_header_dims(PyObject *head, int nd, const Py_ssize_t *dims) {
    /* magic (6), version 1.0 (2), header length (2, little endian), then the text */
    char buf[512];
    Py_ssize_t hn = PyBytes_GET_SIZE(head), n = 10;
    if (hn > 256 || nd > MAX_INLINE_DIMS) Py_RETURN_NONE;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    memcpy(buf + n, PyBytes_AS_STRING(head), hn);
    n += hn;
    for (int i = 0; i < nd; i++) {
        if (i) {
            buf[n++] = ',';
            buf[n++] = ' ';
        }
        n += put_dec(buf + n, (long long)dims[i]);
    }
    if (nd == 1) buf[n++] = ',';
    memcpy(buf + n, "), }", 4);
    n += 4;
    Py_ssize_t pad = (64 - (n + 1) % 64) % 64;
    memset(buf + n, ' ', pad);
    n += pad;
    buf[n++] = '\n';
    Py_ssize_t text = n - 10;
    buf[8] = (char)(text & 0xff);
    buf[9] = (char)((text >> 8) & 0xff);
    return PyBytes_FromStringAndSize(buf, n);
}

static PyObject *npy_header(PyObject *self, PyObject *x) { return npy_header_of(x); }

/* Dump mode: the common dump made here, the twin of Dumper._dump (pprobe/dumps.py) for a
 * C-contiguous plain ndarray of a numeric dtype (its header made by npy_header_of), or a
 * Fortran-ordered one (npy_fortran: its memory, as the header says), or for a plain CPU
 * tensor's memory (a memoryview and its header: tensor_dump_mem), when the
 * dumper keeps no ring, writes npy through the native queue and waits when it is full
 * (recorder hands it over only then: set_dumper). The name (a cached op_{op}_{which}_ head,
 * then {pid}-{seq}.npy), the content's key (the dumper's c_digest of the memory, 64 bytes
 * and more), the seen-content dict, the budget counters and the queue's submit are the
 * dumper's own objects, taken under its lock (a non-blocking acquire). Whatever this does not
 * take (budget past the chunks held, the first dump, exhaustion, a busy lock, a long name) is
 * left to Python before anything changed: *done = 0. */
static PyObject *g_dumper = NULL, *g_dump_submit = NULL, *g_dump_head = NULL; /* g_dumper: above */
static tensor_mem_fn g_tensor_mem = NULL; /* _dumpio's c_tensor_mem, or NULL */
typedef void (*tensor_memo_fn)(int);
/* _dumpio's c_tensor_memo, or NULL: armed before a dump-mode phase's descriptions (the
 * statistics' tensor reads are kept for the dumps), cleared once the phase is dumped */
static tensor_memo_fn g_tensor_memo = NULL;
static inline void memo_arm(int on) {
    if (g_tensor_memo) g_tensor_memo(on && g_mode == 2);
    /* a dump-mode phase starts, or is dumped: its digests are forgotten (only dump mode
     * keeps any, and clears what an earlier one left at its first phase: log and stats
     * modes read no thread-local here) */
    if (g_mode == 2 && tl_dm_n) dmemo_clear();
}
static Map2 g_tensor_heads;               /* NumPy type string (str) -> a = its header's start */
/* this process's pid in dump names (0: not read yet; a forked child reads its own) */
static long g_dump_pid = 0;
static void dump_pid_child(void) { g_dump_pid = 0; }
static PyObject *str_unsubmit, *str_op_name, *str_reserve; /* and those above dview_take */
/* (op index + 1, kind << 40 | idx) -> a = the name's head (str, owned) */
static Map2 g_dump_heads;
#define DUMP_SEEN_MAX (1 << 16)

static PyObject *dump_head(Py_ssize_t opi, int kind, Py_ssize_t idx) {
    intptr_t k2 = ((intptr_t)kind << 40) | (intptr_t)idx;
    Slot2 *s = map2_find(&g_dump_heads, (void *)(intptr_t)(opi + 1), k2);
    if (s) return (PyObject *)s->a;
    PyObject *op = PyList_GetItem(g_ops_list, opi); /* borrowed */
    PyObject *name = op ? PyObject_GetAttr(op, str_op_name) : NULL;
    PyObject *which = NULL, *head = NULL;
    if (name) {
        if (kind == 0) {
            PyObject *strs = PyObject_GetAttrString(g_records_mod, "strings");
            PyObject *arg = strs ? PySequence_GetItem(strs, idx) : NULL;
            which = arg ? PyUnicode_FromFormat("input%U", arg) : NULL;
            Py_XDECREF(arg);
            Py_XDECREF(strs);
        } else {
            which = kind == 1 ? PyUnicode_FromString("output")
                              : PyUnicode_FromFormat("output%zd", idx);
        }
    }
    if (which) head = PyObject_CallFunctionObjArgs(g_dump_head, name, which, NULL);
    Py_XDECREF(name);
    Py_XDECREF(which);
    if (!head) return NULL;
    if (!PyUnicode_Check(head) || g_dump_heads.n >= 65536) {
        Py_DECREF(head);
        PyErr_SetString(PyExc_TypeError, "dump head");
        return NULL;
    }
    s = map2_put(&g_dump_heads, (void *)(intptr_t)(opi + 1), k2);
    if (!s) {
        Py_DECREF(head);
        return NULL;
    }
    s->a = (intptr_t)head;
    return head;
}

static int attr_true(PyObject *o, PyObject *name) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v) return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* x: what is dumped (an array, or a tensor's memory); src: the object described (its digest
 * may be known: dmemo) */
static PyObject *dump_fast(PyObject *x, PyObject *src, PyObject *header, Py_ssize_t opi,
                           int64_t seq, int kind, Py_ssize_t idx, int *done) {
    *done = 0;
    PyObject *d = g_dumper;
    if (!d || header == Py_None) return NULL;
    /* an ndarray (npy_header_of), or a memoryview of a CPU tensor's C-ordered elements */
    int fortran = 0;
    if (!PyMemoryView_Check(x) && !(((NpyArrayFields *)x)->flags & NPY_C_CONTIGUOUS)) {
        if (!npy_fortran((NpyArrayFields *)x)) return NULL;
        fortran = 1; /* its memory as it is, under npy_header_of's Fortran-order header */
    }
    PyObject *flat = NULL; /* a Fortran-ordered array's memory as bytes */
    PyObject *digest = NULL, *key = NULL;
    PyObject *name = NULL, *nb = NULL, *res = NULL, *out = NULL;
    Py_buffer nbuf = {0};
    DView v; /* the dumper's lock, seen dict, digest function, pack size */
    if (!dview_take(d, &v, &nbuf)) return NULL; /* (nothing taken) */
    int locked = 0, reserved = 0;
    PyObject *dg = v.dg;
    /* the digest is XXH3-128: it checks the dump's pack entry (pprobe/packs.py, version 2) */
    int xxh3 = v.xxh3;
    PyObject *head = dump_head(opi, kind, idx); /* borrowed */
    if (!head) goto python;
    if (!g_dump_pid) g_dump_pid = (long)getpid(); /* a syscall: once per process */
    Py_ssize_t hl;
    const char *hs = PyUnicode_AsUTF8AndSize(head, &hl); /* ASCII: the str's own data */
    char nbuf_[256];
    if (!hs || hl > 160) goto python;
    memcpy(nbuf_, hs, (size_t)hl);
    int tl = put_dec(nbuf_ + hl, g_dump_pid);
    nbuf_[hl + tl++] = '-';
    tl += put_dec(nbuf_ + hl + tl, (long long)seq);
    memcpy(nbuf_ + hl + tl, ".npy", 4);
    tl += 4;
    if (hl + tl > 200) goto python; /* dumps.NAME_MAX: Python cuts it */
    if (!(name = PyUnicode_DecodeASCII(nbuf_, hl + tl, NULL))) goto python;
    if (!(nb = PyObject_GetAttr(x, str_nbytes))) goto python;
    long long nbytes = PyLong_AsLongLong(nb);
    if (nbytes < 0) goto python;
    if (fortran) { /* the digest and the queue read it as bytes (Python: its transpose's) */
        flat = PyMemoryView_FromMemory(((NpyArrayFields *)x)->data, (Py_ssize_t)nbytes,
                                       PyBUF_READ);
        if (!flat) goto python;
        x = flat;
    }
    if (nbytes >= 64) {
        PyObject *memo = dmemo_get(src); /* taken with its statistics (smemo_mem) */
        digest = memo ? Py_NewRef(memo) : PyObject_CallOneArg(dg, x);
        if (!digest) drop_error(); /* no buffer: not deduplicated, as Python's digest */
        else if (digest != Py_None) { /* digest + header, as Dumper._dump's key (bytes) */
            if (!PyBytes_Check(digest)) goto python;
            Py_ssize_t dl = PyBytes_GET_SIZE(digest), hl2 = PyBytes_GET_SIZE(header);
            if (!(key = PyBytes_FromStringAndSize(NULL, dl + hl2))) goto python;
            memcpy(PyBytes_AS_STRING(key), PyBytes_AS_STRING(digest), (size_t)dl);
            memcpy(PyBytes_AS_STRING(key) + dl, PyBytes_AS_STRING(header), (size_t)hl2);
        }
    }
    long long total = PyBytes_GET_SIZE(header) + nbytes;
    long long pack_max = v.pack;
    PyObject *seen = v.seen;
    PyObject *r = PyObject_CallOneArg(v.acquire, Py_False);
    locked = r == Py_True;
    Py_XDECREF(r);
    if (!locked) goto python; /* another thread is in the dumper: Python waits for it */
    int64_t *n = (int64_t *)nbuf.buf; /* Dumper._n: held, used, linked, ... */
    PyObject *first = key ? PyDict_GetItemWithError(seen, key) : NULL; /* borrowed */
    if (!first && PyErr_Occurred()) goto python;
    if (!first) {
        if (n[1] + total > n[0]) {
            /* past the budget chunks held: Dumper._reserve takes the next (the lock is held,
             * as it requires); too little left, or an error: Python takes the dump and says
             * why */
            PyObject *tot = PyLong_FromLongLong(total);
            PyObject *ok = tot ? PyObject_CallMethodOneArg(d, str_reserve, tot) : NULL;
            Py_XDECREF(tot);
            reserved = ok == Py_True; /* (it counted the bytes as used) */
            Py_XDECREF(ok);
            if (!reserved) goto python;
        }
        if (key) {
            if (PyDict_GET_SIZE(seen) >= DUMP_SEEN_MAX) PyDict_Clear(seen);
            if (PyDict_SetItem(seen, key, name) < 0) {
                if (reserved) n[1] -= total; /* (the chunk stays held) */
                goto python;
            }
        }
        if (!reserved) n[1] += total;
    } else {
        n[2] += 1;
    }
    Py_XINCREF(first); /* seen may change once the lock is released */
    r = PyObject_CallNoArgs(v.release);
    Py_XDECREF(r);
    locked = 0;
    PyBuffer_Release(&nbuf);
    if (!r) {
        Py_XDECREF(first);
        goto fail;
    }
    int pack = total <= pack_max;
    /* a new content's digest goes with it (Dumper._dump does the same) */
    int with_dg = !first && xxh3 && digest && digest != Py_None && PyBytes_Check(digest) &&
                  PyBytes_GET_SIZE(digest) == 16;
    PyObject *argv[7] = {name, first ? PyBytes_FromStringAndSize(NULL, 0) : Py_NewRef(header),
                         first ? Py_None : x, first ? first : Py_None, Py_True,
                         pack ? Py_True : Py_False, with_dg ? digest : Py_None};
    res = argv[1] ? PyObject_Vectorcall(g_dump_submit, argv, with_dg ? 7 : 6, NULL) : NULL;
    Py_XDECREF(argv[1]);
    if (res == Py_False) { /* refused (the writer is gone): what Python does then */
        PyObject *tot = PyLong_FromLongLong(total);
        out = tot ? PyObject_CallMethodObjArgs(d, str_unsubmit, key ? key : Py_None, name,
                                               first ? first : Py_None, tot, NULL)
                  : NULL;
        Py_XDECREF(tot);
        Py_XDECREF(first);
        *done = out != NULL;
        if (!out) goto fail;
        goto end;
    }
    Py_XDECREF(first);
    if (!res) goto fail;
    out = PyTuple_Pack(2, name, Py_None);
    *done = out != NULL;
    if (!out) goto fail;
    goto end;
python: /* nothing was changed: the Python dumper takes this array */
    drop_error();
    if (locked) {
        PyObject *rr = PyObject_CallNoArgs(v.release);
        Py_XDECREF(rr);
        drop_error();
    }
    if (nbuf.obj) PyBuffer_Release(&nbuf);
    goto end;
fail: /* after the dump's bytes were taken from the budget: reported, no dump in the row */
    *done = -1;
end:
    if (nbuf.obj) PyBuffer_Release(&nbuf);
    dview_release(&v);
    Py_XDECREF(flat);
    Py_XDECREF(digest);
    Py_XDECREF(key);
    Py_XDECREF(name);
    Py_XDECREF(nb);
    Py_XDECREF(res);
    return out;
}

static PyObject *set_dumper(PyObject *self, PyObject *args) {
    /* set_dumper(dumper, submit, head[, tensor_mem[, tensor_memo]]) or set_dumper(None): see
     * dump_fast; tensor_mem: _dumpio's capsule _C_TENSOR_MEM (CPU tensors' memory:
     * tensor_dump_mem); tensor_memo: its _C_TENSOR_MEMO (one read per tensor and phase) */
    PyObject *d, *submit = Py_None, *head = Py_None, *tmem = Py_None, *tmemo = Py_None;
    if (!PyArg_ParseTuple(args, "O|OOOO", &d, &submit, &head, &tmem, &tmemo)) return NULL;
    tensor_mem_fn tf = NULL;
    tensor_memo_fn tm = NULL;
    if (tmem != Py_None) {
        tf = (tensor_mem_fn)PyCapsule_GetPointer(tmem, "pprobe._dumpio._C_TENSOR_MEM");
        if (!tf) return NULL;
    }
    if (tmemo != Py_None) {
        tm = (tensor_memo_fn)PyCapsule_GetPointer(tmemo, "pprobe._dumpio._C_TENSOR_MEMO");
        if (!tm) return NULL;
    }
    if (d != Py_None && (!PyCallable_Check(submit) || !PyCallable_Check(head))) {
        PyErr_SetString(PyExc_TypeError, "set_dumper(dumper, submit, head)");
        return NULL;
    }
#define INTERN(v, s) if (!v && !(v = PyUnicode_InternFromString(s))) return NULL
    INTERN(str_lock, "lock");
    INTERN(str_seen, "seen");
    INTERN(str_n, "_n");
    INTERN(str_reserve, "_reserve");
    INTERN(str_c_digest, "c_digest");
    INTERN(str_pack, "pack");
    INTERN(str_nbytes, "nbytes");
    INTERN(str_acquire, "acquire");
    INTERN(str_release, "release");
    INTERN(str_unsubmit, "unsubmit");
    INTERN(str_op_name, "name");
    INTERN(str_content_hash, "content_hash");
    INTERN(str_stop_note, "stop_note");
#undef INTERN
    if (!g_records_mod && !(g_records_mod = PyImport_ImportModule("pprobe.records"))) return NULL;
    static int atfork = 0;
    if (!atfork && pthread_atfork(NULL, NULL, dump_pid_child) == 0) atfork = 1;
    dview_release(&g_dv); /* the last dumper's fields */
    g_dv.view = 0;
    Py_XSETREF(g_dumper, d == Py_None ? NULL : Py_NewRef(d));
    Py_XSETREF(g_dump_submit, d == Py_None ? NULL : Py_NewRef(submit));
    Py_XSETREF(g_dump_head, d == Py_None ? NULL : Py_NewRef(head));
    if (g_tensor_memo) g_tensor_memo(0); /* (this thread's; others clear at their next arming) */
    g_tensor_mem = d == Py_None ? NULL : tf;
    g_tensor_memo = d == Py_None || !tf ? NULL : tm;
    Py_RETURN_NONE;
}

/* Dump mode, a torch tensor: the memoryview of a plain CPU tensor's C-ordered elements and
 * its .npy header (*header, a new reference), which are what torch_values.dumpable reads
 * (host_array) and Dumper._dump writes for it; NULL (no exception) where Python dumps it. */
static PyObject *tensor_dump_mem(PyObject *x, PyObject **header) {
    *header = NULL;
    if (!g_tensor_mem || !torch_plain || !describe_tensor_type(Py_TYPE(x))) return NULL;
    void *addr;
    Py_ssize_t nbytes, dims[64];
    int nd;
    PyObject *typestr;
    if (!g_tensor_mem(x, &addr, &nbytes, &nd, dims, &typestr) || nd > MAX_INLINE_DIMS)
        return NULL;
    Slot2 *s = map2_find(&g_tensor_heads, typestr, 0);
    if (!s) {
        PyObject *head = npy_head_text(typestr, 0);
        if (!head || !(s = map2_put(&g_tensor_heads, typestr, 0))) {
            Py_XDECREF(head);
            drop_error();
            return NULL;
        }
        Py_INCREF(typestr); /* a str of _dumpio's table: held with its head */
        s->a = (intptr_t)head;
    }
    PyObject *h = npy_header_dims((PyObject *)s->a, nd, dims);
    if (!h || h == Py_None) {
        Py_XDECREF(h);
        drop_error();
        return NULL;
    }
    PyObject *mv = PyMemoryView_FromMemory((char *)addr, nbytes, PyBUF_READ);
    if (!mv) {
        Py_DECREF(h);
        drop_error();
        return NULL;
    }
    *header = h;
    return mv;
}

/* A NumPy scalar of a builtin numeric type (np.float32(1), the result of np.mean): its
 * bytes (a memoryview of the scalar) and, in *header, the .npy header of a 0-d array of its
 * dtype, what recorder._dump_one's np.asarray(x) dumps; NULL (nothing raised) for anything
 * else. long double is left to Python: its padding bytes are not the value's. */
static PyObject *scalar_dump_mem(PyObject *x, PyObject **header) {
    *header = NULL;
    if (!np_generic || !PyObject_TypeCheck(x, np_generic)) return NULL;
    PyObject *descr = PyObject_GetAttrString(x, "dtype");
    PyObject *head = descr ? npy_head_of_descr(descr, 0) : NULL; /* borrowed */
    Py_XDECREF(descr); /* (a builtin descriptor: static, its head stays in g_npy_heads) */
    PyObject *mv = head && head != Py_None ? PyMemoryView_FromObject(x) : NULL;
    if (mv) {
        Py_buffer *v = PyMemoryView_GET_BUFFER(mv);
        const char *f = v->format ? v->format : "B";
        if (v->ndim != 0 || !f[0] || !strchr("?bBhHiIlLqQefdZ", f[0]) ||
            (f[0] == 'Z' && f[1] == 'g') ||
            !(*header = npy_header_dims(head, 0, NULL)) || *header == Py_None) {
            Py_XDECREF(*header);
            *header = NULL;
            Py_CLEAR(mv);
        }
    }
    drop_error();
    return mv;
}

/* The dumper's note while dumping has stopped for good (Dumper._n[DUMPER_VIEW] is
 * DUMPER_STOPPED: the budget used up with no ring of steps, or the disk full), a new
 * reference; else NULL (no error set). An array the core would dump then gets this note (the
 * one Dumper.dump gives), with no call into the dumper: a long run spends most of its steps
 * past its budget. Read only when the core did not take a dump, so dumping pays nothing. */
#define DUMPER_STOPPED (-1)
static PyObject *dumper_stop_note(void) {
    if (!g_dumper) return NULL;
    PyObject *n = PyObject_GetAttr(g_dumper, str_n), *note = NULL;
    Py_buffer b;
    int64_t view = 0;
    if (n && PyObject_GetBuffer(n, &b, PyBUF_FORMAT) == 0) {
        if (b.itemsize == 8 && b.len >= (DUMPER_VIEW + 1) * 8)
            view = ((int64_t *)b.buf)[DUMPER_VIEW];
        PyBuffer_Release(&b);
    }
    Py_XDECREF(n);
    if (view == DUMPER_STOPPED) note = PyObject_GetAttr(g_dumper, str_stop_note);
    if (note && !PyUnicode_CheckExact(note)) Py_CLEAR(note);
    drop_error();
    return note;
}

/* Dump the described arrays from desc `from` on (inputs before the call, outputs after it):
 * each record gets its dump's path and note (a note replaces the statistics' note, as in
 * recorder._describe). An out= input and uninitialised outputs are not dumped. A failure is
 * reported and leaves that record without a dump; -1 only for memory. */
static int dump_descs(Descs *ds, Py_ssize_t from, Py_ssize_t opi, int64_t seq, int output) {
    if (g_mode != 2 || !py_dump) {
        memo_arm(0);
        return 0;
    }
    PyObject *o_op = NULL, *o_seq = NULL, *stop = NULL;
    int many = output && ds->n - from > 1, rc = 0, stop_read = 0;
    for (Py_ssize_t i = from; i < ds->n; i++) {
        PyObject *x = ds->src[i].x;
        DescRec *r = &ds->d[i];
        if (!x || (r->role == s_input && r->idx == s_out_kw) || (output && g_cur_uninit))
            continue;
        int kind = output ? 1 + many : 0;
        Py_ssize_t idx = output ? ds->src[i].pos : r->idx;
        PyObject *o_head = npy_header_of(x);
        PyObject *res = NULL, *mem = NULL;
        int done = 0;
        if (o_head == Py_None && g_dumper) { /* a CPU tensor's memory, dumped as its array */
            PyObject *th;
            if ((mem = tensor_dump_mem(x, &th)) || (mem = scalar_dump_mem(x, &th)))
                Py_SETREF(o_head, th);
        }
        if (o_head) res = dump_fast(mem ? mem : x, x, o_head, opi, seq, kind, idx, &done);
        if (!done && !res && o_head && o_head != Py_None) {
            /* an array the core dumps but did not: has dumping stopped for good? Then
             * Dumper.dump's answer, made here (read once per call) */
            if (!stop_read) {
                stop_read = 1;
                stop = dumper_stop_note();
            }
            if (stop) {
                res = PyTuple_Pack(2, Py_None, stop); /* (NULL: reported below) */
                done = 1;
            }
        }
        if (mem) {
            Py_DECREF(mem);
            if (!done) Py_SETREF(o_head, Py_NewRef(Py_None)); /* Python reads the tensor */
        }
        if (o_head && !done) { /* the Python dumper: its arguments made only now */
            if (!o_op) {
                o_op = PyLong_FromSsize_t(opi);
                o_seq = o_op ? PyLong_FromLongLong(seq) : NULL;
            }
            PyObject *o_kind = o_seq ? PyLong_FromLong(kind) : NULL;
            PyObject *o_idx = o_kind ? PyLong_FromSsize_t(idx) : NULL;
            if (o_idx) {
                PyObject *argv[6] = {x, o_op, o_seq, o_kind, o_idx, o_head};
                res = PyObject_Vectorcall(py_dump, argv, 6, NULL);
            }
            Py_XDECREF(o_kind);
            Py_XDECREF(o_idx);
        }
        Py_XDECREF(o_head);
        if (!res) {
            report("writing dumps");
            continue;
        }
        if (PyTuple_CheckExact(res) && PyTuple_GET_SIZE(res) == 2) {
            PyObject *path = PyTuple_GET_ITEM(res, 0), *note = PyTuple_GET_ITEM(res, 1);
            if (path != Py_None) {
                int32_t k = descs_obj(ds, Py_NewRef(path));
                if (k < 0) rc = -1;
                else ds->d[i].path = k; /* ds->d may have moved: index, not r */
            }
            if (rc == 0 && note != Py_None) {
                int32_t k = descs_obj(ds, Py_NewRef(note));
                if (k < 0) rc = -1;
                else ds->d[i].note = k;
            }
        }
        Py_DECREF(res);
        if (rc < 0) break;
    }
    Py_XDECREF(o_op);
    Py_XDECREF(o_seq);
    Py_XDECREF(stop);
    memo_arm(0); /* the phase is dumped: its tensor reads are forgotten */
    return rc;
}

/* Statistics, dumps, a dtype filter, or an argument kind only Python knows: the Python
 * engine describes the call (recorder._begin / recorder._end) and the call itself is made
 * here, so no pprobe frame is between the program and the op (warnings, tracebacks). */
static PyObject *slow_call(Py_ssize_t opi, PyObject *op, PyObject *fn, vectorcallfunc orig,
                           PyObject *const *args, size_t nargsf, PyObject *kwnames, long depth,
                           int skip) {
    if (!op) op = PyList_GetItem(g_ops_list, opi);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *targs = NULL, *kw = NULL, *d = NULL, *st = NULL;
    if (!op) goto fail;
    targs = PyTuple_New(nargs - skip);
    if (!targs) goto fail;
    for (Py_ssize_t i = skip; i < nargs; i++) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(targs, i - skip, args[i]);
    }
    kw = PyDict_New();
    if (!kw) goto fail;
    if (kwnames) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
            if (PyDict_SetItem(kw, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) goto fail;
        }
    }
    d = PyLong_FromLong(depth);
    if (!d) goto fail;
    st = PyObject_CallFunctionObjArgs(py_begin, op, targs, kw, d, NULL);
    Py_CLEAR(targs);
    Py_CLEAR(kw);
    if (!st) goto fail;
    if (!PyTuple_Check(st)) {
        int hide = st == py_not_a_row;
        Py_DECREF(st);
        Py_DECREF(d);
        tl_depth = depth;
        return hide ? hidden_call(fn, orig, args, nargsf, kwnames)
                    : call_vc(fn, orig, args, nargsf, kwnames);
    }
    tl_depth = depth + 1;
    int64_t t0 = now_ns();
    PyObject *result = call_vc(fn, orig, args, nargsf, kwnames);
    int64_t t1 = now_ns();
    tl_depth = depth;
    PyObject *a = PyLong_FromLongLong(t0), *b = PyLong_FromLongLong(t1), *r;
    if (result) {
        r = a && b ? PyObject_CallFunctionObjArgs(py_end, op, st, a, b, result, Py_None, d, NULL)
                   : NULL;
        if (!r) report("recording outputs");
        else if (PyExceptionInstance_Check(r)) { /* PPROBE_ON_NAN=raise: the call raises it */
            Py_CLEAR(result);
            PyErr_SetObject((PyObject *)Py_TYPE(r), r);
        }
        Py_XDECREF(r);
    } else {
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        PyObject *name = et ? PyObject_GetAttr(et, str_name) : NULL;
        r = a && b && name ? PyObject_CallFunctionObjArgs(py_end, op, st, a, b, Py_None, name, d,
                                                          NULL)
                           : NULL;
        if (!r) report("recording outputs");
        Py_XDECREF(r);
        Py_XDECREF(name);
        PyErr_Restore(et, ev, etb);
    }
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_DECREF(st);
    Py_DECREF(d);
    tl_depth = depth;
    return result;
fail:
    report("recording inputs");
    Py_XDECREF(targs);
    Py_XDECREF(kw);
    Py_XDECREF(d);
    tl_depth = depth;
    return call_vc(fn, orig, args, nargsf, kwnames);
}

/* Record one call of op `opi` (a Python Op object `op` may be NULL: looked up by index).
 * fn/orig: what to call. `is_ufunc`: operators are recognised. */
static void row_where(int32_t *module, int32_t *phase);
static PyObject *frames_module(int *found, int *opt_inner);
static int g_mod_frames, g_mod_training;

/* Frames mode, before training started: a module call running on this thread starts it (the
 * hooks' pre-hook does so at the first module call), whether or not the api-level call that
 * asks is a row (frames_module calls recorder.training_started). */
static void training_check(void) {
    int found;
    PyObject *p = frames_module(&found, NULL);
    Py_XDECREF(p);
    drop_error();
}

static PyObject *record_call(Py_ssize_t opi, PyObject *op, PyObject *fn, vectorcallfunc orig,
                             PyObject *const *args, size_t nargsf, PyObject *kwnames,
                             int is_ufunc, int skip) {
    long depth = tl_depth;
    if ((depth && (depth >= INTERNAL || !g_nested)) || !g_active)
        return call_vc(fn, orig, args, nargsf, kwnames);
    OpInfo *oi = op_info(opi);
    if (!oi) return call_vc(fn, orig, args, nargsf, kwnames);
    if (!oi->selected) return hidden_call(fn, orig, args, nargsf, kwnames);
    if (oi->sampled) {
        int64_t n = oi->calls++;
        if ((oi->first && n >= oi->first) || n % oi->every)
            return hidden_call(fn, orig, args, nargsf, kwnames);
    }
    tl_depth = INTERNAL;
    int opclass = K_CALL;
    int site = caller_site(depth || !oi->framework ? -1 : oi->framework + 2, &opclass);
    if (site == -3) {
        report("finding the caller");
        tl_depth = depth;
        return call_vc(fn, orig, args, nargsf, kwnames);
    }
    if (site == NOT_A_ROW) {
        tl_depth = depth;
        return hidden_call(fn, orig, args, nargsf, kwnames);
    }
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (is_ufunc && opclass != K_CALL) {
        Py_ssize_t o = operator_op(opclass, fn, args, nargs);
        if (o >= 0) {
            opi = o;
            op = NULL;
            if (opclass == K_INPLACE && nargs > 2) nargs = 2; /* ufunc(a, b, a): a += b */
        }
    }
    if (g_slow) {
        /* statistics, dumps or a dtype filter: the Python engine records the call */
        tl_depth = depth;
        return slow_call(opi, op, fn, orig, args, nargsf, kwnames, depth, skip);
    }
    int64_t seq = -1; /* drawn once the call is known to be recorded here */
    Descs ds;
    descs_init(&ds);
    int unknown = 0;
    memo_arm(1); /* dump mode: the inputs' statistics keep their tensor reads for the dumps */
    for (Py_ssize_t i = skip; i < nargs && !unknown; i++) {
        PyObject *idx_obj = i - skip < 64 ? PyTuple_GET_ITEM(py_idx_strs, i - skip) : NULL;
        if (!idx_obj) {
            unknown = 1;
            break;
        }
        int r = describe_arg(&ds, args[i], idx_obj, idx_sid(i - skip), seq);
        if (r < 0) goto fail;
        if (r == 0) unknown = 1;
    }
    if (kwnames && !unknown) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < nk && !unknown; i++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, i);
            int32_t ks = sid_of(name);
            if (ks < 0 && PyErr_Occurred()) goto fail;
            int r = describe_arg(&ds, args[nargs + i], name, ks, seq);
            if (r < 0) goto fail;
            if (r == 0) unknown = 1;
        }
    }
    if (unknown) {
        /* an argument kind only the Python path knows: it records the call (with a seq of
         * its own; this one is left unused) */
        descs_free(&ds);
        tl_depth = depth;
        return slow_call(opi, op, fn, orig, args, nargsf, kwnames, depth, skip);
    }
    seq = g_seq++;
    for (Py_ssize_t i = 0; i < ds.n; i++) ds.d[i].seq = seq;
    /* dump mode: the inputs' values at call time */
    if (dump_descs(&ds, 0, opi, seq, 0) < 0) goto fail;
    Py_ssize_t n_inputs = ds.n;
    if (!tl_thread) {
        /* the thread's serial, its name noted now: idents are reused by the OS */
        PyObject *r = PyObject_CallNoArgs(py_note_thread);
        if (r) tl_thread = PyLong_AsLongLong(r);
        if (!r || tl_thread == -1) {
            drop_error();
            tl_thread = 0;
        }
        Py_XDECREF(r);
    }
    int64_t parent = -1;
    if (g_parents) {
        parent = tl_parent;
        tl_parent = seq;
    }
    tl_depth = depth + 1;
    int64_t t0 = now_ns();
    PyObject *result = call_vc(fn, orig, args, nargsf, kwnames);
    int64_t t1 = now_ns();
    if (g_parents) tl_parent = parent;
    if (result == Py_NotImplemented) {
        tl_depth = depth;
        descs_free(&ds);
        return result;
    }
    tl_depth = INTERNAL;
    OpRec rec;
    rec.seq = seq;
    rec.t0 = t0;
    rec.t1 = t1;
    rec.thread = tl_thread;
    rec.step = g_step;
    rec.parent = parent;
    rec.op = (int32_t)opi;
    rec.site = site;
    rec.depth = (int32_t)depth;
    row_where(&rec.module, &rec.phase);
    rec.args = -1;
    PyObject *exc_t = NULL, *exc_v = NULL, *exc_tb = NULL;
    if (result == NULL) {
        PyErr_Fetch(&exc_t, &exc_v, &exc_tb);
        PyObject *name = exc_t ? PyObject_GetAttr(exc_t, str_name) : NULL;
        rec.status = name ? sid_of(name) : -1;
        Py_XDECREF(name);
        if (PyErr_Occurred()) drop_error();
    } else {
        rec.status = s_ok;
        /* outputs */
        if (stats_on()) g_cur_uninit = op_uninit(opi);
        memo_arm(1); /* as for the inputs */
        int r = describe_np(&ds, result, s_output, s_idx0, seq);
        if (r < 0) goto fail_after;
        int python_outputs = 0;
        if (r == 0 && (PyTuple_CheckExact(result) || PyList_CheckExact(result))) {
            Py_ssize_t n = PySequence_Fast_GET_SIZE(result), n0 = ds.n;
            PyObject **items = PySequence_Fast_ITEMS(result);
            for (Py_ssize_t j = 0; j < n && j < 1024; j++) {
                int re = describe_np(&ds, items[j], s_output, idx_sid(j), seq);
                if (re < 0) goto fail_after;
                if (re == 1) ds.src[ds.n - 1].pos = j;
                if (re == 0 && np_ndarray && PyObject_TypeCheck(items[j], np_ndarray)) {
                    ds.n = n0; /* an array the core does not describe (deep): Python does */
                    python_outputs = 1;
                    break;
                }
            }
        }
        if (python_outputs ||
            (r == 0 && !PyTuple_CheckExact(result) && !PyList_CheckExact(result) &&
             result != Py_None && !PyFloat_CheckExact(result) && !PyLong_CheckExact(result) &&
             !PyBool_Check(result) && !PyUnicode_CheckExact(result))) {
            /* another kind of result: the Python side describes it */
            PyObject *sq = PyLong_FromLongLong(seq);
            PyObject *oix = stats_on() ? PyLong_FromSsize_t(opi) : NULL; /* statistics too */
            PyObject *o = sq ? PyObject_CallFunctionObjArgs(py_outputs, sq, result, oix, NULL)
                             : NULL;
            Py_XDECREF(oix);
            Py_XDECREF(sq);
            if (!o) goto fail_after;
            /* (desc records bytes, objects tuple) */
            PyObject *b = PyTuple_GetItem(o, 0);
            PyObject *objs = PyTuple_GetItem(o, 1);
            if (!b || !objs || !PyBytes_Check(b) || !PyTuple_Check(objs)) {
                Py_DECREF(o);
                PyErr_SetString(PyExc_TypeError, "bad outputs");
                goto fail_after;
            }
            Py_ssize_t k = PyBytes_GET_SIZE(b) / sizeof(DescRec);
            int32_t base = (int32_t)ds.nobj;
            for (Py_ssize_t j = 0; j < k; j++) {
                DescRec *dr = descs_add(&ds);
                if (!dr) {
                    Py_DECREF(o);
                    goto fail_after;
                }
                memcpy(dr, PyBytes_AS_STRING(b) + j * sizeof(DescRec), sizeof(DescRec));
                if (dr->stats >= 0) dr->stats += base;
                if (dr->path >= 0) dr->path += base;
                if (dr->note >= 0) dr->note += base;
                if (dr->shape_ref >= 0) dr->shape_ref += base;
            }
            for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(objs); j++) {
                if (descs_obj(&ds, Py_NewRef(PyTuple_GET_ITEM(objs, j))) < 0) {
                    Py_DECREF(o);
                    goto fail_after;
                }
            }
            Py_DECREF(o);
        } else if (dump_descs(&ds, n_inputs, opi, seq, 1) < 0) {
            goto fail_after;
        }
    }
    if (ds.pairs) {
        PyObject *t = PyList_AsTuple(ds.pairs);
        if (!t) goto fail_after;
        untrack_leaf_tuple(t);
        t = args_interned(t);
        int32_t k = descs_obj(&ds, t);
        if (k < 0) goto fail_after;
        rec.args = k;
    }
    rec.n_descs = (int32_t)ds.n;
    if (buffer_append(g_buffer, &rec, ds.d, ds.n, ds.objs, ds.nobj) < 0) goto fail_after;
    descs_free(&ds);
    if (!(seq & 1023) && (Py_ssize_t)g_buffer->n_ops >= g_flush_rows) wake_writer(g_buffer);
    tl_depth = depth;
    if (exc_t) PyErr_Restore(exc_t, exc_v, exc_tb);
    return result;

fail_after:
    /* pprobe's failure after the user's call: report it, give the call's outcome back */
    report("recording outputs");
    descs_free(&ds);
    tl_depth = depth;
    if (exc_t) PyErr_Restore(exc_t, exc_v, exc_tb);
    return result;

fail:
    report("recording inputs");
    descs_free(&ds);
    tl_depth = depth;
    return call_vc(fn, orig, args, nargsf, kwnames);
}

/* ------------------------------------------------------------------ interception */
/* An instance's vectorcall slot */
static inline vectorcallfunc *vc_slot(PyObject *obj) {
    return (vectorcallfunc *)((char *)obj + Py_TYPE(obj)->tp_vectorcall_offset);
}

static PyObject *g_ufunc_type = NULL;

static PyObject *probe_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames) {
    Slot2 *s = map2_find(&g_hooked, callable, 0);
    if (!s) {
        PyErr_SetString(PyExc_SystemError, "pprobe: a probed callable lost its entry");
        return NULL;
    }
    vectorcallfunc orig = (vectorcallfunc)s->b;
    return record_call((Py_ssize_t)s->a, NULL, callable, orig, args, nargsf, kwnames,
                       (PyObject *)Py_TYPE(callable) == g_ufunc_type, 0);
}

static PyObject *hook(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t opi;
    if (!PyArg_ParseTuple(args, "On", &obj, &opi)) return NULL;
    PyTypeObject *tp = Py_TYPE(obj);
    if (!(tp->tp_flags & Py_TPFLAGS_HAVE_VECTORCALL) || tp->tp_vectorcall_offset <= 0) {
        PyErr_Format(PyExc_TypeError, "%s instances have no vectorcall slot", tp->tp_name);
        return NULL;
    }
    vectorcallfunc *slot = vc_slot(obj);
    Slot2 *s = map2_find(&g_hooked, obj, 0);
    if (s) {
        s->a = opi;
        Py_RETURN_FALSE;
    }
    if (*slot == NULL) {
        PyErr_Format(PyExc_TypeError, "this %s has no vectorcall function", tp->tp_name);
        return NULL;
    }
    s = map2_put(&g_hooked, obj, 0);
    if (!s) return PyErr_NoMemory();
    Py_INCREF(obj);
    s->a = opi;
    s->b = (intptr_t)*slot;
    *slot = probe_vectorcall;
    Py_RETURN_TRUE;
}

static PyObject *unhook_all(PyObject *self, PyObject *unused) {
    Py_ssize_t n = 0;
    for (size_t j = 0; j < g_hooked.cap; j++) {
        Slot2 *s = &g_hooked.slots[j];
        if (!s->key) continue;
        PyObject *obj = (PyObject *)s->key;
        vectorcallfunc *slot = vc_slot(obj);
        if (*slot == probe_vectorcall) *slot = (vectorcallfunc)s->b;
        n++;
    }
    map2_clear(&g_hooked, 1);
    return PyLong_FromSsize_t(n);
}

static PyObject *is_hooked(PyObject *self, PyObject *obj) {
    return PyBool_FromLong(map2_find(&g_hooked, obj, 0) != NULL &&
                           PyType_HasFeature(Py_TYPE(obj), Py_TPFLAGS_HAVE_VECTORCALL) &&
                           *vc_slot(obj) == probe_vectorcall);
}

/* ------------------------------------------------------------------ MethodProbe
 * Replaces a method descriptor in a type's dict (ndarray.sum, ufunc.reduce). A method
 * descriptor itself (Py_TPFLAGS_METHOD_DESCRIPTOR): `a.sum()` calls it with the instance
 * first and no bound method is made. `op` is an op index, or with `by_self` a dict
 * {instance: op index} (ufunc methods: the op depends on the ufunc). */
typedef struct {
    PyObject_HEAD
    PyObject *orig;
    PyObject *by_self; /* dict or NULL */
    Py_ssize_t op;
    vectorcallfunc vectorcall;
} ProbeObject;

static PyObject *Probe_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames) {
    ProbeObject *p = (ProbeObject *)self;
    Py_ssize_t opi = p->op;
    if (p->by_self) {
        if (PyVectorcall_NARGS(nargsf) < 1) return PyObject_Vectorcall(p->orig, args, nargsf, kwnames);
        PyObject *v = PyDict_GetItemWithError(p->by_self, args[0]);
        if (!v) {
            if (PyErr_Occurred()) drop_error();
            return PyObject_Vectorcall(p->orig, args, nargsf, kwnames);
        }
        opi = PyLong_AsSsize_t(v);
    }
    /* ufunc methods (by_self): the ufunc is the op, not an argument of the row */
    return record_call(opi, NULL, p->orig, NULL, args, nargsf, kwnames, 0, p->by_self != NULL);
}

static PyObject *Probe_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    PyObject *orig, *by_self = Py_None;
    Py_ssize_t op = -1;
    if (!PyArg_ParseTuple(args, "On|O", &orig, &op, &by_self)) return NULL;
    ProbeObject *p = (ProbeObject *)tp->tp_alloc(tp, 0);
    if (!p) return NULL;
    p->orig = Py_NewRef(orig);
    p->by_self = by_self == Py_None ? NULL : Py_NewRef(by_self);
    p->op = op;
    p->vectorcall = Probe_vectorcall;
    return (PyObject *)p;
}

static void Probe_dealloc(ProbeObject *p) {
    Py_XDECREF(p->orig);
    Py_XDECREF(p->by_self);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyObject *Probe_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyObject *Probe_getattro(PyObject *self, PyObject *name) {
    /* introspection as the original's: __name__, __qualname__, __doc__, __objclass__,
     * __text_signature__, __reduce_ex__ ... */
    ProbeObject *p = (ProbeObject *)self;
    if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "__wrapped__") == 0)
        return Py_NewRef(p->orig);
    if (PyUnicode_Check(name) &&
        PyUnicode_CompareWithASCIIString(name, "__pprobe_original__") == 0)
        return Py_NewRef(p->orig);
    return PyObject_GetAttr(p->orig, name);
}

static PyObject *Probe_repr(ProbeObject *p) { return PyObject_Repr(p->orig); }

static PyTypeObject ProbeType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pprobe._native.MethodProbe",
    .tp_basicsize = sizeof(ProbeObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(ProbeObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = Probe_new,
    .tp_dealloc = (destructor)Probe_dealloc,
    .tp_descr_get = Probe_get,
    .tp_getattro = Probe_getattro,
    .tp_repr = (reprfunc)Probe_repr,
    .tp_doc = "A recorded method: MethodProbe(original, op index[, {instance: op index}])",
};

/* Put `value` in an (immutable) type's own dict, or remove `name` when value is NULL. */
static PyObject *set_type_attr(PyObject *self, PyObject *args) {
    PyTypeObject *tp;
    PyObject *name, *value = NULL;
    if (!PyArg_ParseTuple(args, "O!U|O", &PyType_Type, &tp, &name, &value)) return NULL;
    PyObject *dict = tp->tp_dict;
    if (!dict) {
        PyErr_SetString(PyExc_TypeError, "type has no dict");
        return NULL;
    }
    int r = value && value != Py_None ? PyDict_SetItem(dict, name, value) : PyDict_DelItem(dict, name);
    if (r < 0) return NULL;
    PyType_Modified(tp);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ Python's call() */
/* record_call for a call given as (args tuple, kwargs dict or NULL) */
static PyObject *record_tuple_call(Py_ssize_t opi, PyObject *op, PyObject *fn, PyObject *targs,
                                   PyObject *kw) {
    Py_ssize_t n = PyTuple_GET_SIZE(targs), nk = kw ? PyDict_GET_SIZE(kw) : 0;
    PyObject *stack_[16];
    PyObject **stack = n + nk <= 16 ? stack_ : PyMem_Malloc((n + nk) * sizeof(PyObject *));
    if (!stack) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) stack[i] = PyTuple_GET_ITEM(targs, i);
    PyObject *kwnames = NULL;
    if (nk) {
        kwnames = PyTuple_New(nk);
        if (!kwnames) {
            if (stack != stack_) PyMem_Free(stack);
            return NULL;
        }
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *v;
        while (PyDict_Next(kw, &pos, &k, &v)) {
            Py_INCREF(k);
            PyTuple_SET_ITEM(kwnames, i, k);
            stack[n + i] = v;
            i++;
        }
    }
    PyObject *r = record_call(opi, op, fn, NULL, stack, (size_t)n, kwnames, 0, 0);
    Py_XDECREF(kwnames);
    if (stack != stack_) PyMem_Free(stack);
    return r;
}

static PyObject *py_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* call(op, fn, args, kwargs): recorder.call for the trampolines and proxies */
    if (nargs != 4 || !PyTuple_Check(args[2]) || !PyDict_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "call(op, fn, args: tuple, kwargs: dict)");
        return NULL;
    }
    PyObject *op = args[0], *fn = args[1], *targs = args[2], *kw = args[3];
    long depth = tl_depth;
    if ((depth && (depth >= INTERNAL || !g_nested)) || !g_active)
        return PyObject_Call(fn, targs, kw);
    PyObject *io = PyObject_GetAttr(op, str_index);
    if (!io) return NULL;
    Py_ssize_t opi = PyLong_AsSsize_t(io);
    Py_DECREF(io);
    return record_tuple_call(opi, op, fn, targs, kw);
}

/* FunctionProxy's calls (pprobe.interceptors.numpy_namespace): the proxies of NumPy's
 * builtins and Python-level functions (np.array, np.asarray, np.broadcast_to...), which CPython
 * calls through their type's tp_call. set_proxy_call() points the proxy classes' tp_call here:
 * the call goes to the core as call(op, fn, args, kwargs) would, with no Python frame of the
 * proxy's own __call__ (which stays in the class, with the same meaning, for the Python engine
 * and for anything that calls it by name). op and fn are the proxy's _self_op and _self_orig
 * slots, read at their member offsets. */
static Py_ssize_t g_proxy_off_op = -1, g_proxy_off_fn = -1;

static PyObject *proxy_tp_call(PyObject *self, PyObject *targs, PyObject *kw) {
    PyObject *op = *(PyObject **)((char *)self + g_proxy_off_op);
    PyObject *fn = *(PyObject **)((char *)self + g_proxy_off_fn);
    if (!op || !fn) {
        PyErr_SetString(PyExc_TypeError, "pprobe: a NumPy function proxy without its function");
        return NULL;
    }
    long depth = tl_depth;
    if ((depth && (depth >= INTERNAL || !g_nested)) || !g_active)
        return PyObject_Call(fn, targs, kw);
    PyObject *io = PyObject_GetAttr(op, str_index);
    Py_ssize_t opi = io ? PyLong_AsSsize_t(io) : -1;
    Py_XDECREF(io);
    if (opi < 0) { /* pprobe's failure: reported once, the call runs as it would unprobed */
        report("a NumPy function proxy");
        return PyObject_Call(fn, targs, kw);
    }
    return record_tuple_call(opi, op, fn, targs, kw);
}

static Py_ssize_t member_offset(PyObject *tp, const char *name) {
    PyObject *d = PyObject_GetAttrString(tp, name);
    if (!d) return -1;
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX || m->type == T_OBJECT) off = m->offset;
    }
    Py_DECREF(d);
    if (off < 0) PyErr_Format(PyExc_TypeError, "%s is not an object slot", name);
    return off;
}

static PyObject *set_proxy_call(PyObject *self, PyObject *args) {
    /* set_proxy_call(base, classes): base FunctionProxy (its _self_op and _self_orig slots);
     * classes: base and its subclasses whose calls are the base's */
    PyObject *base, *classes;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &base, &PyTuple_Type, &classes)) return NULL;
    Py_ssize_t off_op = member_offset(base, "_self_op");
    if (off_op < 0) return NULL;
    Py_ssize_t off_fn = member_offset(base, "_self_orig");
    if (off_fn < 0) return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(classes); i++) {
        PyObject *c = PyTuple_GET_ITEM(classes, i);
        if (!PyType_Check(c) || !PyType_IsSubtype((PyTypeObject *)c, (PyTypeObject *)base) ||
            !(((PyTypeObject *)c)->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
            PyErr_SetString(PyExc_TypeError, "set_proxy_call: heap subclasses of base only");
            return NULL;
        }
    }
    g_proxy_off_op = off_op;
    g_proxy_off_fn = off_fn;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(classes); i++) {
        PyTypeObject *c = (PyTypeObject *)PyTuple_GET_ITEM(classes, i);
        c->tp_call = proxy_tp_call;
        PyType_Modified(c);
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ torch's api level */
static PyObject *g_torch_ops = NULL;     /* dict: torch function -> op index, -1: not a row */
static PyObject *py_torch_op = NULL;     /* torch_api._api_op_index(func) -> int */
static PyObject *py_task_id = NULL;      /* torch._C._current_graph_task_id */
static PyObject *s_forward = NULL, *s_backward = NULL;

/* The op index of a torch function (-1: not a row), from g_torch_ops or, the first time, from
 * torch_api._api_op_index (run as pprobe's own code, cached unless the function is
 * unhashable). -2 when naming it failed (reported once). */
static Py_ssize_t torch_op_index(PyObject *func) {
    PyObject *v = PyDict_GetItemWithError(g_torch_ops, func);
    if (v) return PyLong_AsSsize_t(v);
    int unhashable = PyErr_Occurred() != NULL;
    drop_error();
    long depth = tl_depth;
    tl_depth = INTERNAL;
    PyObject *r = PyObject_CallOneArg(py_torch_op, func);
    tl_depth = depth;
    if (!r) {
        report("naming a torch function");
        return -2;
    }
    Py_ssize_t opi = PyLong_AsSsize_t(r);
    if (!unhashable && PyDict_SetItem(g_torch_ops, func, r) < 0) drop_error();
    Py_DECREF(r);
    return opi;
}

/* Record a torch call: phase backward inside autograd's engine (a graph task is running),
 * else the phase the hooks set (forward, optimizer) or the default. */
static PyObject *record_torch(Py_ssize_t opi, PyObject *func, PyObject *targs, PyObject *kw) {
    PyObject *tid = PyObject_CallNoArgs(py_task_id);
    int backward = 0;
    if (tid) {
        backward = PyLong_AsLong(tid) != -1;
        Py_DECREF(tid);
    } else {
        drop_error();
    }
    if (!backward) return record_tuple_call(opi, NULL, func, targs, kw);
    PyObject *saved = tl_phase; /* the reference moves to `saved` */
    tl_phase = Py_NewRef(s_backward);
    PyObject *r = record_tuple_call(opi, NULL, func, targs, kw);
    Py_DECREF(tl_phase);
    tl_phase = saved;
    return r;
}

/* torch_call(func, args, kwargs): the body of the api level's __torch_function__ */
static PyObject *torch_call(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    if (n != 3 || !PyTuple_Check(a[1]) || !(a[2] == Py_None || PyDict_Check(a[2]))) {
        PyErr_SetString(PyExc_TypeError, "torch_call(func, args: tuple, kwargs: dict|None)");
        return NULL;
    }
    PyObject *func = a[0], *targs = a[1], *kw = a[2] == Py_None ? NULL : a[2];
    if (!g_active || !g_torch_ops) return PyObject_Call(func, targs, kw);
    if (g_mod_frames && !g_mod_training && tl_depth < INTERNAL) training_check();
    Py_ssize_t opi = torch_op_index(func);
    if (opi < 0) return PyObject_Call(func, targs, kw);
    return record_torch(opi, func, targs, kw);
}

static PyObject *torch_init(PyObject *self, PyObject *args) {
    /* (Tensor types described natively, {torch dtype: string id}, device_name function,
     *  op-index function, task-id function) */
    PyObject *plain, *dtypes, *devname, *opf, *task;
    if (!PyArg_ParseTuple(args, "O!O!OOO", &PyTuple_Type, &plain, &PyDict_Type, &dtypes,
                          &devname, &opf, &task))
        return NULL;
    Py_XSETREF(torch_plain, Py_NewRef(plain));
    Py_XSETREF(torch_dtype_sids, Py_NewRef(dtypes));
    Py_XSETREF(py_device_name, Py_NewRef(devname));
    Py_XSETREF(py_torch_op, Py_NewRef(opf));
    Py_XSETREF(py_task_id, Py_NewRef(task));
    if (!g_torch_ops) {
        g_torch_ops = PyDict_New();
        if (!g_torch_ops) return NULL;
    }
    PyDict_Clear(g_torch_ops);
    take_tensor_getters();
    if (!s_forward) s_forward = PyUnicode_InternFromString("forward");
    if (!s_backward) s_backward = PyUnicode_InternFromString("backward");
    if (!s_forward || !s_backward) return NULL;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ the api mode's handler
 * ApiMode.__torch_function__ itself with the native engine (torch_mode() turns it on): torch
 * calls it as mode.__torch_function__(func, types, args, kwargs), with the mode taken off its
 * stack for the duration (the call of func inside runs unprobed at this level). No Python
 * frame of pprobe's is between the program's call and func: where the innermost Python frame
 * is the program's own, func is called from here and a warning names the program's line, as
 * unprobed. Where it is not (a Python-level torch function dispatched through
 * torch/overrides.py), the call goes through recorder.as_caller's trampoline as before. */
static int g_torch_on = 0;
static PyObject *torch_compiler_dict = NULL; /* torch.compiler.__dict__ */
static PyObject *str_compiling_flag = NULL;  /* "_is_compiling_flag" */
static PyObject *py_torch_call_fn = NULL;    /* this module's torch_call */
static PyObject *empty_tuple = NULL;

/* func(*args, **kwargs) as the program's call would make it (recorder.as_caller) */
static PyObject *tf_plain(PyObject *func, PyObject *targs, PyObject *kw, PyObject *via) {
    PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
    int m = 0;
    if (f && py_classify) {
        PyCodeObject *code = PyFrame_GetCode(f);
        m = mine_class(code);
        Py_DECREF(code);
        if (m < 0) {
            report("finding the caller");
            m = 0;
        }
    }
    if (!m) {
        if (!via) return PyObject_Call(func, targs, kw);
        PyObject *a[3] = {func, targs, kw ? kw : Py_None};
        return PyObject_Vectorcall(via, a, 3, NULL);
    }
    PyObject *t = as_caller(NULL, &func, 1);
    if (!t) {
        report("finding the caller");
        return via ? PyObject_CallFunctionObjArgs(via, func, targs, kw ? kw : Py_None, NULL)
                   : PyObject_Call(func, targs, kw);
    }
    PyObject *kwd = kw ? Py_NewRef(kw) : PyDict_New();
    PyObject *r = NULL;
    if (kwd) {
        if (via) {
            PyObject *inner = PyTuple_Pack(3, func, targs, kwd);
            PyObject *empty = inner ? PyDict_New() : NULL;
            r = empty ? PyObject_CallFunctionObjArgs(t, via, inner, empty, NULL) : NULL;
            Py_XDECREF(inner);
            Py_XDECREF(empty);
        } else {
            r = PyObject_CallFunctionObjArgs(t, func, targs, kwd, NULL);
        }
        Py_DECREF(kwd);
    }
    Py_DECREF(t);
    return r;
}

static PyObject *torch_function(PyObject *self, PyObject *const *a, size_t nargsf,
                                PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    PyObject *func = n > 0 ? a[0] : NULL, *targs = n > 2 ? a[2] : empty_tuple;
    PyObject *kw = n > 3 ? a[3] : NULL;
    if (kwnames) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
            PyObject *k = PyTuple_GET_ITEM(kwnames, i);
            if (PyUnicode_Check(k) && PyUnicode_CompareWithASCIIString(k, "args") == 0)
                targs = a[n + i];
            else if (PyUnicode_Check(k) && PyUnicode_CompareWithASCIIString(k, "kwargs") == 0)
                kw = a[n + i];
            else if (PyUnicode_Check(k) && PyUnicode_CompareWithASCIIString(k, "func") == 0)
                func = a[n + i];
        }
    }
    if (kw == Py_None) kw = NULL;
    if (!func || !targs || !PyTuple_Check(targs) || (kw && !PyDict_Check(kw))) {
        PyErr_SetString(PyExc_TypeError,
                        "__torch_function__(func, types, args: tuple = (), kwargs: dict = None)");
        return NULL;
    }
    if (torch_compiler_dict) {
        /* torch.compiler.is_compiling(): dynamo or export traces; nothing is recorded */
        PyObject *c = PyDict_GetItemWithError(torch_compiler_dict, str_compiling_flag);
        if (c == Py_True) return PyObject_Call(func, targs, kw);
        if (!c) drop_error();
    }
    if (!g_torch_on || !g_active || !g_torch_ops) return tf_plain(func, targs, kw, NULL);
    long depth = tl_depth;
    if (depth && (depth >= INTERNAL || !g_nested)) return tf_plain(func, targs, kw, NULL);
    if (g_mod_frames && !g_mod_training) training_check();
    Py_ssize_t opi = torch_op_index(func);
    if (opi < 0) return tf_plain(func, targs, kw, NULL);
    PyFrameObject *f = PyEval_GetFrame();
    if (f) {
        PyCodeObject *code = PyFrame_GetCode(f);
        int m = mine_class(code);
        Py_DECREF(code);
        if (m != 0) { /* a dispatching frame on top (or an error): the trampoline's way */
            if (m < 0) drop_error();
            return tf_plain(func, targs, kw, py_torch_call_fn);
        }
    }
    return record_torch(opi, func, targs, kw);
}

/* The handler is a Python function on the mode's class (torch wants a method whose __self__
 * is the mode; dynamo inlines its Python twin's bytecode while it traces), whose own
 * vectorcall pointer is pointed here: calls of it from C (torch's C++ dispatch of every C
 * function, method and property) run torch_function with no frame, and so do calls from
 * Python bytecode on 3.10, 3.12 and 3.13 (its function version is cleared, so 3.12+ never
 * specialize such a call into a frame push). CPython 3.11 is the exception: its CALL pushes
 * the frame of any Python function itself, whatever the vectorcall pointer says, so there a
 * call from Python bytecode (torch.overrides.handle_torch_function: Python-level torch
 * functions such as F.relu, F.cross_entropy or Tensor.backward) runs the twin's bytecode,
 * which hands the call to torch_call through recorder.as_caller's trampoline. Measured on
 * F.relu (10 elements, 3.11): a builtin handler with no frame instead gave the same time
 * (5.93 against 5.95 us a call: the trampoline, needed for warnings, costs the same either
 * way), and dynamo no longer traced the mode's calls inside compiled code, so the Python
 * function stays. */
static PyObject *tf_vectorcall(PyObject *fn, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n < 1) {
        PyErr_SetString(PyExc_TypeError, "__torch_function__(self, func, types, args, kwargs)");
        return NULL;
    }
    return torch_function(fn, args + 1, (size_t)(n - 1), kwnames); /* args[0]: the mode */
}

static PyObject *torch_handler(PyObject *self, PyObject *fn) {
    /* torch_handler(fn): fn's calls run the native api-level handler from now on */
    if (!PyFunction_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "torch_handler(fn): a Python function");
        return NULL;
    }
#if PY_VERSION_HEX >= 0x030C0000
    PyFunction_SetVectorcall((PyFunctionObject *)fn, tf_vectorcall);
#else
    ((PyFunctionObject *)fn)->vectorcall = tf_vectorcall;
#if PY_VERSION_HEX >= 0x030B0000
    ((PyFunctionObject *)fn)->func_version = 0;
#endif
#endif
    Py_RETURN_NONE;
}

static PyObject *torch_mode(PyObject *self, PyObject *args) {
    /* torch_mode(on, torch.compiler.__dict__ or None, torch_call): the api-level handler's
     * switch and helpers */
    int on;
    PyObject *cd, *tc;
    if (!PyArg_ParseTuple(args, "pOO", &on, &cd, &tc)) return NULL;
    if (!empty_tuple && !(empty_tuple = PyTuple_New(0))) return NULL;
    if (!str_compiling_flag &&
        !(str_compiling_flag = PyUnicode_InternFromString("_is_compiling_flag")))
        return NULL;
    Py_XSETREF(torch_compiler_dict, cd == Py_None ? NULL : Py_NewRef(cd));
    Py_XSETREF(py_torch_call_fn, Py_NewRef(tc));
    g_torch_on = on;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ thread state fields */
typedef struct {
    PyObject_HEAD
    int which; /* 0 depth, 1 parent, 2 module, 3 phase */
} FieldObject;

static PyObject *Field_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL) return Py_NewRef(self);
    switch (((FieldObject *)self)->which) {
        case 0: return PyLong_FromLong(tl_depth);
        case 1: return PyLong_FromLongLong(tl_parent);
        case 2: {
            /* in frames mode the module a row recorded here now would name */
            if (!g_mod_frames) return Py_NewRef(tl_module ? tl_module : Py_None);
            int found;
            PyObject *path = frames_module(&found, NULL);
            if (PyErr_Occurred()) {
                Py_XDECREF(path);
                return NULL;
            }
            return path ? path : Py_NewRef(Py_None);
        }
        default: return Py_NewRef(tl_phase ? tl_phase : Py_None);
    }
}

static int Field_set(PyObject *self, PyObject *obj, PyObject *value) {
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete a pprobe thread field");
        return -1;
    }
    switch (((FieldObject *)self)->which) {
        case 0: {
            long v = PyLong_AsLong(value);
            if (v == -1 && PyErr_Occurred()) return -1;
            tl_depth = v;
            return 0;
        }
        case 1: {
            long long v = PyLong_AsLongLong(value);
            if (v == -1 && PyErr_Occurred()) return -1;
            tl_parent = v;
            return 0;
        }
        case 2: {
            PyObject *old = tl_module;
            tl_module = value == Py_None ? NULL : Py_NewRef(value);
            Py_XDECREF(old);
            return 0;
        }
        default: {
            PyObject *old = tl_phase;
            tl_phase = value == Py_None ? NULL : Py_NewRef(value);
            Py_XDECREF(old);
            return 0;
        }
    }
}

static PyObject *Field_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    int which;
    if (!PyArg_ParseTuple(args, "i", &which)) return NULL;
    FieldObject *f = (FieldObject *)tp->tp_alloc(tp, 0);
    if (f) f->which = which;
    return (PyObject *)f;
}

static PyTypeObject FieldType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pprobe._native.ThreadField",
    .tp_basicsize = sizeof(FieldObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Field_new,
    .tp_descr_get = Field_get,
    .tp_descr_set = Field_set,
    .tp_doc = "A per-thread field shared with the native core (0 depth, 1 parent, 2 module, 3 phase)",
};

/* ------------------------------------------------------------------ the seq counter */
typedef struct {
    PyObject_HEAD
} CounterObject;

static PyObject *Counter_next(PyObject *self) { return PyLong_FromLongLong(g_seq++); }

static PyTypeObject CounterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pprobe._native.Counter",
    .tp_basicsize = sizeof(CounterObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = Counter_next,
    .tp_doc = "The process's call sequence numbers (shared by both engines' code paths).",
};

/* ------------------------------------------------------------------ module functions */
static PyObject *configure(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"active", "nested", "parents", "mode", "slow", "flush_rows", "wake",
                            NULL};
    PyObject *wake = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "pppip|nO", names, &g_active, &g_nested,
                                     &g_parents, &g_mode, &g_slow, &g_flush_rows, &wake))
        return NULL;
    Py_XSETREF(py_wake, Py_NewRef(wake));
    Py_RETURN_NONE;
}

static PyObject *set_default_phase(PyObject *self, PyObject *arg) {
    if (arg != Py_None && !PyUnicode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "set_default_phase takes a str or None");
        return NULL;
    }
    Py_XSETREF(g_phase_default, arg == Py_None ? NULL : Py_NewRef(arg));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ module paths from frames
 * Where no module row, autograd tag or gradient hook needs nn.Module's global hooks (the api
 * level alone, pprobe/interceptors/torch_modules.py "frames"), the module a row is recorded in
 * is read from the thread's frames when the row is recorded: the innermost frame of
 * Module._call_impl (or of _wrapped_call_impl, which calls it) holds the running module as
 * ``self``. Its path comes from torch_modules._paths ({id(module): (path, weakref)}); a module
 * not named yet is named by torch_modules.frame_path(frame), which names the whole chain of
 * running modules outermost first. Without global hooks torch's _call_impl keeps its fast path
 * (any global hook sends every module call through its slow path). */
static int g_mod_frames = 0;   /* on: rows read their module from the frames */
static int g_mod_training = 0; /* recorder.training_started() was called by this mechanism */
static PyObject *g_code_call = NULL, *g_code_wrapped = NULL; /* the two code objects */
/* the code of Optimizer.step's wrapper (Optimizer.profile_hook_step), or NULL */
static PyObject *g_code_opt = NULL;
static PyObject *g_mod_paths = NULL;    /* torch_modules._paths */
static PyObject *py_frame_path = NULL;  /* torch_modules.frame_path(frame) -> str | None */
static PyObject *py_train_start = NULL; /* recorder.training_started */
static PyObject *str_self = NULL, *str_f_locals = NULL;

/* The module a _call_impl / _wrapped_call_impl frame runs (new reference), or NULL with no
 * error set. */
static PyObject *frame_self(PyFrameObject *f) {
    PyObject *m = NULL;
#if PY_VERSION_HEX >= 0x030C0000
    m = PyFrame_GetVar(f, str_self);
#else
#if PY_VERSION_HEX >= 0x030B0000
    PyObject *loc = PyFrame_GetLocals(f);
#else
    PyObject *loc = PyObject_GetAttr((PyObject *)f, str_f_locals);
#endif
    if (loc) {
        m = PyDict_Check(loc) ? PyDict_GetItemWithError(loc, str_self) : NULL;
        Py_XINCREF(m);
        Py_DECREF(loc);
    }
#endif
    if (!m) drop_error();
    return m;
}

/* The path of the module whose call runs innermost on this thread (new reference), or NULL
 * (none, or naming it failed: reported). *found: a module call is running; *opt_inner (may be
 * NULL): an optimizer's step() runs inside that module call (its rows keep the optimizer
 * phase, as with the hooks, whose step pre-hook sets it after the module's). */
static PyObject *frames_module(int *found, int *opt_inner) {
    *found = 0;
    if (opt_inner) *opt_inner = 0;
    PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
    if (!f || !g_code_call) return NULL;
    Py_INCREF(f);
    while (1) {
        PyCodeObject *code = PyFrame_GetCode(f);
        int hit = (PyObject *)code == g_code_call || (PyObject *)code == g_code_wrapped;
        if (opt_inner && (PyObject *)code == g_code_opt && g_code_opt) *opt_inner = 1;
        Py_DECREF(code);
        if (hit) break;
        PyFrameObject *b = PyFrame_GetBack(f);
        Py_DECREF(f);
        if (!b) return NULL;
        f = b;
    }
    *found = 1;
    long depth = tl_depth;
    tl_depth = INTERNAL;
    if (!g_mod_training && py_train_start) {
        g_mod_training = 1;
        PyObject *r = PyObject_CallNoArgs(py_train_start);
        if (!r) report("starting the training phase");
        Py_XDECREF(r);
    }
    PyObject *path = NULL;
    PyObject *m = frame_self(f);
    if (m && g_mod_paths) {
        PyObject *key = PyLong_FromVoidPtr(m);
        PyObject *e = key ? PyDict_GetItemWithError(g_mod_paths, key) : NULL; /* borrowed */
        Py_XDECREF(key);
        if (e && PyTuple_Check(e) && PyTuple_GET_SIZE(e) == 2 &&
            PyWeakref_CheckRef(PyTuple_GET_ITEM(e, 1)) && PyUnicode_Check(PyTuple_GET_ITEM(e, 0))) {
#if PY_VERSION_HEX >= 0x030D0000
            PyObject *o = NULL;
            if (PyWeakref_GetRef(PyTuple_GET_ITEM(e, 1), &o) < 0) drop_error();
            if (o == m) path = Py_NewRef(PyTuple_GET_ITEM(e, 0));
            Py_XDECREF(o);
#else
            if (PyWeakref_GetObject(PyTuple_GET_ITEM(e, 1)) == m)
                path = Py_NewRef(PyTuple_GET_ITEM(e, 0));
#endif
        } else if (!e) {
            drop_error();
        }
    }
    Py_XDECREF(m);
    if (!path && py_frame_path) { /* not named yet (or not weakly referenceable) */
        PyObject *r = PyObject_CallOneArg(py_frame_path, (PyObject *)f);
        if (!r)
            report("naming a module");
        else if (PyUnicode_Check(r))
            path = r;
        else
            Py_DECREF(r);
    }
    tl_depth = depth;
    Py_DECREF(f);
    return path;
}

/* A row's module (new reference, or NULL: none) and phase (borrowed, or NULL: none): the
 * hooks' per-thread fields, or in frames mode the frames (phase forward inside a module call,
 * unless autograd's backward runs). */
static PyObject *row_where_obj(PyObject **phase) {
    PyObject *ph = tl_phase ? tl_phase : g_phase_default;
    *phase = ph;
    /* (in frames mode no hook sets tl_module: a value there is a hooks session's, stale) */
    if (!g_mod_frames) return tl_module ? Py_NewRef(tl_module) : NULL;
    int found, opt_inner;
    PyObject *path = frames_module(&found, &opt_inner);
    if (found && !opt_inner && !(tl_phase && (tl_phase == s_backward ||
                                (PyUnicode_Check(tl_phase) &&
                                 PyUnicode_CompareWithASCIIString(tl_phase, "backward") == 0))))
        *phase = s_forward;
    return path;
}

/* (called with the call's exception set when it raised: kept as it is; in frames mode the
 * walk may run Python code, so the exception is set aside around it) */
static void row_where(int32_t *module, int32_t *phase) {
    if (!g_mod_frames) { /* the hooks' per-thread fields: no Python code runs */
        *module = tl_module ? sid_of(tl_module) : -1;
        *phase = sid_of(tl_phase ? tl_phase : g_phase_default);
        return;
    }
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    PyObject *ph;
    PyObject *path = row_where_obj(&ph);
    *module = path ? sid_of(path) : -1;
    Py_XDECREF(path);
    *phase = sid_of(ph);
    drop_error();
    PyErr_Restore(et, ev, etb);
}

static PyObject *module_frames(PyObject *self, PyObject *args) {
    /* module_frames(on, _call_impl code, _wrapped_call_impl code, torch_modules._paths,
     * torch_modules.frame_path, recorder.training_started, Optimizer.step's wrapper code or
     * None); off: module_frames(False, None, None, None, None, None, None) */
    int on;
    PyObject *c1, *c2, *paths, *fp, *ts, *co;
    if (!PyArg_ParseTuple(args, "pOOOOOO", &on, &c1, &c2, &paths, &fp, &ts, &co)) return NULL;
    if (on && !(PyCode_Check(c1) && PyCode_Check(c2) && PyDict_Check(paths) &&
                (co == Py_None || PyCode_Check(co)))) {
        PyErr_SetString(PyExc_TypeError, "module_frames(on, code, code, dict, fn, fn, code)");
        return NULL;
    }
    if (!str_self && !(str_self = PyUnicode_InternFromString("self"))) return NULL;
    if (!str_f_locals && !(str_f_locals = PyUnicode_InternFromString("f_locals"))) return NULL;
    if (!s_forward && !(s_forward = PyUnicode_InternFromString("forward"))) return NULL;
    if (!s_backward && !(s_backward = PyUnicode_InternFromString("backward"))) return NULL;
    g_mod_frames = 0;
    Py_CLEAR(g_code_call);
    Py_CLEAR(g_code_wrapped);
    Py_CLEAR(g_mod_paths);
    Py_CLEAR(py_frame_path);
    Py_CLEAR(py_train_start);
    Py_CLEAR(g_code_opt);
    if (on) {
        g_code_opt = co == Py_None ? NULL : Py_NewRef(co);
        g_code_call = Py_NewRef(c1);
        g_code_wrapped = Py_NewRef(c2);
        g_mod_paths = Py_NewRef(paths);
        py_frame_path = Py_NewRef(fp);
        py_train_start = Py_NewRef(ts);
        g_mod_training = 0;
        g_mod_frames = 1;
    }
    Py_RETURN_NONE;
}

static PyObject *where_now(PyObject *self, PyObject *unused) {
    /* where(): (module path or None, phase or None) of a row recorded here now */
    PyObject *ph;
    PyObject *path = row_where_obj(&ph);
    if (PyErr_Occurred()) {
        Py_XDECREF(path);
        return NULL;
    }
    PyObject *r = PyTuple_Pack(2, path ? path : Py_None, ph ? ph : Py_None);
    Py_XDECREF(path);
    return r;
}

/* ------------------------------------------------------------------ lifecycle hooks' steps
 * The idle steps of zero-code lifecycle detection (pprobe/hooks/lifecycle.py), the twins of
 * the shortcuts at the top of its _on_optimizer_pre, _on_step_ending and _on_step_change and
 * of dispatch.calls_none: a step whose points call no hook costs its bookkeeping only, with
 * no Python frame. Everything else (the first step, a point a hook fires at, manual steps,
 * anything these cannot tell) is handed to the Python functions, which check again from the
 * start. A later step of a known optimizer whose point does call a hook has its bookkeeping
 * done here too; the emit is then one Python call (lifecycle._fire_before / _fire_after), not
 * the Python twin's whole path. The modules' state is read and written in their dicts (set up
 * by lifecycle_setup). */
static PyObject *lc_g = NULL, *dp_g = NULL, *st_g = NULL;  /* lifecycle, dispatch, state dicts */
static PyObject *lc_py_pre = NULL, *lc_py_ending = NULL, *lc_py_change = NULL;
static PyObject *lc_py_calls_none = NULL;
static PyObject *lc_py_fire_before = NULL, *lc_py_fire_after = NULL;
static PyObject *lc_one = NULL; /* 1 */
static PyObject *s_quiet, *s_optimizer, *s_seen_opt, *s_pending, *s_open_step, *s_started,
    *s_steps_in_epoch, *s_claimed, *s_hooks, *s_services, *s_kinds, *s_manual_step,
    *s_step_name, *s_idle_points, *s_off, *s_frequency, *s_should_trigger, *s_before_step,
    *s_after_step, *s_step_opened, *s_step_opened_ns;

/* a global of one of the modules, borrowed; NULL (no exception) when absent */
static inline PyObject *lc_get(PyObject *d, PyObject *name) {
    PyObject *v = PyDict_GetItemWithError(d, name);
    if (!v) drop_error();
    return v;
}

static inline int lc_truth(PyObject *d, PyObject *name) {
    PyObject *v = lc_get(d, name);
    int r = v ? PyObject_IsTrue(v) : 0;
    if (r < 0) drop_error(); /* not a truth value (ints and bools here): false */
    return r > 0;
}

/* dispatch._claimed is None and bool(dispatch._hooks) */
static int lc_heard(void) {
    PyObject *c = lc_get(dp_g, s_claimed), *h = lc_get(dp_g, s_hooks);
    return (!c || c == Py_None) && h && PyList_Check(h) && PyList_GET_SIZE(h) > 0;
}

/* dispatch.calls_none(point, at): 1 / 0, -1 when this cannot tell (then Python answers) */
static int lc_calls_none(PyObject *point, PyObject *at) {
    PyObject *hooks = lc_get(dp_g, s_hooks), *kinds = lc_get(dp_g, s_kinds);
    if (!hooks || !PyList_Check(hooks) || !kinds || !PyDict_Check(kinds)) return -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(hooks); i++) {
        PyObject *hook = Py_NewRef(PyList_GET_ITEM(hooks, i));
        PyObject *d = NULL; /* getattr(hook, "__dict__", {}) as Python reads it */
        int r = -1;
        PyObject *kind = PyDict_GetItemWithError(kinds, (PyObject *)Py_TYPE(hook));
        if (!kind || !PyTuple_Check(kind) || PyTuple_GET_SIZE(kind) != 2) goto next;
        PyObject *own = PyTuple_GET_ITEM(kind, 0);
        int plain = PyTuple_GET_ITEM(kind, 1) == Py_True;
        if (Py_TYPE(hook)->tp_dictoffset) {
            d = PyObject_GenericGetDict(hook, NULL);
            if (!d) goto next;
            if (!PyDict_Check(d)) Py_CLEAR(d);
        }
        /* in the twin's order: no method for the point, off, idle there (each: continue) */
        int in_own = PySet_Contains(own, point);
        if (in_own < 0) goto next;
        int in_d = d && !in_own ? PyDict_Contains(d, point) : 0;
        if (in_d < 0) goto next;
        if (!in_own && !in_d) {
            r = 2; /* continue */
            goto next;
        }
        PyObject *idle = d ? PyDict_GetItemWithError(d, s_idle_points) : NULL;
        if (!idle && PyErr_Occurred()) goto next;
        PyObject *off = PyObject_GetAttr(hook, s_off);
        int is_off = 0;
        if (!off) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) goto next;
            drop_error();
        } else {
            is_off = PyObject_IsTrue(off);
            Py_DECREF(off);
            if (is_off < 0) goto next;
        }
        if (is_off) {
            r = 2;
            goto next;
        }
        if (idle) {
            int t = PyObject_IsTrue(idle);
            int c = t == 1 ? PySequence_Contains(idle, point) : 0;
            if (t < 0 || c < 0) goto next;
            if (c) {
                r = 2;
                goto next;
            }
        }
        int st = d ? PyDict_Contains(d, s_should_trigger) : 0;
        if (st < 0) goto next;
        if (!plain || st) {
            r = 0;
            goto next;
        }
        PyObject *f = PyObject_GetAttr(hook, s_frequency);
        PyObject *m = f ? PyNumber_Remainder(at, f) : NULL;
        Py_XDECREF(f);
        if (!m) { /* Python: any exception there means "called" (emit reports it) */
            drop_error();
            r = 0;
            goto next;
        }
        int nz = PyObject_IsTrue(m);
        Py_DECREF(m);
        if (nz < 0) {
            drop_error();
            r = 0;
            goto next;
        }
        r = nz ? 2 : 0;
    next:
        Py_XDECREF(d);
        Py_DECREF(hook);
        if (r == -1) {
            drop_error();
            return -1;
        }
        if (r == 0) return 0;
    }
    return 1;
}

/* calls_none(point, at) through the C twin, else dispatch.calls_none: 1 / 0 / -1 (error) */
static int lc_calls_none_or_py(PyObject *point, PyObject *at) {
    int r = lc_calls_none(point, at);
    if (r >= 0) return r;
    PyObject *v = PyObject_CallFunctionObjArgs(lc_py_calls_none, point, at, NULL);
    if (!v) return -1;
    r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

static inline int lc_set(PyObject *d, PyObject *name, PyObject *v) {
    return PyDict_SetItem(d, name, v);
}

/* lifecycle._on_optimizer_pre's shortcut: a later step of a known optimizer whose
 * before_step calls no hook: _open_step(pending, unheard=True)'s bookkeeping */
static PyObject *lc_pre(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    if (!lc_g || n != 3) goto python;
    if (lc_truth(st_g, s_manual_step) || lc_truth(lc_g, s_quiet)) Py_RETURN_NONE;
    PyObject *opt = lc_get(lc_g, s_optimizer), *seen = lc_get(lc_g, s_seen_opt);
    if (!opt || opt == Py_None || !seen || !PyDict_Check(seen)) goto python;
    PyObject *key = PyLong_FromVoidPtr(a[0]);
    PyObject *w = key ? PyDict_GetItemWithError(seen, key) : NULL; /* borrowed */
    Py_XDECREF(key);
    if (!w) goto python;
    if (!PyWeakref_Check(w)) goto python;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *alive = NULL;
    if (PyWeakref_GetRef(w, &alive) < 0) goto python;
    Py_XDECREF(alive); /* only compared: the optimizer is a[0], held by the call */
#else
    PyObject *alive = PyWeakref_GetObject(w); /* borrowed */
#endif
    if (alive != a[0]) goto python;
    PyObject *pending = lc_get(lc_g, s_pending);
    if (!pending) goto python;
    int fire = 0; /* before_step calls a hook: _fire_before(pending) after the bookkeeping */
    if (pending != Py_None && lc_heard()) {
        int r = lc_calls_none_or_py(s_before_step, pending);
        if (r < 0) goto python;
        fire = !r;
    }
    if (pending != Py_None) {
        Py_INCREF(pending);
        PyObject *k = lc_get(lc_g, s_steps_in_epoch);
        PyObject *k1 = k ? PyNumber_Add(k, lc_one) : NULL;
        PyObject *services = lc_get(dp_g, s_services);
        PyObject *ns = PyLong_FromLongLong(now_ns()); /* dispatch.step_opened_ns */
        int bad = !k1 || !ns || !services || !PyDict_Check(services) ||
                  lc_set(lc_g, s_open_step, pending) < 0 ||
                  lc_set(lc_g, s_pending, Py_None) < 0 ||
                  lc_set(lc_g, s_steps_in_epoch, k1) < 0 ||
                  PyDict_SetItem(services, s_step_name, pending) < 0 ||
                  lc_set(dp_g, s_step_opened, pending) < 0 ||
                  lc_set(dp_g, s_step_opened_ns, ns) < 0;
        Py_XDECREF(k1);
        Py_XDECREF(ns);
        if (bad) {
            Py_DECREF(pending);
            goto python; /* memory: Python's path reports what fails there */
        }
        if (fire) { /* it reports what its hooks raise, as the twin does: never raises */
            PyObject *v = PyObject_CallOneArg(lc_py_fire_before, pending);
            Py_DECREF(pending);
            if (!v) return NULL;
            Py_DECREF(v);
            Py_RETURN_NONE;
        }
        Py_DECREF(pending);
    }
    Py_RETURN_NONE;
python: /* what the shortcut does not take, and anything that failed in it */
    drop_error();
    return PyObject_Vectorcall(lc_py_pre, a, n, NULL);
}

/* a listener's (old, new): 1 the step moved (and no quiet() is on), 0 nothing to do, -1 the
 * Python twin's (not set up, other arguments, a comparison that raised) */
static int lc_moved(PyObject *const *a, Py_ssize_t n) {
    if (!lc_g || n != 2) return -1;
    if (lc_truth(lc_g, s_quiet)) return 0;
    int eq = PyObject_RichCompareBool(a[0], a[1], Py_EQ);
    return eq < 0 ? -1 : !eq;
}

/* lifecycle._on_step_ending's shortcut: the open step ends and calls no hook */
static PyObject *lc_ending(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    int moved = lc_moved(a, n);
    if (moved < 0) goto python;
    if (!moved) Py_RETURN_NONE;
    PyObject *open = lc_get(lc_g, s_open_step);
    if (!open || open == Py_None || !lc_truth(lc_g, s_started)) goto python;
    Py_INCREF(open);
    int fire = 0; /* after_step calls a hook: _fire_after(open) once the step is closed */
    if (lc_heard()) {
        int r = lc_calls_none_or_py(s_after_step, open);
        if (r < 0) {
            Py_DECREF(open);
            goto python;
        }
        fire = !r;
    }
    if (lc_set(lc_g, s_open_step, Py_None) < 0) {
        Py_DECREF(open);
        goto python;
    }
    if (fire) { /* what its hooks raise goes to the recorder's listener loop, as the twin's */
        PyObject *v = PyObject_CallOneArg(lc_py_fire_after, open);
        Py_DECREF(open);
        return v;
    }
    Py_DECREF(open);
    Py_RETURN_NONE;
python:
    drop_error();
    return PyObject_Vectorcall(lc_py_ending, a, n, NULL);
}

/* lifecycle._on_step_change: an optimizer step leaves the new step pending */
static PyObject *lc_change(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    int moved = lc_moved(a, n);
    if (moved < 0) goto python;
    if (!moved) Py_RETURN_NONE;
    if (lc_truth(st_g, s_manual_step)) goto python;
    if (lc_set(lc_g, s_pending, a[1]) < 0) goto python;
    Py_RETURN_NONE;
python:
    drop_error();
    return PyObject_Vectorcall(lc_py_change, a, n, NULL);
}

static PyObject *lc_calls_none_py(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    if (!lc_g || n != 2) {
        PyErr_SetString(PyExc_TypeError, "calls_none(point, at) after lifecycle_setup");
        return NULL;
    }
    int r = lc_calls_none_or_py(a[0], a[1]);
    if (r < 0) return NULL;
    return PyBool_FromLong(r);
}

/* lifecycle_setup(lifecycle globals, dispatch globals, state globals, _on_optimizer_pre,
 * _on_step_ending, _on_step_change, calls_none, _fire_before, _fire_after): the Python twins
 * the shortcuts hand the rest to, and the emits of the points they find a hook for */
static PyObject *lifecycle_setup(PyObject *self, PyObject *args) {
    PyObject *lg, *dg, *sg, *pre, *ending, *change, *cn, *fb, *fa;
    if (!PyArg_ParseTuple(args, "O!O!O!OOOOOO", &PyDict_Type, &lg, &PyDict_Type, &dg,
                          &PyDict_Type, &sg, &pre, &ending, &change, &cn, &fb, &fa))
        return NULL;
#define INTERN(v, s) if (!v && !(v = PyUnicode_InternFromString(s))) return NULL
    INTERN(s_quiet, "_quiet");
    INTERN(s_optimizer, "_optimizer");
    INTERN(s_seen_opt, "_seen_optimizers");
    INTERN(s_pending, "pending");
    INTERN(s_open_step, "open_step");
    INTERN(s_started, "started");
    INTERN(s_steps_in_epoch, "steps_in_epoch");
    INTERN(s_claimed, "_claimed");
    INTERN(s_hooks, "_hooks");
    INTERN(s_services, "_services");
    INTERN(s_kinds, "_kinds");
    INTERN(s_manual_step, "manual_step");
    INTERN(s_step_name, "step");
    INTERN(s_idle_points, "idle_points");
    INTERN(s_off, "off");
    INTERN(s_frequency, "frequency");
    INTERN(s_should_trigger, "should_trigger");
    INTERN(s_before_step, "before_step");
    INTERN(s_after_step, "after_step");
    INTERN(s_step_opened, "step_opened");
    INTERN(s_step_opened_ns, "step_opened_ns");
#undef INTERN
    if (!lc_one && !(lc_one = PyLong_FromLong(1))) return NULL;
    Py_XSETREF(lc_py_pre, Py_NewRef(pre));
    Py_XSETREF(lc_py_ending, Py_NewRef(ending));
    Py_XSETREF(lc_py_change, Py_NewRef(change));
    Py_XSETREF(lc_py_calls_none, Py_NewRef(cn));
    Py_XSETREF(lc_py_fire_before, Py_NewRef(fb));
    Py_XSETREF(lc_py_fire_after, Py_NewRef(fa));
    Py_XSETREF(dp_g, Py_NewRef(dg));
    Py_XSETREF(st_g, Py_NewRef(sg));
    Py_XSETREF(lc_g, Py_NewRef(lg)); /* last: it turns the shortcuts on */
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ extension tables' steps
 * The twin of pprobe.ext.tables.on_step and the sample it takes at a step boundary (the
 * recorder's step listener): every ``sample_steps`` boundaries, each @table / @metric
 * function is called (as pprobe's own code: depth INTERNAL), a metric's value made a float
 * and a table's dict copied, and one untracked entry (step, rank, ts_ns, sources, values)
 * appended to tables._raw, with state.step the step that ends. A value of another kind goes
 * through tables._sampled_value (lists, frames) and a raise through tables.note_failure, as
 * in the Python sample; the first call (the setting not read yet) is the Python on_step's. */
static PyObject *es_g = NULL, *es_st = NULL, *es_py_on_step = NULL, *es_py_value = NULL;
static PyObject *es_py_failure = NULL, *es_skip = NULL;
static PyObject *s_every, *s_sources, *s_steps_seen, *s_todo, *s_raw, *s_step_st, *s_rank,
    *s_fn, *s_kind, *s_what, *s_metric_str;

static PyObject *es_entry_values(PyObject *todo, int *some) {
    Py_ssize_t n = PyTuple_GET_SIZE(todo);
    PyObject *gots = PyTuple_New(n);
    if (!gots) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = PyTuple_GET_ITEM(todo, i), *got = NULL;
        int off = attr_true(s, s_off);
        if (off < 0) goto fail;
        if (off) {
            PyTuple_SET_ITEM(gots, i, Py_NewRef(es_skip));
            continue;
        }
        PyObject *fn = PyObject_GetAttr(s, s_fn), *kind = fn ? PyObject_GetAttr(s, s_kind) : NULL;
        PyObject *raw = kind ? PyObject_CallNoArgs(fn) : NULL;
        if (raw) {
            int metric = PyUnicode_Check(kind) && PyUnicode_Compare(kind, s_metric_str) == 0;
            if (metric) got = raw == Py_None ? Py_NewRef(Py_None) : PyNumber_Float(raw);
            else if (PyDict_CheckExact(raw)) got = PyDict_Copy(raw);
            else if (raw == Py_None) got = Py_NewRef(Py_None);
            else got = PyObject_CallFunctionObjArgs(es_py_value, s, raw, NULL);
            Py_DECREF(raw);
        }
        Py_XDECREF(fn);
        Py_XDECREF(kind);
        if (!got) {
            /* Python's sample catches Exception: a KeyboardInterrupt goes to the program */
            if (!PyErr_ExceptionMatches(PyExc_Exception)) goto fail;
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            PyErr_NormalizeException(&et, &ev, &tb);
            if (tb && ev) PyException_SetTraceback(ev, tb);
            PyObject *what = PyObject_GetAttr(s, s_what);
            PyObject *r = what && ev ? PyObject_CallFunctionObjArgs(es_py_failure, what, s, ev, NULL)
                                     : NULL;
            Py_XDECREF(what);
            Py_XDECREF(et);
            Py_XDECREF(ev);
            Py_XDECREF(tb);
            if (!r) goto fail;
            Py_DECREF(r);
            PyTuple_SET_ITEM(gots, i, Py_NewRef(es_skip));
            continue;
        }
        PyTuple_SET_ITEM(gots, i, got);
        *some = 1;
    }
    return gots;
fail:
    Py_DECREF(gots);
    return NULL;
}

static PyObject *es_on_step(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    if (!es_g || n != 2) goto python;
    PyObject *every = lc_get(es_g, s_every);
    if (!every || every == Py_None || !PyLong_CheckExact(every)) goto python;
    long ev = PyLong_AsLong(every);
    if (ev == -1 && PyErr_Occurred()) {
        drop_error();
        goto python;
    }
    PyObject *sources = lc_get(es_g, s_sources);
    if (ev <= 0 || !sources || !PyDict_Check(sources) || !PyDict_GET_SIZE(sources))
        Py_RETURN_NONE;
    int eq = PyObject_RichCompareBool(a[0], a[1], Py_EQ);
    if (eq < 0) return NULL;
    if (eq) Py_RETURN_NONE; /* pprobe.step(n) at the step it is: no boundary */
    PyObject *seen = lc_get(es_g, s_steps_seen);
    long long k = seen ? PyLong_AsLongLong(seen) : -1;
    if (k < 0) {
        drop_error();
        goto python;
    }
    PyObject *k1 = PyLong_FromLongLong(k + 1);
    if (!k1 || PyDict_SetItem(es_g, s_steps_seen, k1) < 0) {
        Py_XDECREF(k1);
        return NULL;
    }
    Py_DECREF(k1);
    if ((k + 1) % ev) Py_RETURN_NONE;
    PyObject *todo = lc_get(es_g, s_todo), *rawl = lc_get(es_g, s_raw);
    if (!todo || !PyTuple_CheckExact(todo) || !PyTuple_GET_SIZE(todo) || !rawl ||
        !PyList_CheckExact(rawl))
        Py_RETURN_NONE;
    Py_INCREF(todo);
    Py_INCREF(rawl);
    /* what the functions record (pprobe.record in a @table) is in the step that ends */
    PyObject *saved = lc_get(es_st, s_step_st);
    Py_XINCREF(saved);
    PyObject *res = NULL, *gots = NULL, *entry = NULL;
    if (PyDict_SetItem(es_st, s_step_st, a[0]) < 0) goto done;
    long depth = tl_depth;
    tl_depth = INTERNAL;
    int some = 0;
    gots = es_entry_values(todo, &some);
    tl_depth = depth;
    if (!gots) goto done;
    if (some) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        PyObject *rank = lc_get(es_st, s_rank);
        PyObject *t = PyLong_FromLongLong((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
        entry = t ? PyTuple_Pack(5, a[0], rank ? rank : Py_None, t, todo, gots) : NULL;
        Py_XDECREF(t);
        if (!entry) goto done;
        PyObject_GC_UnTrack(gots); /* untrack_sample's reasons: only _raw refers to them */
        PyObject_GC_UnTrack(entry);
        if (PyList_Append(rawl, entry) < 0) goto done;
    }
    res = Py_NewRef(Py_None);
done:
    if (saved) {
        PyObject *et, *ev2, *tb;
        PyErr_Fetch(&et, &ev2, &tb);
        if (PyDict_SetItem(es_st, s_step_st, saved) < 0) drop_error();
        PyErr_Restore(et, ev2, tb);
        Py_DECREF(saved);
    }
    Py_XDECREF(entry);
    Py_XDECREF(gots);
    Py_DECREF(todo);
    Py_DECREF(rawl);
    return res;
python:
    return PyObject_Vectorcall(es_py_on_step, a, n, NULL);
}

/* ext_setup(tables globals, state globals, on_step, _sampled_value, note_failure, _SKIP) */
static PyObject *ext_setup(PyObject *self, PyObject *args) {
    PyObject *g, *st, *on_step, *value, *failure, *skip;
    if (!PyArg_ParseTuple(args, "O!O!OOOO", &PyDict_Type, &g, &PyDict_Type, &st, &on_step,
                          &value, &failure, &skip))
        return NULL;
#define INTERN(v, s) if (!v && !(v = PyUnicode_InternFromString(s))) return NULL
    INTERN(s_every, "_every");
    INTERN(s_sources, "sources");
    INTERN(s_steps_seen, "_steps_seen");
    INTERN(s_todo, "_todo");
    INTERN(s_raw, "_raw");
    INTERN(s_step_st, "step");
    INTERN(s_rank, "rank");
    INTERN(s_fn, "fn");
    INTERN(s_kind, "kind");
    INTERN(s_what, "what");
    INTERN(s_metric_str, "metric");
    INTERN(s_off, "off");
#undef INTERN
    Py_XSETREF(es_st, Py_NewRef(st));
    Py_XSETREF(es_py_on_step, Py_NewRef(on_step));
    Py_XSETREF(es_py_value, Py_NewRef(value));
    Py_XSETREF(es_py_failure, Py_NewRef(failure));
    Py_XSETREF(es_skip, Py_NewRef(skip));
    Py_XSETREF(es_g, Py_NewRef(g)); /* last: it turns the C listener on */
    Py_RETURN_NONE;
}

static PyObject *set_step(PyObject *self, PyObject *arg) {
    long long s = PyLong_AsLongLong(arg);
    if (s == -1 && PyErr_Occurred()) return NULL;
    g_step = s;
    Py_RETURN_NONE;
}

static PyObject *set_op(PyObject *self, PyObject *args) {
    Py_ssize_t i;
    int selected, framework;
    long every, first;
    if (!PyArg_ParseTuple(args, "npllI", &i, &selected, &every, &first, &framework)) return NULL;
    if (i < 0) {
        PyErr_SetString(PyExc_ValueError, "op index < 0");
        return NULL;
    }
    if (i >= g_nops) {
        Py_ssize_t n = g_nops ? g_nops : 256;
        while (n <= i) n *= 2;
        OpInfo *no = PyMem_Realloc(g_ops, n * sizeof(OpInfo));
        if (!no) return PyErr_NoMemory();
        memset(no + g_nops, 0, (n - g_nops) * sizeof(OpInfo));
        g_ops = no;
        g_nops = n;
    }
    OpInfo *o = &g_ops[i];
    o->selected = selected;
    o->every = every > 0 ? every : 1;
    o->first = first;
    o->sampled = o->every > 1 || first > 0;
    o->framework = framework;
    o->calls = 0;
    o->uninit = 0;
    Py_RETURN_NONE;
}

/* set_stats(capsule, fallback, out_note, uninit_note, out_sid[, tensor_stats[, tensor_cap]]):
 * statistics here in stats mode; tensor_stats(t): a torch tensor's (the torch handler's
 * stats), after tensor_cap's C function (_dumpio's _C_TENSOR_STATS: plain CPU tensors, the
 * same numbers as tensor_stats gives) where it takes the tensor (see desc_stats);
 * set_stats(None, ...) hands them back to the Python engine. */
static PyObject *set_stats(PyObject *self, PyObject *args) {
    PyObject *cap, *fallback, *out_note, *uninit_note, *tensor_stats = Py_None;
    PyObject *tcap = Py_None;
    int out_sid;
    if (!PyArg_ParseTuple(args, "OOUUi|OO", &cap, &fallback, &out_note, &uninit_note, &out_sid,
                          &tensor_stats, &tcap))
        return NULL;
    stats_fn f = NULL, tf = NULL;
    if (cap != Py_None) {
        f = (stats_fn)PyCapsule_GetPointer(cap, "pprobe._dumpio._C_STATS");
        if (!f) return NULL;
    }
    if (tcap != Py_None) {
        tf = (stats_fn)PyCapsule_GetPointer(tcap, "pprobe._dumpio._C_TENSOR_STATS");
        if (!tf) return NULL;
    }
    g_tstats_c = f ? tf : NULL;
    Py_XSETREF(py_stats_fallback, Py_NewRef(fallback));
    Py_XSETREF(py_tensor_stats, Py_NewRef(tensor_stats));
    Py_XSETREF(str_out_note, Py_NewRef(out_note));
    Py_XSETREF(str_uninit_note, Py_NewRef(uninit_note));
    s_out_kw = out_sid;
    g_stats_c = f;
    Py_RETURN_NONE;
}

static PyObject *set_seq(PyObject *self, PyObject *arg) {
    long long s = PyLong_AsLongLong(arg);
    if (s == -1 && PyErr_Occurred()) return NULL;
    g_seq = s;
    Py_RETURN_NONE;
}

/* set_stacks(stack_id, depth): recorder._stack_id and PPROBE_STACK_DEPTH */
static PyObject *set_stacks(PyObject *self, PyObject *args) {
    PyObject *fn;
    int depth;
    if (!PyArg_ParseTuple(args, "Oi", &fn, &depth)) return NULL;
    Py_XSETREF(py_stack_id, Py_NewRef(fn));
    g_stack_depth = depth < 1 ? 1 : depth;
    map2_clear(&g_stacks, 0);
    Py_RETURN_NONE;
}

static PyObject *clear_code_cache(PyObject *self, PyObject *unused) {
    map2_clear(&g_codes, 1);
    map2_clear(&g_mine, 1);
    map2_clear(&g_sites, 1);
    Py_RETURN_NONE;
}

static PyObject *set_opcodes(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    if (b.len != 65536) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "the opcode table has 65536 entries");
        return NULL;
    }
    memcpy(g_opclass, b.buf, 65536);
    PyBuffer_Release(&b);
    map2_clear(&g_sites, 1);
    Py_RETURN_NONE;
}

static PyObject *set_operators(PyObject *self, PyObject *arg) {
    Py_XSETREF(g_operator_ops, Py_NewRef(arg));
    map2_clear(&g_operator_cache, 0);
    Py_RETURN_NONE;
}

static PyObject *numpy_init(PyObject *self, PyObject *args) {
    /* (ndarray, generic, ufunc type, scalar type -> sid dict, {id(builtin descr): sid},
     *  dtype_sid function, a test array) */
    PyObject *nd, *gen, *uf, *scal, *descrs, *dsid, *probe;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!OO", &PyType_Type, &nd, &PyType_Type, &gen,
                          &PyType_Type, &uf, &PyDict_Type, &scal, &PyDict_Type, &descrs, &dsid,
                          &probe))
        return NULL;
    /* self-test of the array struct on a live array */
    if (!PyObject_TypeCheck(probe, (PyTypeObject *)nd)) {
        PyErr_SetString(PyExc_TypeError, "the test array is not an ndarray");
        return NULL;
    }
    NpyArrayFields *a = (NpyArrayFields *)probe;
    PyObject *shape = PyObject_GetAttrString(probe, "shape");
    PyObject *dtype = PyObject_GetAttrString(probe, "dtype");
    int ok = shape && dtype && PyTuple_Check(shape) && a->nd == PyTuple_GET_SIZE(shape) &&
             a->descr == dtype;
    for (Py_ssize_t i = 0; ok && i < a->nd; i++)
        ok = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i)) == a->dimensions[i];
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    if (!ok) {
        drop_error();
        PyErr_SetString(PyExc_RuntimeError, "NumPy's array struct is not the expected one");
        return NULL;
    }
    Py_XSETREF(np_ndarray, (PyTypeObject *)Py_NewRef(nd));
    Py_XSETREF(np_generic, (PyTypeObject *)Py_NewRef(gen));
    Py_XSETREF(g_ufunc_type, Py_NewRef(uf));
    Py_XSETREF(np_scalar_sids, Py_NewRef(scal));
    Py_XSETREF(np_descr_sids, Py_NewRef(descrs));
    Py_XSETREF(py_dtype_sid, Py_NewRef(dsid));
    Py_RETURN_NONE;
}

static PyObject *init(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"begin", "end", "not_a_row", "is_internal", "site_id", "sid", "ids",
                            "outputs", "error", "note_thread", "import_frame", "idx_strs",
                            "ops", "fixed", NULL};
    PyObject *beg, *end, *nar, *isi, *sit, *sid, *ids, *outs, *err, *nt, *imf, *idxs, *ops;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOO!OOOOO!O!(iiiii)", names, &beg, &end,
                                     &nar, &isi, &sit, &sid, &PyDict_Type, &ids, &outs, &err,
                                     &nt, &imf, &PyTuple_Type, &idxs, &PyList_Type, &ops, &s_ok,
                                     &s_input, &s_output, &s_cpu, &s_idx0))
        return NULL;
    PyObject *mt = PyImport_ImportModule("threading"); /* imported already, by pprobe.state */
    PyObject *main = mt ? PyObject_CallMethod(mt, "main_thread", NULL) : NULL;
    PyObject *ident = main ? PyObject_GetAttrString(main, "ident") : NULL;
    if (ident && PyLong_Check(ident)) g_main_ident = PyLong_AsUnsignedLong(ident);
    Py_XDECREF(mt);
    Py_XDECREF(main);
    Py_XDECREF(ident);
    if (PyErr_Occurred()) return NULL;
    Py_XSETREF(py_begin, Py_NewRef(beg));
    Py_XSETREF(py_end, Py_NewRef(end));
    Py_XSETREF(py_not_a_row, Py_NewRef(nar));
    Py_XSETREF(py_is_internal, Py_NewRef(isi));
    Py_XSETREF(py_site_id, Py_NewRef(sit));
    Py_XSETREF(py_sid, Py_NewRef(sid));
    Py_XSETREF(py_ids, Py_NewRef(ids));
    Py_XSETREF(py_outputs, Py_NewRef(outs));
    Py_XSETREF(py_error, Py_NewRef(err));
    Py_XSETREF(py_note_thread, Py_NewRef(nt));
    Py_XSETREF(py_import_frame, Py_NewRef(imf));
    Py_XSETREF(py_idx_strs, Py_NewRef(idxs));
    Py_XSETREF(g_ops_list, Py_NewRef(ops));
    if (PyTuple_GET_SIZE(idxs) != 64) {
        PyErr_SetString(PyExc_ValueError, "idx_strs must hold 64 strings");
        return NULL;
    }
    if (!g_buffer) {
        g_buffer = (BufferObject *)PyObject_CallNoArgs((PyObject *)&BufferType);
        if (!g_buffer) return NULL;
    }
    return Py_NewRef((PyObject *)g_buffer);
}

static PyObject *after_fork_child(PyObject *self, PyObject *unused) {
    if (g_buffer) {
        g_buffer->n_ops = g_buffer->n_descs = 0;
        PyObject *n = PyList_New(0);
        if (!n) return NULL;
        Py_SETREF(g_buffer->objs, n);
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ the writer's strings */
/* utf8_column(items, ids=None, one=False) -> (null count, validity bitmap or None, offsets,
   data): an Arrow utf8 column's buffers (int32 offsets, LSB-first bitmap) for the writer
   (pprobe.writer, whose Python twin joins the same bytes with bytes.join).
   Without ids, items is a list with a bytes, str (its UTF-8; a str that has none, such as a
   lone surrogate, raises UnicodeEncodeError) or None per row. With ids (a 1-d int32 or int64
   buffer, any stride: a field of the record buffer as it is), row k is items[ids[k] + 1],
   the table of string ids' UTF-8 bytes (items[0] is b""), and an id below 0 is a null; with
   one, a column whose rows all have the same id gives that id (an int) instead, so that the
   writer writes it as one value (pprobe.arrowipc.Const) and builds no buffer. */
typedef struct {
    const char *buf;
    Py_ssize_t stride;
    int wide; /* int64 (else int32) */
} Ids;

static inline int64_t id_at(const Ids *v, Py_ssize_t k) {
    const char *p = v->buf + k * v->stride;
    if (v->wide) {
        int64_t x;
        memcpy(&x, p, 8);
        return x;
    }
    int32_t x;
    memcpy(&x, p, 4);
    return x;
}

static int ids_of(Py_buffer *b, Ids *v) {
    const char *f = b->format ? b->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    int ok = b->ndim == 1 && f[1] == '\0' &&
             ((b->itemsize == 8 && (*f == 'q' || *f == 'l')) ||
              (b->itemsize == 4 && (*f == 'i' || *f == 'l')));
    if (!ok) {
        PyErr_SetString(PyExc_TypeError, "utf8_column: ids must be a 1-d int32 or int64 buffer");
        return -1;
    }
    v->buf = (const char *)b->buf;
    v->stride = b->strides ? b->strides[0] : b->itemsize;
    v->wide = b->itemsize == 8;
    return 0;
}

static PyObject *utf8_column(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 3 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "utf8_column(items: list, ids=None, one=False)");
        return NULL;
    }
    PyObject *items = args[0];
    Py_buffer ib = {0};
    Ids v = {0};
    int have_ids = 0;
    Py_ssize_t n = PyList_GET_SIZE(items);
    if (nargs >= 2 && args[1] != Py_None) {
        if (PyObject_GetBuffer(args[1], &ib, PyBUF_STRIDES | PyBUF_FORMAT) < 0) return NULL;
        if (ids_of(&ib, &v) < 0) {
            PyBuffer_Release(&ib);
            return NULL;
        }
        have_ids = 1;
        n = ib.shape ? ib.shape[0] : ib.len / ib.itemsize;
    }
    Py_ssize_t table = PyList_GET_SIZE(items);
    PyObject *offsets = NULL, *bitmap = NULL, *data = NULL, *out = NULL;
    if (have_ids && n && nargs == 3) {
        int one = PyObject_IsTrue(args[2]);
        if (one < 0) goto done;
        if (one) {
            int64_t first = id_at(&v, 0);
            Py_ssize_t k = 1;
            while (k < n && id_at(&v, k) == first) k++;
            if (k == n) {
                if (first + 1 >= table) {
                    PyErr_SetString(PyExc_IndexError, "utf8_column: a string id past the table");
                    goto done;
                }
                out = PyLong_FromLongLong(first < 0 ? -1 : first);
                goto done;
            }
        }
    }
    offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * 4);
    if (!offsets) goto done;
    int32_t *off = (int32_t *)PyBytes_AS_STRING(offsets);
    int64_t total = 0;
    Py_ssize_t nulls = 0;
    off[0] = 0;
    for (Py_ssize_t k = 0; k < n; k++) { /* the sizes, and every item checked */
        PyObject *it;
        if (have_ids) {
            int64_t id = id_at(&v, k);
            int64_t i = id + 1;
            if (i < 0) i = 0;
            if (i >= table) {
                PyErr_SetString(PyExc_IndexError, "utf8_column: a string id past the table");
                goto done;
            }
            nulls += id < 0;
            it = PyList_GET_ITEM(items, i);
        } else {
            it = PyList_GET_ITEM(items, k);
            if (it == Py_None) {
                nulls++;
                off[k + 1] = (int32_t)total;
                continue;
            }
        }
        Py_ssize_t len;
        if (PyBytes_Check(it)) {
            len = PyBytes_GET_SIZE(it);
        } else if (PyUnicode_Check(it)) { /* its UTF-8 (kept by the str: ASCII is its data) */
            if (!PyUnicode_AsUTF8AndSize(it, &len)) goto done; /* a lone surrogate */
        } else {
            PyErr_SetString(PyExc_TypeError, "utf8_column: items must be bytes, str or None");
            goto done;
        }
        total += len;
        if (total >= ((int64_t)1 << 31)) {
            PyErr_SetString(PyExc_ValueError, "a string column of 2 GiB or more in one batch");
            goto done;
        }
        off[k + 1] = (int32_t)total;
    }
    data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (!data) goto done;
    char *dst = PyBytes_AS_STRING(data);
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t len = off[k + 1] - off[k];
        if (!len) continue;
        PyObject *it = have_ids ? PyList_GET_ITEM(items, id_at(&v, k) + 1)
                                : PyList_GET_ITEM(items, k);
        const char *src = PyBytes_Check(it) ? PyBytes_AS_STRING(it) : PyUnicode_AsUTF8(it);
        if (!src) goto done;
        memcpy(dst + off[k], src, (size_t)len);
    }
    if (nulls) {
        bitmap = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
        if (!bitmap) goto done;
        uint8_t *bits = (uint8_t *)PyBytes_AS_STRING(bitmap);
        memset(bits, 0, (size_t)(n + 7) / 8);
        for (Py_ssize_t k = 0; k < n; k++) {
            int valid = have_ids ? id_at(&v, k) >= 0 : PyList_GET_ITEM(items, k) != Py_None;
            bits[k >> 3] |= (uint8_t)(valid << (k & 7));
        }
    }
    out = Py_BuildValue("(nOOO)", nulls, bitmap ? bitmap : Py_None, offsets, data);
done:
    if (have_ids) PyBuffer_Release(&ib);
    Py_XDECREF(offsets);
    Py_XDECREF(bitmap);
    Py_XDECREF(data);
    return out;
}

/* dict_indices(ids) -> a dict<utf8> column of string ids (pprobe.arrowipc.dict_indices,
   whose NumPy code is the twin): the one id of every row (an int; -1: all null), or (null
   count, validity bitmap or None, int32 indices ids + 1) as bytes. ids: as utf8_column's.
   One pass in C with the GIL held: NumPy's passes would each hand the GIL to the program's
   thread and wait to get it back. */
static PyObject *dict_indices_of(const Ids *vp, Py_ssize_t n) {
    const Ids v = *vp;
    PyObject *out = NULL, *idx = NULL, *bitmap = NULL;
    int64_t first = n ? id_at(&v, 0) : -1;
    Py_ssize_t k = 1;
    while (k < n && id_at(&v, k) == first) k++;
    if (k >= n) {
        out = PyLong_FromLongLong(first < 0 ? -1 : first);
        goto done;
    }
    idx = PyBytes_FromStringAndSize(NULL, n * 4);
    if (!idx) goto done;
    int32_t *dst = (int32_t *)PyBytes_AS_STRING(idx);
    Py_ssize_t nulls = 0;
    for (k = 0; k < n; k++) {
        int64_t id = id_at(&v, k);
        if (id >= ((int64_t)1 << 31) - 1) {
            PyErr_SetString(PyExc_ValueError, "arrowipc: a dictionary of 2**31 strings or more");
            goto done;
        }
        nulls += id < 0;
        dst[k] = id < 0 ? 0 : (int32_t)(id + 1);
    }
    if (nulls) {
        bitmap = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
        if (!bitmap) goto done;
        uint8_t *bits = (uint8_t *)PyBytes_AS_STRING(bitmap);
        memset(bits, 0, (size_t)(n + 7) / 8);
        for (k = 0; k < n; k++) bits[k >> 3] |= (uint8_t)((dst[k] != 0) << (k & 7));
    }
    out = Py_BuildValue("(nOO)", nulls, bitmap ? bitmap : Py_None, idx);
done:
    Py_XDECREF(idx);
    Py_XDECREF(bitmap);
    return out;
}

static PyObject *dict_indices(PyObject *self, PyObject *arg) {
    Py_buffer ib;
    Ids v;
    if (PyObject_GetBuffer(arg, &ib, PyBUF_STRIDES | PyBUF_FORMAT) < 0) return NULL;
    PyObject *out = NULL;
    if (ids_of(&ib, &v) == 0) out = dict_indices_of(&v, ib.shape ? ib.shape[0] : ib.len / ib.itemsize);
    PyBuffer_Release(&ib);
    return out;
}

/* table[j] (table[inner[j]] with inner) for j = idx[k] into *out, -1 where j (or inner[j])
   is negative; -1 returned (nothing raised) for an index past its table */
static inline int take_one(const Ids *idx, Py_ssize_t k, const Ids *table, Py_ssize_t ntable,
                           const Ids *inner, Py_ssize_t ninner, int64_t *out) {
    int64_t j = id_at(idx, k);
    if (j >= 0 && inner) {
        if (j >= ninner) return -1;
        j = id_at(inner, (Py_ssize_t)j);
    }
    if (j >= 0) {
        if (j >= ntable) return -1;
        j = id_at(table, (Py_ssize_t)j);
    }
    *out = j < 0 ? -1 : j;
    return 0;
}

/* out[k] = take_one(k) for each row: dict_take's lookup. -1 with an IndexError raised: an
   index past its table. */
static int take_ids(const Ids *idx, Py_ssize_t n, const Ids *table, Py_ssize_t ntable,
                    const Ids *inner, Py_ssize_t ninner, int64_t *out) {
    for (Py_ssize_t k = 0; k < n; k++)
        if (take_one(idx, k, table, ntable, inner, ninner, out + k) < 0) goto past;
    return 0;
past:
    PyErr_SetString(PyExc_IndexError, "dict_take: an index past its table");
    return -1;
}

/* dict_take(table, idx[, inner]) -> dict_indices(ids) for ids[k] = table[j], where j is
   idx[k] (inner[idx[k]] with inner), and -1 where j is negative: an op, site or thread
   column of pprobe.writer in one pass, from a record buffer's field as it is (strided).
   The twin: NumPy's fancy indexing and np.where, then arrowipc.dict_indices. table, idx and
   inner: 1-d int32 or int64 buffers; an index past table or inner is an IndexError. */
static PyObject *dict_take(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "dict_take(table, idx, inner=None)");
        return NULL;
    }
    Py_buffer b[3];
    Ids v[3];
    Py_ssize_t len[3] = {0, 0, 0};
    int got = 0, m = nargs == 3 && args[2] != Py_None ? 3 : 2;
    PyObject *out = NULL;
    int64_t *tmp = NULL;
    for (; got < m; got++) {
        if (PyObject_GetBuffer(args[got], &b[got], PyBUF_STRIDES | PyBUF_FORMAT) < 0) goto done;
        if (ids_of(&b[got], &v[got]) < 0) {
            got++;
            goto done;
        }
        len[got] = b[got].shape ? b[got].shape[0] : b[got].len / b[got].itemsize;
    }
    Py_ssize_t n = len[1];
    tmp = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (!tmp) {
        PyErr_NoMemory();
        goto done;
    }
    if (take_ids(&v[1], n, &v[0], len[0], m == 3 ? &v[2] : NULL, len[2], tmp) == 0) {
        const Ids w = {(const char *)tmp, 8, 1};
        out = dict_indices_of(&w, n);
    }
done:
    PyMem_Free(tmp);
    for (int i = 0; i < got; i++) PyBuffer_Release(&b[i]);
    return out;
}

/* ------------------------------------------------------------------ the writer's fixed columns */
/* record_columns(recs, itemsize, specs, Column, Const) -> [Column, ...]: the columns of a
   batch that come from the record buffer's fixed fields, or that are one value in every row,
   made in one call from a list of specs (pprobe.writer._column_specs): the same Column
   objects (the same bytes once written) as its twin, pprobe.writer._py_record_columns, which
   builds each with pprobe.arrowipc's functions. recs: the records, contiguous, itemsize bytes
   each (at least one). A spec is a tuple, its first item a code:
     (RC_COL, column)                         the column as it is
     (RC_REPEAT, data)                        utf8: the bytes data in every row
     (RC_CONST, width, value)                 int32 (width 4) or int64: value (None: nulls)
     (RC_NULLS, type)                         nulls of an arrowipc type
     (RC_ONE, sid)                            dict<utf8>: string id sid in every row
     (RC_INT, name, off, code, width, add, nullneg)
                                              int32/int64: the field + add; nullneg: null
                                              where the field is negative
     (RC_DIFF, name1, off1, name0, off0)      int64: field1 - field0 (int64 fields)
     (RC_TAKE, name, off, code, table, inner) dict<utf8>: table[field] (table[inner[field]])
     (RC_INDEX, name, off, code)              dict<utf8>: the field's string ids
     (RC_BOOL, name, off, code)               bool: field == 1, null where negative
   A field is at byte offset off of a record, its struct code 'q', 'Q' or 'i'. */
enum { RC_COL, RC_REPEAT, RC_CONST, RC_NULLS, RC_ONE, RC_INT, RC_DIFF, RC_TAKE, RC_INDEX, RC_BOOL };

typedef struct {
    const char *base;
    Py_ssize_t itemsize, n;
    PyObject *column, *constt;
} Recs;

/* The attributes of pprobe.arrowipc's Column and Const (slots) */
static PyObject *s_length, *s_null_count, *s_buffers, *s_child, *s_pattern, *s_size;
static PyObject *s_empty_args;

static int ipc_names(void) {
    if (s_length) return 0;
    if (!(s_null_count = PyUnicode_InternFromString("null_count")) ||
        !(s_buffers = PyUnicode_InternFromString("buffers")) ||
        !(s_child = PyUnicode_InternFromString("child")) ||
        !(s_pattern = PyUnicode_InternFromString("pattern")) ||
        !(s_size = PyUnicode_InternFromString("size")) || !(s_empty_args = PyTuple_New(0)) ||
        !(s_length = PyUnicode_InternFromString("length")))
        return -1;
    return 0;
}

/* cls's instance with its slots names[i] = vals[i] (references taken, NULL: an error raised),
   made without a call of its Python __init__: what __init__ would set, its checks done by the
   caller (a Const's pattern is never empty where its size is not 0) */
static PyObject *rc_new(PyObject *cls, int k, PyObject *const *names, PyObject **vals) {
    PyObject *o = NULL;
    for (int i = 0; i < k; i++)
        if (!vals[i]) goto done;
    PyTypeObject *tp = (PyTypeObject *)cls;
    o = tp->tp_new(tp, s_empty_args, NULL);
    for (int i = 0; o && i < k; i++)
        if (PyObject_SetAttr(o, names[i], vals[i]) < 0) Py_CLEAR(o);
done:
    for (int i = 0; i < k; i++) Py_XDECREF(vals[i]);
    return o;
}

static PyObject *rc_const(const Recs *r, const char *pat, Py_ssize_t len, Py_ssize_t size) {
    PyObject *names[2] = {s_pattern, s_size};
    PyObject *vals[2] = {PyBytes_FromStringAndSize(pat, len), PyLong_FromSsize_t(size)};
    return rc_new(r->constt, 2, names, vals);
}

/* Column(n, k, [b0, b1(, b2)]): takes the buffers' references (NULL: an error raised) */
static PyObject *rc_column(const Recs *r, Py_ssize_t k, int nb, PyObject *b0, PyObject *b1,
                           PyObject *b2) {
    PyObject *b[3] = {b0, b1, b2}, *list = NULL, *out = NULL;
    for (int i = 0; i < nb; i++)
        if (!b[i]) goto done;
    list = PyList_New(nb);
    if (!list) goto done;
    for (int i = 0; i < nb; i++) {
        PyList_SET_ITEM(list, i, b[i]);
        b[i] = NULL;
    }
    PyObject *names[4] = {s_length, s_null_count, s_buffers, s_child};
    PyObject *vals[4] = {PyLong_FromSsize_t(r->n), PyLong_FromSsize_t(k), list, Py_NewRef(Py_None)};
    list = NULL;
    out = rc_new(r->column, 4, names, vals);
done:
    for (int i = 0; i < nb; i++) Py_XDECREF(b[i]);
    Py_XDECREF(list);
    return out;
}

/* arrowipc.nulls */
static PyObject *rc_nulls(const Recs *r, PyObject *tp) {
    Py_ssize_t n = r->n, width = 0;
    int utf8 = 0, boolean = 0;
    if (!PyUnicode_Check(tp)) goto bad;
    if (!PyUnicode_CompareWithASCIIString(tp, "utf8")) utf8 = 1;
    else if (!PyUnicode_CompareWithASCIIString(tp, "bool")) boolean = 1;
    else if (!PyUnicode_CompareWithASCIIString(tp, "int32") ||
             !PyUnicode_CompareWithASCIIString(tp, "dict<utf8>")) width = 4;
    else if (!PyUnicode_CompareWithASCIIString(tp, "int64") ||
             !PyUnicode_CompareWithASCIIString(tp, "float64")) width = 8;
    else goto bad;
    PyObject *bitmap = rc_const(r, "", 1, (n + 7) / 8);
    if (utf8)
        return rc_column(r, n, 3, bitmap, rc_const(r, "", 1, 4 * (n + 1)),
                         PyBytes_FromStringAndSize(NULL, 0));
    if (boolean) return rc_column(r, n, 2, bitmap, Py_XNewRef(bitmap), NULL);
    return rc_column(r, n, 2, bitmap, rc_const(r, "", 1, width * n), NULL);
bad:
    PyErr_SetString(PyExc_TypeError, "record_columns: nulls of an unknown type");
    return NULL;
}

/* arrowipc.one_index */
static PyObject *rc_one(const Recs *r, int64_t sid) {
    if (sid + 1 >= ((int64_t)1 << 31)) {
        PyErr_SetString(PyExc_ValueError, "arrowipc: a dictionary of 2**31 strings or more");
        return NULL;
    }
    if (sid < 0) {
        PyObject *tp = PyUnicode_FromString("int32");
        if (!tp) return NULL;
        PyObject *out = rc_nulls(r, tp);
        Py_DECREF(tp);
        return out;
    }
    int32_t v = (int32_t)(sid + 1);
    char pat[4];
    memcpy(pat, &v, 4);
    return rc_column(r, 0, 2, Py_NewRef(Py_None), rc_const(r, pat, 4, 4 * r->n), NULL);
}

/* a dict<utf8> column from dict_indices_of's answer (arrowipc.dict_indices / dict_take) */
static PyObject *rc_dict(const Recs *r, const Ids *w) {
    PyObject *got = dict_indices_of(w, r->n);
    if (!got) return NULL;
    PyObject *out;
    if (PyLong_Check(got)) {
        long long sid = PyLong_AsLongLong(got);
        out = sid == -1 && PyErr_Occurred() ? NULL : rc_one(r, sid);
    } else {
        Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(got, 0));
        out = k < 0 && PyErr_Occurred()
                  ? NULL
                  : rc_column(r, k, 2, Py_NewRef(PyTuple_GET_ITEM(got, 1)),
                              Py_NewRef(PyTuple_GET_ITEM(got, 2)), NULL);
    }
    Py_DECREF(got);
    return out;
}

/* a field of the records (at byte offset off, struct code 'q', 'Q' or 'i') as strided ids */
static int rc_field_at(const Recs *r, PyObject *offo, char code, Ids *f) {
    Py_ssize_t off = PyLong_AsSsize_t(offo);
    if (off == -1 && PyErr_Occurred()) return -1;
    Py_ssize_t w = code == 'i' ? 4 : (code == 'q' || code == 'Q') ? 8 : 0;
    if (!w || off < 0 || off + w > r->itemsize) {
        PyErr_SetString(PyExc_ValueError, "record_columns: a field outside the record");
        return -1;
    }
    f->buf = r->base + off;
    f->stride = r->itemsize;
    f->wide = w == 8;
    return 0;
}

static int rc_field(const Recs *r, PyObject *offo, PyObject *codeo, Ids *f) {
    const char *c = PyUnicode_Check(codeo) ? PyUnicode_AsUTF8(codeo) : NULL;
    if (!c || !c[0] || c[1]) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "record_columns: a field's code");
        return -1;
    }
    return rc_field_at(r, offo, c[0], f);
}

/* the validity bitmap (bytes) of the rows where pred holds, or NULL when it holds in all;
   *nulls: the rows where it does not */
static int rc_valid(const Recs *r, const Ids *f, PyObject **bitmap, Py_ssize_t *nulls) {
    Py_ssize_t n = r->n, k = 0;
    *bitmap = NULL;
    for (Py_ssize_t i = 0; i < n; i++) k += id_at(f, i) < 0;
    *nulls = k;
    if (!k) return 0;
    *bitmap = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
    if (!*bitmap) return -1;
    uint8_t *bits = (uint8_t *)PyBytes_AS_STRING(*bitmap);
    memset(bits, 0, (size_t)(n + 7) / 8);
    for (Py_ssize_t i = 0; i < n; i++) bits[i >> 3] |= (uint8_t)((id_at(f, i) >= 0) << (i & 7));
    return 0;
}

static PyObject *rc_nulls_of(const Recs *r, const char *tp) {
    PyObject *t = PyUnicode_FromString(tp);
    if (!t) return NULL;
    PyObject *out = rc_nulls(r, t);
    Py_DECREF(t);
    return out;
}

/* A dict<utf8> column from its int32 indices (idx, bytes: the string id + 1 a row, 0 for a
   null), made in a caller's pass that also noted whether every row has the first row's id
   and how many are null: rc_dict of dict_indices_of's answer, without a pass of its own. Takes
   idx's reference. */
static PyObject *dict_column_of(const Recs *r, PyObject *idx, int same, int64_t first,
                                Py_ssize_t nulls) {
    if (same) { /* one id in every row (or no row): one value, or nulls */
        Py_DECREF(idx);
        return rc_one(r, r->n && first >= 0 ? first : -1);
    }
    PyObject *bitmap = NULL;
    Py_ssize_t n = r->n;
    if (nulls) {
        bitmap = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
        if (!bitmap) {
            Py_DECREF(idx);
            return NULL;
        }
        const int32_t *dst = (const int32_t *)PyBytes_AS_STRING(idx);
        uint8_t *bits = (uint8_t *)PyBytes_AS_STRING(bitmap);
        memset(bits, 0, (size_t)(n + 7) / 8);
        for (Py_ssize_t k = 0; k < n; k++) bits[k >> 3] |= (uint8_t)((dst[k] != 0) << (k & 7));
    }
    return rc_column(r, nulls, 2, bitmap ? bitmap : Py_NewRef(Py_None), idx, NULL);
}

/* record_columns' RC_TAKE: rc_dict of take_ids' ids (the table's entry of the field's index,
   through inner when given), in one pass: each row's dictionary index is made as its id is
   looked up, with no column of ids between (take_ids' IndexError first, then
   dict_indices_of's ValueError, as those two passes raise them). */
static PyObject *rc_take_dict(const Recs *r, const Ids *f, const Ids *table, Py_ssize_t ntable,
                              const Ids *inner, Py_ssize_t ninner) {
    const Py_ssize_t n = r->n;
    PyObject *idx = PyBytes_FromStringAndSize(NULL, n * 4);
    if (!idx) return NULL;
    int32_t *dst = (int32_t *)PyBytes_AS_STRING(idx);
    int64_t first = -1;
    int diff = 0, big = 0;
    Py_ssize_t nulls = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t j;
        if (take_one(f, k, table, ntable, inner, ninner, &j) < 0) goto past;
        if (k == 0) first = j;
        diff |= j != first;
        big |= j >= ((int64_t)1 << 31) - 1;
        nulls += j < 0;
        dst[k] = j < 0 ? 0 : (int32_t)(j + 1);
    }
    if (big) { /* (rc_one raises the same for one such id in every row) */
        Py_DECREF(idx);
        PyErr_SetString(PyExc_ValueError, "arrowipc: a dictionary of 2**31 strings or more");
        return NULL;
    }
    return dict_column_of(r, idx, !diff, first, nulls);
past:
    Py_DECREF(idx);
    PyErr_SetString(PyExc_IndexError, "dict_take: an index past its table");
    return NULL;
}

/* arrowipc.bools(f == 1, f >= 0): record_columns' RC_BOOL, desc_log_columns' grad */
static PyObject *rc_bool(const Recs *r, const Ids *f) {
    Py_ssize_t n = r->n, k = 0;
    PyObject *bitmap = NULL;
    if (rc_valid(r, f, &bitmap, &k) < 0) return NULL;
    if (k == n && n) {
        Py_XDECREF(bitmap);
        return rc_nulls_of(r, "bool");
    }
    PyObject *data = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
    if (data) {
        uint8_t *bits = (uint8_t *)PyBytes_AS_STRING(data);
        memset(bits, 0, (size_t)(n + 7) / 8);
        for (Py_ssize_t i = 0; i < n; i++) bits[i >> 3] |= (uint8_t)((id_at(f, i) == 1) << (i & 7));
    }
    return rc_column(r, k, 2, bitmap ? bitmap : Py_NewRef(Py_None), data, NULL);
}

static PyObject *rc_bad(void) {
    PyErr_SetString(PyExc_ValueError, "record_columns: a malformed spec");
    return NULL;
}

static PyObject *rc_spec(const Recs *r, PyObject *spec) {
    static const Py_ssize_t want[] = {2, 2, 3, 2, 2, 7, 5, 6, 4, 4};
    Py_ssize_t n = r->n;
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 1) return rc_bad();
    long code = PyLong_AsLong(PyTuple_GET_ITEM(spec, 0));
    if (code == -1 && PyErr_Occurred()) return NULL;
    if (code < 0 || code > RC_BOOL || PyTuple_GET_SIZE(spec) != want[code]) return rc_bad();
#define A_(i) PyTuple_GET_ITEM(spec, i)
    Ids f, g;
    switch (code) {
    case RC_COL:
        return Py_NewRef(A_(1));
    case RC_REPEAT: { /* arrowipc.repeat_bytes */
        if (!PyBytes_Check(A_(1))) return rc_bad();
        Py_ssize_t m = PyBytes_GET_SIZE(A_(1));
        if ((int64_t)m * n >= ((int64_t)1 << 31)) {
            PyErr_SetString(PyExc_ValueError,
                            "arrowipc: a string column of 2 GiB or more in one batch");
            return NULL;
        }
        PyObject *offs = PyBytes_FromStringAndSize(NULL, (n + 1) * 4);
        if (offs) {
            int32_t *o = (int32_t *)PyBytes_AS_STRING(offs);
            for (Py_ssize_t i = 0; i <= n; i++) o[i] = (int32_t)(i * m);
        }
        PyObject *names[2] = {s_pattern, s_size};
        PyObject *vals[2] = {Py_NewRef(A_(1)), PyLong_FromSsize_t(m * n)};
        return rc_column(r, 0, 3, Py_NewRef(Py_None), offs, rc_new(r->constt, 2, names, vals));
    }
    case RC_CONST: { /* arrowipc.const_ints */
        long w = PyLong_AsLong(A_(1));
        if (w == -1 && PyErr_Occurred()) return NULL;
        if (w != 4 && w != 8) return rc_bad();
        if (A_(2) == Py_None) return rc_nulls_of(r, w == 4 ? "int32" : "int64");
        long long v = PyLong_AsLongLong(A_(2));
        if (v == -1 && PyErr_Occurred()) return NULL;
        char pat[8];
        if (w == 4) {
            if (v < INT32_MIN || v > INT32_MAX) {
                PyErr_SetString(PyExc_OverflowError, "record_columns: an int32 out of range");
                return NULL;
            }
            int32_t x = (int32_t)v;
            memcpy(pat, &x, 4);
        } else {
            int64_t x = (int64_t)v;
            memcpy(pat, &x, 8);
        }
        return rc_column(r, 0, 2, Py_NewRef(Py_None), rc_const(r, pat, w, w * n), NULL);
    }
    case RC_NULLS:
        return rc_nulls(r, A_(1));
    case RC_ONE: {
        long long sid = PyLong_AsLongLong(A_(1));
        if (sid == -1 && PyErr_Occurred()) return NULL;
        return rc_one(r, sid);
    }
    case RC_INT: { /* arrowipc.ints of the field + add (valid: the field >= 0) */
        if (rc_field(r, A_(2), A_(3), &f) < 0) return NULL;
        long w = PyLong_AsLong(A_(4));
        if (w == -1 && PyErr_Occurred()) return NULL;
        long long add = PyLong_AsLongLong(A_(5));
        if (add == -1 && PyErr_Occurred()) return NULL;
        int nullneg = PyObject_IsTrue(A_(6));
        if (nullneg < 0) return NULL;
        if (w != 4 && w != 8) return rc_bad();
        PyObject *bitmap = NULL;
        Py_ssize_t k = 0;
        if (nullneg && rc_valid(r, &f, &bitmap, &k) < 0) return NULL;
        if (k == n && n) {
            Py_XDECREF(bitmap);
            return rc_nulls_of(r, w == 4 ? "int32" : "int64");
        }
        PyObject *data = PyBytes_FromStringAndSize(NULL, n * w);
        if (data) {
            char *d = PyBytes_AS_STRING(data);
            for (Py_ssize_t i = 0; i < n; i++) {
                int64_t v = (int64_t)((uint64_t)id_at(&f, i) + (uint64_t)add);
                if (w == 4) {
                    int32_t x = (int32_t)v;
                    memcpy(d + 4 * i, &x, 4);
                } else {
                    memcpy(d + 8 * i, &v, 8);
                }
            }
        }
        return rc_column(r, k, 2, bitmap ? bitmap : Py_NewRef(Py_None), data, NULL);
    }
    case RC_DIFF: { /* arrowipc.ints of field1 - field0 */
        if (rc_field_at(r, A_(2), 'q', &f) < 0 || rc_field_at(r, A_(4), 'q', &g) < 0)
            return NULL;
        PyObject *data = PyBytes_FromStringAndSize(NULL, n * 8);
        if (data) {
            char *d = PyBytes_AS_STRING(data);
            for (Py_ssize_t i = 0; i < n; i++) {
                int64_t v = (int64_t)((uint64_t)id_at(&f, i) - (uint64_t)id_at(&g, i));
                memcpy(d + 8 * i, &v, 8);
            }
        }
        return rc_column(r, 0, 2, Py_NewRef(Py_None), data, NULL);
    }
    case RC_TAKE: { /* arrowipc.dict_take of the field */
        if (rc_field(r, A_(2), A_(3), &f) < 0) return NULL;
        Py_buffer b[2];
        Ids v[2];
        Py_ssize_t len[2] = {0, 0};
        int got = 0, m = A_(5) == Py_None ? 1 : 2;
        PyObject *out = NULL;
        for (; got < m; got++) {
            if (PyObject_GetBuffer(A_(4 + got), &b[got], PyBUF_STRIDES | PyBUF_FORMAT) < 0)
                goto take_done;
            if (ids_of(&b[got], &v[got]) < 0) {
                got++;
                goto take_done;
            }
            len[got] = b[got].shape ? b[got].shape[0] : b[got].len / b[got].itemsize;
        }
        out = rc_take_dict(r, &f, &v[0], len[0], m == 2 ? &v[1] : NULL, len[1]);
    take_done:
        for (int i = 0; i < got; i++) PyBuffer_Release(&b[i]);
        return out;
    }
    case RC_INDEX: { /* arrowipc.dict_indices of the field */
        if (rc_field(r, A_(2), A_(3), &f) < 0) return NULL;
        return rc_dict(r, &f);
    }
    case RC_BOOL: /* arrowipc.bools(field == 1, field >= 0) */
        if (rc_field(r, A_(2), A_(3), &f) < 0) return NULL;
        return rc_bool(r, &f);
    }
#undef A_
    return rc_bad();
}

/* The record buffer (recs, C-contiguous, whole records of itemsize bytes) as Recs (its
   column and constt unset), for record_columns, desc_log_columns, field_ranges and
   missing_ids. 0, or -1 with an exception set and rb released. */
static int recs_open(PyObject *recs, PyObject *sizeo, Py_buffer *rb, Recs *r) {
    Py_ssize_t itemsize = PyLong_AsSsize_t(sizeo);
    if (itemsize == -1 && PyErr_Occurred()) return -1;
    if (itemsize <= 0) {
        PyErr_SetString(PyExc_ValueError, "records: itemsize must be positive");
        return -1;
    }
    if (PyObject_GetBuffer(recs, rb, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (rb->len % itemsize) {
        PyBuffer_Release(rb);
        PyErr_SetString(PyExc_ValueError, "records: not a whole number of records");
        return -1;
    }
    r->base = (const char *)rb->buf;
    r->itemsize = itemsize;
    r->n = rb->len / itemsize;
    r->column = r->constt = NULL;
    return 0;
}

/* recs_open for record_columns and desc_log_columns: args[0] the records, args[1] their
   size, args[3] and args[4] the Column and Const classes (instances made with their tp_new). */
static int recs_columns_open(PyObject *const *args, Py_buffer *rb, Recs *r) {
    if (!PyType_Check(args[3]) || !PyType_Check(args[4]) ||
        !((PyTypeObject *)args[3])->tp_new || !((PyTypeObject *)args[4])->tp_new) {
        PyErr_SetString(PyExc_TypeError, "records: Column and Const must be classes");
        return -1;
    }
    if (ipc_names() < 0 || recs_open(args[0], args[1], rb, r) < 0) return -1;
    r->column = args[3];
    r->constt = args[4];
    return 0;
}

static PyObject *record_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "record_columns(recs, itemsize, specs: list, Column, Const)");
        return NULL;
    }
    Py_buffer rb;
    Recs r;
    if (recs_columns_open(args, &rb, &r) < 0) return NULL;
    PyObject *out = NULL;
    Py_ssize_t m = PyList_GET_SIZE(args[2]);
    out = PyList_New(m);
    if (!out) goto done;
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *c = rc_spec(&r, PyList_GET_ITEM(args[2], i));
        if (!c) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, c);
    }
done:
    PyBuffer_Release(&rb);
    return out;
}

/* field_ranges(recs, itemsize, fields) -> [(min, max), ...] or None: the least and the
   greatest value of each (offset, struct code) field ('q', 'Q' or 'i', as record_columns')
   over the records, in one pass each; None for no record. The writer's checks of a batch
   (one thread? statistics, dumps or notes in it?) without a NumPy call, each of which costs
   the writer's cold flush far more than its work. The twin: NumPy's min and max of the
   structured array's field. */
static PyObject *field_ranges(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "field_ranges(recs, itemsize, fields: tuple)");
        return NULL;
    }
    Py_buffer rb;
    Recs r;
    if (recs_open(args[0], args[1], &rb, &r) < 0) return NULL;
    PyObject *out = NULL;
    Py_ssize_t m = PyTuple_GET_SIZE(args[2]);
    if (!r.n) {
        for (Py_ssize_t i = 0; i < m; i++) /* the fields are checked all the same */
            if (!PyTuple_Check(PyTuple_GET_ITEM(args[2], i))) goto bad;
        out = Py_NewRef(Py_None);
        goto done;
    }
    out = PyList_New(m);
    if (!out) goto done;
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *f = PyTuple_GET_ITEM(args[2], i);
        Ids v;
        if (!PyTuple_Check(f) || PyTuple_GET_SIZE(f) != 2) {
            Py_CLEAR(out);
            goto bad;
        }
        if (rc_field(&r, PyTuple_GET_ITEM(f, 0), PyTuple_GET_ITEM(f, 1), &v) < 0) {
            Py_CLEAR(out);
            goto done;
        }
        int64_t lo = id_at(&v, 0), hi = lo;
        for (Py_ssize_t k = 1; k < r.n; k++) {
            int64_t x = id_at(&v, k);
            lo = x < lo ? x : lo;
            hi = x > hi ? x : hi;
        }
        PyObject *t = Py_BuildValue("(LL)", (long long)lo, (long long)hi);
        if (!t) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, t);
    }
    goto done;
bad:
    PyErr_SetString(PyExc_TypeError, "field_ranges: each field is an (offset, code) tuple");
done:
    PyBuffer_Release(&rb);
    return out;
}

/* missing_ids(recs, itemsize, offset, code, table, marker) -> [j, ...]: the distinct values
   j >= 0 of the field whose table[j] is marker, ascending (an IndexError for a j past the
   table): the ops of a batch the writer has not named yet (pprobe.writer._op_table), in one
   pass. The twin: NumPy's fancy indexing of the table by the field. */
static PyObject *missing_ids(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "missing_ids(recs, itemsize, offset, code, table, marker)");
        return NULL;
    }
    long long marker = PyLong_AsLongLong(args[5]);
    if (marker == -1 && PyErr_Occurred()) return NULL;
    Py_buffer rb, tb;
    Recs r;
    if (recs_open(args[0], args[1], &rb, &r) < 0) return NULL;
    PyObject *out = NULL;
    uint8_t *seen = NULL;
    Ids f, t;
    if (rc_field(&r, args[2], args[3], &f) < 0) {
        PyBuffer_Release(&rb);
        return NULL;
    }
    if (PyObject_GetBuffer(args[4], &tb, PyBUF_STRIDES | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&rb);
        return NULL;
    }
    if (ids_of(&tb, &t) < 0) goto done;
    Py_ssize_t nt = tb.shape ? tb.shape[0] : tb.len / tb.itemsize;
    seen = PyMem_Calloc((size_t)(nt ? nt : 1), 1);
    if (!seen) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t found = 0;
    for (Py_ssize_t k = 0; k < r.n; k++) {
        int64_t j = id_at(&f, k);
        if (j < 0) continue;
        if (j >= nt) {
            PyErr_SetString(PyExc_IndexError, "missing_ids: an index past its table");
            goto done;
        }
        if (!seen[j] && id_at(&t, (Py_ssize_t)j) == marker) {
            seen[j] = 1;
            found++;
        }
    }
    out = PyList_New(found);
    if (!out) goto done;
    for (Py_ssize_t j = 0, i = 0; i < found; j++) {
        if (!seen[j]) continue;
        PyObject *x = PyLong_FromSsize_t(j);
        if (!x) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i++, x);
    }
done:
    PyMem_Free(seen);
    PyBuffer_Release(&tb);
    PyBuffer_Release(&rb);
    return out;
}

/* arg_column(refs, objs, cache) -> the args column of pprobe.writer._args: (null count,
   validity bitmap or None, int32 offsets, UTF-8 data) as bytes, where row k is the text
   cache holds for the set objs[refs[k]] (null where refs[k] is negative); or, where some
   sets have no text there yet, the list of those sets (each once, by identity) for the
   writer to make and add, before it calls again. cache maps id(set) to (set, text bytes),
   (the core shares one tuple between the rows whose args are the same).
   refs: a 1-d int32 or int64 buffer, any stride (the record buffer's field). Its twin: the
   writer's arg_texts and utf8_column path. */
static PyObject *arg_column(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_Check(args[1]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "arg_column(refs, objs: list, cache: dict)");
        return NULL;
    }
    PyObject *objs = args[1], *cache = args[2];
    Py_buffer ib;
    Ids v;
    if (PyObject_GetBuffer(args[0], &ib, PyBUF_STRIDES | PyBUF_FORMAT) < 0) return NULL;
    PyObject *out = NULL, *offsets = NULL, *bitmap = NULL, *data = NULL, *misses = NULL;
    PyObject **texts = NULL; /* (borrowed: the cache holds them) */
    Map2 seen = {0}; /* set -> a: 2 its text in b (borrowed), 1 listed in misses */
    if (ids_of(&ib, &v) < 0) goto done;
    Py_ssize_t n = ib.shape ? ib.shape[0] : ib.len / ib.itemsize;
    Py_ssize_t nobjs = PyList_GET_SIZE(objs), nulls = 0;
    texts = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(PyObject *));
    offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * 4);
    if (!texts || !offsets) {
        if (!texts) PyErr_NoMemory();
        goto done;
    }
    int32_t *off = (int32_t *)PyBytes_AS_STRING(offsets);
    int64_t total = 0;
    PyObject *prev = NULL, *prev_text = NULL;
    off[0] = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t r = id_at(&v, k);
        PyObject *text = NULL;
        if (r < 0) {
            nulls++;
        } else if (r >= nobjs) {
            PyErr_SetString(PyExc_IndexError, "arg_column: a reference past objs");
            goto done;
        } else {
            PyObject *p = PyList_GET_ITEM(objs, (Py_ssize_t)r);
            if (p == prev) {
                text = prev_text;
            } else {
                Slot2 *s2 = map2_put(&seen, p, 0); /* (objs holds p meanwhile) */
                if (!s2) {
                    PyErr_NoMemory();
                    goto done;
                }
                if (!s2->a) { /* the set's first row in this call: the cache, once */
                    PyObject *key = PyLong_FromVoidPtr(p);
                    if (!key) goto done;
                    PyObject *e = PyDict_GetItemWithError(cache, key); /* borrowed */
                    Py_DECREF(key);
                    if (e && PyTuple_CheckExact(e) && PyTuple_GET_SIZE(e) == 2 &&
                        PyTuple_GET_ITEM(e, 0) == p && PyBytes_Check(PyTuple_GET_ITEM(e, 1))) {
                        s2->a = 2;
                        s2->b = (intptr_t)PyTuple_GET_ITEM(e, 1);
                    } else if (PyErr_Occurred()) {
                        goto done;
                    } else { /* met for the first time */
                        s2->a = 1;
                        if (!misses && !(misses = PyList_New(0))) goto done;
                        if (PyList_Append(misses, p) < 0) goto done;
                    }
                }
                text = s2->a == 2 ? (PyObject *)s2->b : NULL;
                prev = p;
                prev_text = text;
            }
            if (text) {
                total += PyBytes_GET_SIZE(text);
                if (total >= ((int64_t)1 << 31)) {
                    PyErr_SetString(PyExc_ValueError,
                                    "a string column of 2 GiB or more in one batch");
                    goto done;
                }
            }
        }
        texts[k] = text;
        off[k + 1] = (int32_t)total;
    }
    if (misses) {
        out = Py_NewRef(misses);
        goto done;
    }
    data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (!data) goto done;
    char *dst = PyBytes_AS_STRING(data);
    for (Py_ssize_t k = 0; k < n; k++)
        if (texts[k])
            memcpy(dst + off[k], PyBytes_AS_STRING(texts[k]), (size_t)(off[k + 1] - off[k]));
    if (nulls) {
        bitmap = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
        if (!bitmap) goto done;
        uint8_t *bits = (uint8_t *)PyBytes_AS_STRING(bitmap);
        memset(bits, 0, (size_t)(n + 7) / 8);
        for (Py_ssize_t k = 0; k < n; k++) bits[k >> 3] |= (uint8_t)((id_at(&v, k) >= 0) << (k & 7));
    }
    out = Py_BuildValue("(nOOO)", nulls, bitmap ? bitmap : Py_None, offsets, data);
done:
    PyBuffer_Release(&ib);
    PyMem_Free(texts);
    map2_clear(&seen, 0);
    Py_XDECREF(misses);
    Py_XDECREF(offsets);
    Py_XDECREF(bitmap);
    Py_XDECREF(data);
    return out;
}

/* One value's text as values.format_value writes it, where that is its repr (None, bool,
   float; an int of at most 40 characters, a str of at most 60) or a Text (itself); NULL
   (no exception set) for anything else: the Python twin formats the set. */
static PyObject *arg_value_text(PyObject *v, PyObject *text_type) {
    if (PyObject_TypeCheck(v, (PyTypeObject *)text_type)) return PyObject_Str(v);
    PyTypeObject *c = Py_TYPE(v);
    int is_int = c == &PyLong_Type, is_str = c == &PyUnicode_Type;
    if (!(v == Py_None || c == &PyBool_Type || c == &PyFloat_Type || is_int || is_str)) return NULL;
    PyObject *r = PyObject_Repr(v);
    if (!r) {
        PyErr_Clear(); /* (an int past sys.get_int_max_str_digits(): the twin's reprlib text) */
        return NULL;
    }
    if (is_int || is_str) {
        Py_ssize_t len = PyUnicode_GET_LENGTH(r);
        if (len == 0 || len > (is_int ? 40 : 60)) {
            Py_DECREF(r);
            return NULL;
        }
    }
    return r;
}

/* One pair's text (values.arg_text), or NULL (no exception set) where the twin makes it */
static PyObject *arg_pair_text(PyObject *pair, PyObject *text_type) {
    if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) return NULL;
    PyObject *idx = PyTuple_GET_ITEM(pair, 0), *v = PyTuple_GET_ITEM(pair, 1);
    if (idx != Py_None) {
        if (!PyUnicode_CheckExact(idx)) return NULL;
        PyObject *t = arg_value_text(v, text_type);
        if (!t) return NULL;
        PyObject *out = PyUnicode_FromFormat("%U=%U", idx, t);
        Py_DECREF(t);
        if (!out) PyErr_Clear();
        return out;
    }
    if (PyUnicode_CheckExact(v)) return Py_NewRef(v); /* a text made during the call */
    /* (name, packed): a shape of native int64s, written as repr(tuple) cut at 80 */
    if (!PyTuple_CheckExact(v) || PyTuple_GET_SIZE(v) != 2) return NULL;
    PyObject *name = PyTuple_GET_ITEM(v, 0), *packed = PyTuple_GET_ITEM(v, 1);
    if (!PyUnicode_CheckExact(name) || !PyBytes_CheckExact(packed) ||
        PyBytes_GET_SIZE(packed) % 8 || PyBytes_GET_SIZE(packed) > 8 * 64)
        return NULL;
    Py_ssize_t nd = PyBytes_GET_SIZE(packed) / 8;
    PyObject *tup = PyTuple_New(nd), *r = NULL, *out = NULL;
    if (!tup) goto fail;
    for (Py_ssize_t i = 0; i < nd; i++) {
        int64_t d;
        memcpy(&d, PyBytes_AS_STRING(packed) + 8 * i, 8);
        PyObject *o = PyLong_FromLongLong(d);
        if (!o) goto fail;
        PyTuple_SET_ITEM(tup, i, o);
    }
    r = PyObject_Repr(tup);
    if (!r) goto fail;
    if (PyUnicode_GET_LENGTH(r) > 80) {
        PyObject *cut = PyUnicode_Substring(r, 0, 77);
        Py_SETREF(r, cut ? PyUnicode_FromFormat("%U...", cut) : NULL);
        Py_XDECREF(cut);
        if (!r) goto fail;
    }
    out = PyUnicode_FromFormat("%U=%U", name, r);
    if (!out) goto fail;
    Py_DECREF(tup);
    Py_DECREF(r);
    return out;
fail:
    PyErr_Clear();
    Py_XDECREF(tup);
    Py_XDECREF(r);
    return NULL;
}

/* arg_texts(sets, Text) -> for each set of (name, value) pairs its args text, UTF-8 with
   errors replaced (writer._arg_bytes), or None where a value needs the Python twin (reprlib:
   a long int or str, another type). The common values (None, bools, floats, short ints and
   strs, texts and shapes made during the call) are written here, with no Python frame. */
static PyObject *arg_texts(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0]) || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "arg_texts(sets: list, Text: type)");
        return NULL;
    }
    PyObject *sets = args[0], *text_type = args[1];
    Py_ssize_t n = PyList_GET_SIZE(sets);
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *set = PyList_GET_ITEM(sets, i), *joined = NULL, *got = NULL;
        PyObject *parts = PyTuple_CheckExact(set) ? PyList_New(PyTuple_GET_SIZE(set)) : NULL;
        if (parts) {
            Py_ssize_t k = 0;
            for (; k < PyTuple_GET_SIZE(set); k++) {
                PyObject *t = arg_pair_text(PyTuple_GET_ITEM(set, k), text_type);
                if (!t) break;
                PyList_SET_ITEM(parts, k, t);
            }
            if (k == PyTuple_GET_SIZE(set)) {
                PyObject *sep = PyUnicode_FromString(", ");
                joined = sep ? PyUnicode_Join(sep, parts) : NULL;
                Py_XDECREF(sep);
                got = joined ? PyUnicode_AsEncodedString(joined, "utf-8", "replace") : NULL;
            }
            Py_DECREF(parts); /* (the items not set are NULL: list_dealloc skips them) */
        }
        Py_XDECREF(joined);
        if (!got) {
            if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception)) {
                Py_DECREF(out);
                return NULL; /* (not an Exception: passed on) */
            }
            PyErr_Clear();
            got = Py_NewRef(Py_None);
        }
        PyList_SET_ITEM(out, i, got);
    }
    return out;
}

/* arg_keys(sets) -> the writer's cache keys for the args column (pprobe.writer._args): for
   each set of (name, value) pairs, (set, k_1, ..., k_n) where k_i is the bits of value i
   when it is a float and its type otherwise. Equal sets can have different texts (1.0 ==
   True, 1000 == 1000.0, 0.0 == -0.0): the keys tell them apart. The Python twin is
   writer._arg_key. */
static PyObject *arg_keys(PyObject *self, PyObject *sets) {
    if (!PyList_Check(sets)) {
        PyErr_SetString(PyExc_TypeError, "arg_keys(sets: list)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(sets);
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyList_GET_ITEM(sets, i);
        Py_ssize_t k = PyTuple_Check(p) ? PyTuple_GET_SIZE(p) : 0;
        PyObject *key = PyTuple_New(k + 1);
        if (!key) goto fail;
        PyTuple_SET_ITEM(key, 0, Py_NewRef(p));
        for (Py_ssize_t j = 0; j < k; j++) {
            PyObject *pair = PyTuple_GET_ITEM(p, j);
            PyObject *v = PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2
                              ? PyTuple_GET_ITEM(pair, 1)
                              : pair;
            PyObject *item;
            if (PyFloat_CheckExact(v)) {
                double d = PyFloat_AS_DOUBLE(v);
                long long bits;
                memcpy(&bits, &d, sizeof bits);
                item = PyLong_FromLongLong(bits);
                if (!item) {
                    Py_DECREF(key);
                    goto fail;
                }
            } else {
                item = Py_NewRef((PyObject *)Py_TYPE(v));
            }
            PyTuple_SET_ITEM(key, j + 1, item);
        }
        PyList_SET_ITEM(out, i, key);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* shape_lists(records, size, ndim_at, dims_at) -> (offsets, values) or None: the shape
   column (list<int64>) of desc records whose shapes are all inline (pprobe.writer._shapes):
   records of size bytes, each with an int32 ndim at ndim_at and MAX_INLINE_DIMS int64
   dimensions from dims_at; offsets are int32 (one more than the records), values each
   record's first ndim dimensions. None where a record's ndim is not within 0 and
   MAX_INLINE_DIMS (a deep shape: the writer's NumPy path). Its twin: NumPy's mask of the
   (records, MAX_INLINE_DIMS) view. */
static PyObject *shape_lists(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t at[3];
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "shape_lists(records, size, ndim_at, dims_at)");
        return NULL;
    }
    for (int i = 0; i < 3; i++) {
        at[i] = PyLong_AsSsize_t(args[i + 1]);
        if (at[i] == -1 && PyErr_Occurred()) return NULL;
    }
    Py_ssize_t size = at[0], ndim_at = at[1], dims_at = at[2];
    if (size <= 0 || ndim_at < 0 || ndim_at + 4 > size || dims_at < 0 ||
        dims_at + 8 * MAX_INLINE_DIMS > size) {
        PyErr_SetString(PyExc_ValueError, "shape_lists: fields outside the record");
        return NULL;
    }
    Py_buffer b;
    if (PyObject_GetBuffer(args[0], &b, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t n = b.len / size;
    const char *recs = (const char *)b.buf;
    PyObject *offsets = NULL, *values = NULL, *out = NULL;
    int64_t total = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        int32_t nd;
        memcpy(&nd, recs + k * size + ndim_at, 4);
        if (nd < 0 || nd > MAX_INLINE_DIMS) {
            out = Py_NewRef(Py_None);
            goto done;
        }
        total += nd;
    }
    if (total >= ((int64_t)1 << 31)) {
        PyErr_SetString(PyExc_ValueError, "a shape column of 2**31 values or more in one batch");
        goto done;
    }
    offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * 4);
    values = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total * 8);
    if (!offsets || !values) goto done;
    int32_t *off = (int32_t *)PyBytes_AS_STRING(offsets);
    char *v = PyBytes_AS_STRING(values);
    int32_t pos = 0;
    off[0] = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        const char *r = recs + k * size;
        int32_t nd;
        memcpy(&nd, r + ndim_at, 4);
        memcpy(v + 8 * (size_t)pos, r + dims_at, 8 * (size_t)nd);
        pos += nd;
        off[k + 1] = pos;
    }
    out = PyTuple_Pack(2, offsets, values);
done:
    PyBuffer_Release(&b);
    Py_XDECREF(offsets);
    Py_XDECREF(values);
    return out;
}

/* desc_log_columns(descs, size, at, Column, Const) -> (seq, role, idx, (shape offsets,
   shape values), dtype, device, grad, (max stats, max path, max note)) or None: the tensors
   batch's columns that come from the desc records (record_columns' RC_INT seq, RC_INDEX role,
   idx, dtype and device, RC_BOOL grad; shape_lists' shapes) and the greatest stats, path and
   note fields (field_ranges'), in one pass over the records instead of one per field: a
   flush's records are read from memory the recording thread wrote (cold here), and a desc
   record is 160 bytes, so each pass cost ~2-3 cache lines a record. The same columns as
   those calls (tests/test_ipc_writer.py compares them). None where a record's ndim is not
   within 0 and MAX_INLINE_DIMS (a deep shape: the writer's general path). at: the byte
   offsets of (seq, role, idx, ndim, d0, dtype, device, grad, stats, path, note): seq an
   int64, d0 the first of MAX_INLINE_DIMS int64s, the others int32. */
enum { DL_SEQ, DL_ROLE, DL_IDX, DL_NDIM, DL_D0, DL_DTYPE, DL_DEVICE, DL_GRAD, DL_STATS, DL_PATH,
       DL_NOTE, DL_N };

static PyObject *desc_log_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyTuple_Check(args[2]) || PyTuple_GET_SIZE(args[2]) != DL_N) {
        PyErr_SetString(PyExc_TypeError,
                        "desc_log_columns(descs, size, at: 11 offsets, Column, Const)");
        return NULL;
    }
    Py_buffer rb;
    Recs r;
    if (recs_columns_open(args, &rb, &r) < 0) return NULL;
    Py_ssize_t at[DL_N];
    for (int j = 0; j < DL_N; j++) {
        at[j] = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[2], j));
        if (at[j] == -1 && PyErr_Occurred()) {
            PyBuffer_Release(&rb);
            return NULL;
        }
        Py_ssize_t w = j == DL_SEQ ? 8 : j == DL_D0 ? 8 * MAX_INLINE_DIMS : 4;
        if (at[j] < 0 || at[j] + w > r.itemsize) {
            PyBuffer_Release(&rb);
            PyErr_SetString(PyExc_ValueError, "desc_log_columns: a field outside the record");
            return NULL;
        }
    }
    const Py_ssize_t n = r.n;
    PyObject *out = NULL, *seq = NULL, *offsets = NULL, *values = NULL;
    PyObject *cols[4] = {NULL, NULL, NULL, NULL}, *grad = NULL, *gvalid = NULL, *gdata = NULL;
    /* role, idx, dtype, device: record_columns' RC_INDEX, made in the pass */
    static const int dict_at[4] = {DL_ROLE, DL_IDX, DL_DTYPE, DL_DEVICE};
    PyObject *idx[4] = {NULL, NULL, NULL, NULL}; /* their int32 indices */
    int32_t *dst[4], first[4] = {-1, -1, -1, -1};
    int64_t *dims = PyMem_Malloc((size_t)(n ? n : 1) * MAX_INLINE_DIMS * sizeof(int64_t));
    seq = PyBytes_FromStringAndSize(NULL, n * 8);
    offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * 4);
    /* grad: record_columns' RC_BOOL (value: the field is 1; valid: it is 0 or more) */
    gdata = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
    gvalid = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
    if (!dims) PyErr_NoMemory();
    if (!dims || !seq || !offsets || !gdata || !gvalid) goto done;
    for (int j = 0; j < 4; j++) {
        if (!(idx[j] = PyBytes_FromStringAndSize(NULL, n * 4))) goto done;
        dst[j] = (int32_t *)PyBytes_AS_STRING(idx[j]);
        if (n) memcpy(&first[j], r.base + at[dict_at[j]], 4);
    }
    int32_t *off = (int32_t *)PyBytes_AS_STRING(offsets);
    char *sq = PyBytes_AS_STRING(seq);
    uint8_t *gbits = (uint8_t *)PyBytes_AS_STRING(gdata);
    uint8_t *gok = (uint8_t *)PyBytes_AS_STRING(gvalid);
    /* the loop keeps its state in locals: stores through the int32 outputs could alias
       arrays of int32 (first[]), which would send each update through memory; grad's bits
       are whole bytes, each written once (the last one after the loop) */
    int32_t *dst0 = dst[0], *dst1 = dst[1], *dst2 = dst[2], *dst3 = dst[3];
    const int32_t f0 = first[0], f1 = first[1], f2 = first[2], f3 = first[3];
    const Py_ssize_t a0 = at[DL_ROLE], a1 = at[DL_IDX], a2 = at[DL_DTYPE], a3 = at[DL_DEVICE];
    const Py_ssize_t a_nd = at[DL_NDIM], a_seq = at[DL_SEQ], a_d0 = at[DL_D0];
    const Py_ssize_t a_g = at[DL_GRAD], a_st = at[DL_STATS], a_pa = at[DL_PATH],
                     a_no = at[DL_NOTE];
    int diff = 0, big = 0;
    Py_ssize_t z0 = 0, z1 = 0, z2 = 0, z3 = 0, gnulls = 0;
    int32_t h0 = INT32_MIN, h1 = INT32_MIN, h2 = INT32_MIN;
    unsigned gb = 0, gv = 0; /* grad's bits of the current byte */
    int64_t total = 0;
    off[0] = 0;
    for (Py_ssize_t k = 0; k < n; k++) { /* the one pass over the records */
        const char *rec = r.base + k * r.itemsize;
        int32_t nd, x0, x1, x2, x3, g, s0, s1, s2;
        int64_t sv;
        memcpy(&nd, rec + a_nd, 4);
        if (nd < 0 || nd > MAX_INLINE_DIMS) {
            out = Py_NewRef(Py_None);
            goto done;
        }
        memcpy(&sv, rec + a_seq, 8);
        memcpy(sq + 8 * k, &sv, 8);
        memcpy(&x0, rec + a0, 4);
        memcpy(&x1, rec + a1, 4);
        memcpy(&x2, rec + a2, 4);
        memcpy(&x3, rec + a3, 4);
        big |= (x0 == INT32_MAX) | (x1 == INT32_MAX) | (x2 == INT32_MAX) | (x3 == INT32_MAX);
        dst0[k] = x0 < 0 ? 0 : (int32_t)((uint32_t)x0 + 1u);
        dst1[k] = x1 < 0 ? 0 : (int32_t)((uint32_t)x1 + 1u);
        dst2[k] = x2 < 0 ? 0 : (int32_t)((uint32_t)x2 + 1u);
        dst3[k] = x3 < 0 ? 0 : (int32_t)((uint32_t)x3 + 1u);
        diff |= (x0 != f0) | (x1 != f1) << 1 | (x2 != f2) << 2 | (x3 != f3) << 3;
        z0 += x0 < 0;
        z1 += x1 < 0;
        z2 += x2 < 0;
        z3 += x3 < 0;
        memcpy(&g, rec + a_g, 4);
        gb |= (unsigned)(g == 1) << (k & 7);
        gv |= (unsigned)(g >= 0) << (k & 7);
        gnulls += g < 0;
        if ((k & 7) == 7) {
            gbits[k >> 3] = (uint8_t)gb;
            gok[k >> 3] = (uint8_t)gv;
            gb = gv = 0;
        }
        memcpy(&s0, rec + a_st, 4);
        memcpy(&s1, rec + a_pa, 4);
        memcpy(&s2, rec + a_no, 4);
        h0 = s0 > h0 ? s0 : h0;
        h1 = s1 > h1 ? s1 : h1;
        h2 = s2 > h2 ? s2 : h2;
        /* all the inline dimensions, a fixed size (no call): the next record's overwrite
           those past nd, and dims has room for MAX_INLINE_DIMS a record */
        memcpy(dims + total, rec + a_d0, 8 * MAX_INLINE_DIMS);
        total += nd;
        off[k + 1] = (int32_t)total; /* (total <= 8 n: checked below) */
    }
    if (n & 7) {
        gbits[n >> 3] = (uint8_t)gb;
        gok[n >> 3] = (uint8_t)gv;
    }
    if (big) { /* an id whose index (id + 1) is past int32 */
        PyErr_SetString(PyExc_ValueError, "arrowipc: a dictionary of 2**31 strings or more");
        goto done;
    }
    if (total >= ((int64_t)1 << 31)) {
        PyErr_SetString(PyExc_ValueError, "a shape column of 2**31 values or more in one batch");
        goto done;
    }
    const Py_ssize_t nulls[4] = {z0, z1, z2, z3};
    int32_t hi[3] = {h0, h1, h2};
    values = PyBytes_FromStringAndSize((const char *)dims, (Py_ssize_t)total * 8);
    if (!values) goto done;
    for (int j = 0; j < 4; j++) {
        cols[j] = dict_column_of(&r, idx[j], !(diff >> j & 1), first[j], nulls[j]);
        idx[j] = NULL; /* (taken, on failure too) */
        if (!cols[j]) goto done;
    }
    if (gnulls == n && n) {
        grad = rc_nulls_of(&r, "bool");
    } else {
        grad = rc_column(&r, gnulls, 2, gnulls ? gvalid : Py_NewRef(Py_None), gdata, NULL);
        if (gnulls) gvalid = NULL; /* (stolen by rc_column, on failure too) */
        gdata = NULL;
    }
    if (!grad) goto done;
    PyObject *seqc = rc_column(&r, 0, 2, Py_NewRef(Py_None), seq, NULL);
    seq = NULL;
    if (!seqc) goto done;
    out = Py_BuildValue("(N N N (OO) N N N (iii))", seqc, cols[0], cols[1], offsets, values,
                        cols[2], cols[3], grad, hi[0], hi[1], hi[2]);
    for (int j = 0; j < 4; j++) cols[j] = NULL; /* (stolen by N, on failure too) */
    grad = NULL;
done:
    PyMem_Free(dims);
    for (int j = 0; j < 4; j++) Py_XDECREF(idx[j]);
    Py_XDECREF(seq);
    Py_XDECREF(offsets);
    Py_XDECREF(values);
    Py_XDECREF(gdata);
    Py_XDECREF(gvalid);
    for (int j = 0; j < 4; j++) Py_XDECREF(cols[j]);
    Py_XDECREF(grad);
    PyBuffer_Release(&rb);
    return out;
}

/* ------------------------------------------------------------------ Arrow IPC messages
 * The native twins of pprobe/arrowipc.py's schema_message, batch_message and lz4_periodic
 * (and safefs.write_all_v's writev loop): the same bytes, without a Python call per buffer.
 * FB is arrowipc._Builder: a back-to-front flatbuffer builder whose positions are offsets from
 * the buffer's end; its data is mem[cap - len .. cap). */
typedef struct {
    unsigned char *mem;
    size_t cap, len;
    int oom;
} FB;

static int fb_room(FB *b, size_t n) {
    if (b->oom) return -1;
    if (b->cap - b->len >= n) return 0;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap - b->len < n) cap *= 2;
    unsigned char *m = PyMem_Malloc(cap);
    if (!m) {
        b->oom = 1;
        PyErr_NoMemory();
        return -1;
    }
    if (b->len) memcpy(m + cap - b->len, b->mem + b->cap - b->len, b->len);
    PyMem_Free(b->mem);
    b->mem = m;
    b->cap = cap;
    return 0;
}

static void fb_prepend(FB *b, const void *p, size_t n) {
    if (fb_room(b, n) < 0) return;
    b->len += n;
    if (p)
        memcpy(b->mem + b->cap - b->len, p, n);
    else
        memset(b->mem + b->cap - b->len, 0, n);
}

/* pad so that `extra` bytes prepended next leave the buffer aligned to `align` */
static void fb_prep(FB *b, size_t align, size_t extra) {
    size_t pad = (align - (b->len + extra) % align) % align;
    if (pad) fb_prepend(b, NULL, pad);
}

static void fb_u32(FB *b, uint32_t v) {
    unsigned char le[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                           (unsigned char)(v >> 24)};
    fb_prepend(b, le, 4);
}

static void fb_le(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static int64_t fb_string(FB *b, const char *s, size_t n) {
    fb_prep(b, 4, n + 1);
    fb_prepend(b, NULL, 1);
    fb_prepend(b, s, n);
    fb_prep(b, 4, 4);
    fb_u32(b, (uint32_t)n);
    return (int64_t)b->len;
}

static int64_t fb_offsets(FB *b, const int64_t *targets, size_t n) {
    fb_prep(b, 4, 4 * (n + 1));
    for (size_t i = n; i-- > 0;) fb_u32(b, (uint32_t)((int64_t)b->len + 4 - targets[i]));
    fb_prep(b, 4, 4);
    fb_u32(b, (uint32_t)n);
    return (int64_t)b->len;
}

/* a vector of 16-byte structs (two int64s each): the values, little-endian */
static int64_t fb_structs(FB *b, const int64_t *vals, size_t count) {
    size_t nb = 16 * count;
    fb_prep(b, 8, nb);
    if (fb_room(b, nb) == 0) {
        b->len += nb;
        unsigned char *p = b->mem + b->cap - b->len;
        for (size_t i = 0; i < 2 * count; i++) fb_le(p + 8 * i, (uint64_t)vals[i], 8);
    }
    fb_prep(b, 4, 4);
    fb_u32(b, (uint32_t)count);
    return (int64_t)b->len;
}

/* a table field: its slot, its size (8 "q", 4 "i", 2 "h", 1 "B"/"?"; 0: an offset, "off",
 * 4 bytes) and value */
typedef struct {
    int slot, size;
    int64_t value;
} FBField;

static int64_t fb_table(FB *b, const FBField *f, int n) {
    int64_t start = (int64_t)b->len;
    int64_t where[16];
    int nslots = 0;
    for (int k = 0; k < 16; k++) where[k] = -1;
    static const int order[4] = {8, 4, 2, 1}; /* wider first; stable, as Python's sorted() */
    for (int o = 0; o < 4; o++)
        for (int i = 0; i < n; i++) {
            int sz = f[i].size ? f[i].size : 4;
            if (sz != order[o]) continue;
            if (!f[i].size) {
                fb_prep(b, 4, 4);
                fb_u32(b, (uint32_t)((int64_t)b->len + 4 - f[i].value));
            } else {
                unsigned char le[8];
                fb_le(le, (uint64_t)f[i].value, sz);
                fb_prep(b, (size_t)sz, (size_t)sz);
                fb_prepend(b, le, (size_t)sz);
            }
            where[f[i].slot] = (int64_t)b->len;
            if (f[i].slot + 1 > nslots) nslots = f[i].slot + 1;
        }
    fb_prep(b, 4, 4);
    fb_prepend(b, NULL, 4); /* the soffset to the vtable, set below */
    int64_t pos = (int64_t)b->len;
    size_t vtl = 2 * (size_t)(2 + nslots);
    unsigned char vt[2 * 18];
    fb_le(vt, 4 + 2 * (uint64_t)nslots, 2);
    fb_le(vt + 2, (uint64_t)(pos - start), 2);
    for (int s = 0; s < nslots; s++) fb_le(vt + 4 + 2 * s, where[s] >= 0 ? (uint64_t)(pos - where[s]) : 0, 2);
    fb_prepend(b, vt, vtl);
    if (!b->oom) fb_le(b->mem + b->cap - b->len + vtl, (uint64_t)vtl, 4);
    return pos;
}

/* the encapsulated message: continuation, metadata length, the Message flatbuffer (finished
 * and padded to 8 bytes); a bytes object, or NULL with an error */
static PyObject *fb_message(FB *b, int header_type, int64_t header, int64_t body_length) {
    FBField mf[4] = {{0, 2, 4 /* V5 */}, {1, 1, header_type}, {2, 0, header}, {3, 8, body_length}};
    int64_t msg = fb_table(b, mf, 4);
    fb_prep(b, 8, 4);
    fb_u32(b, (uint32_t)((int64_t)b->len + 4 - msg));
    if (b->oom) return NULL;
    size_t meta = b->len, pad = (8 - meta % 8) % 8;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(8 + meta + pad));
    if (!out) return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    memset(o, 0xff, 4);
    fb_le(o + 4, (uint64_t)(meta + pad), 4);
    memcpy(o + 8, b->mem + b->cap - meta, meta);
    memset(o + 8 + meta, 0, pad);
    return out;
}

static int64_t fb_pystring(FB *b, PyObject *s) {
    /* a str's UTF-8 ("replace" for what has none: arrowipc's encode) */
    PyObject *e = PyUnicode_AsEncodedString(s, "utf-8", "replace");
    if (!e) {
        b->oom = 1;
        return -1;
    }
    int64_t r = fb_string(b, PyBytes_AS_STRING(e), (size_t)PyBytes_GET_SIZE(e));
    Py_DECREF(e);
    return r;
}

/* arrowipc._field: type one of "utf8", "int32", "int64", "float64", "bool", "list<int64>" */
static int64_t fb_field(FB *b, PyObject *name, const char *tp) {
    int64_t kids[1];
    size_t nk = 0;
    if (!strcmp(tp, "list<int64>")) {
        PyObject *item = PyUnicode_FromString("item");
        if (!item) {
            b->oom = 1;
            return -1;
        }
        kids[nk++] = fb_field(b, item, "int64");
        Py_DECREF(item);
    }
    int t_type;
    int64_t t;
    if (!strcmp(tp, "int32") || !strcmp(tp, "int64")) {
        FBField f[2] = {{0, 4, tp[3] == '3' ? 32 : 64}, {1, 1, 1}};
        t_type = 2, t = fb_table(b, f, 2);
    } else if (!strcmp(tp, "float64")) {
        FBField f[1] = {{0, 2, 2 /* DOUBLE */}};
        t_type = 3, t = fb_table(b, f, 1);
    } else if (!strcmp(tp, "utf8") || !strcmp(tp, "bool") || !strcmp(tp, "list<int64>") ||
               !strcmp(tp, "dict<utf8>")) {
        t_type = tp[0] == 'u' || tp[0] == 'd' ? 5 : tp[0] == 'b' ? 6 : 12;
        t = fb_table(b, NULL, 0);
    } else {
        PyErr_Format(PyExc_ValueError, "arrowipc: no encoding for type '%s'", tp);
        b->oom = 1;
        return -1;
    }
    int64_t dict = -1;
    if (tp[0] == 'd') { /* DictionaryEncoding: id 0 (arrowipc.DICT_ID), indexType Int(32, signed) */
        FBField fi[2] = {{0, 4, 32}, {1, 1, 1}};
        int64_t index = fb_table(b, fi, 2);
        FBField fd[2] = {{0, 8, 0}, {1, 0, index}};
        dict = fb_table(b, fd, 2);
    }
    int64_t kv = fb_offsets(b, kids, nk);
    int64_t nm = fb_pystring(b, name);
    FBField f[6] = {{0, 0, nm}, {1, 1, 1}, {2, 1, t_type}, {3, 0, t}, {4, 0, dict}, {5, 0, kv}};
    if (dict < 0) f[4] = f[5];
    return fb_table(b, f, dict < 0 ? 5 : 6);
}

/* ipc_schema_message(fields, metadata) -> bytes: arrowipc.schema_message */
static PyObject *ipc_schema_message(PyObject *self, PyObject *args) {
    PyObject *fields, *meta;
    if (!PyArg_ParseTuple(args, "OO!", &fields, &PyDict_Type, &meta)) return NULL;
    PyObject *seq = PySequence_Fast(fields, "schema_message: fields must be a sequence");
    if (!seq) return NULL;
    FB b = {0};
    PyObject *out = NULL;
    Py_ssize_t nf = PySequence_Fast_GET_SIZE(seq), nm = PyDict_GET_SIZE(meta);
    int64_t *fo = PyMem_Malloc(sizeof(int64_t) * (size_t)(nf + nm + 1));
    if (!fo) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t pos = 0, k = 0;
    PyObject *key, *val;
    while (PyDict_Next(meta, &pos, &key, &val)) {
        if (!PyUnicode_Check(key) || !PyUnicode_Check(val)) {
            PyErr_SetString(PyExc_TypeError, "schema_message: metadata is str -> str");
            goto done;
        }
        int64_t vs = fb_pystring(&b, val), ks = fb_pystring(&b, key);
        FBField f[2] = {{0, 0, ks}, {1, 0, vs}};
        fo[k++] = fb_table(&b, f, 2);
    }
    int64_t kvs = fb_offsets(&b, fo, (size_t)k);
    for (Py_ssize_t i = 0; i < nf; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 2 ||
            !PyUnicode_Check(PyTuple_GET_ITEM(it, 0)) || !PyUnicode_Check(PyTuple_GET_ITEM(it, 1))) {
            PyErr_SetString(PyExc_TypeError, "schema_message: fields are (name, type) str pairs");
            goto done;
        }
        const char *tp = PyUnicode_AsUTF8(PyTuple_GET_ITEM(it, 1));
        if (!tp) goto done;
        fo[i] = fb_field(&b, PyTuple_GET_ITEM(it, 0), tp);
        if (b.oom) goto done;
    }
    int64_t fs = fb_offsets(&b, fo, (size_t)nf);
    FBField sf[2] = {{1, 0, fs}, {2, 0, kvs}};
    int64_t sch = fb_table(&b, sf, 2);
    if (!b.oom) out = fb_message(&b, 1 /* Schema */, sch, 0);
done:
    PyMem_Free(fo);
    PyMem_Free(b.mem);
    Py_DECREF(seq);
    return out;
}

/* arrowipc._lz4_extra: an LZ4 length's bytes after the token's 15 */
static void lz4_extra(PyObject *frame, size_t *at, size_t n, int write) {
    n -= 15;
    size_t k = n / 255;
    if (write) {
        unsigned char *o = (unsigned char *)PyBytes_AS_STRING(frame) + *at;
        memset(o, 0xff, k);
        o[k] = (unsigned char)(n % 255);
    }
    *at += k + 1;
}

/* arrowipc._lz4_block into frame at *at (write 0: only measure): `size` bytes that repeat
 * `pat` rotated by `ph` */
static void lz4_block(PyObject *frame, size_t *at, const unsigned char *pat, size_t p, size_t ph,
                      size_t size, int write) {
    unsigned char *o = write ? (unsigned char *)PyBytes_AS_STRING(frame) : NULL;
    if (size < p + 12 || p > 0xFFFF) { /* stored: the size field's high bit, then the bytes */
        if (write) {
            fb_le(o + *at, (uint64_t)(size | 0x80000000u), 4);
            for (size_t i = 0; i < size; i++) o[*at + 4 + i] = pat[(ph + i) % p];
        }
        *at += 4 + size;
        return;
    }
    size_t match = size - p - 5;
    size_t lit = p < 15 ? p : 15, ml = match - 4 < 15 ? match - 4 : 15;
    size_t head = *at;
    *at += 4; /* the block's size, set below */
    if (write) o[*at] = (unsigned char)((lit << 4) | ml);
    *at += 1;
    if (p >= 15) lz4_extra(frame, at, p, write);
    if (write)
        for (size_t i = 0; i < p; i++) o[*at + i] = pat[(ph + i) % p];
    *at += p;
    if (write) fb_le(o + *at, (uint64_t)p, 2);
    *at += 2;
    if (match - 4 >= 15) lz4_extra(frame, at, match - 4, write);
    if (write) {
        o[*at] = 0x50; /* the last sequence: 5 literals, no match */
        for (size_t i = 0; i < 5; i++) o[*at + 1 + i] = pat[(ph + size - 5 + i) % p];
    }
    *at += 6;
    if (write) fb_le(o + head, (uint64_t)(*at - head - 4), 4);
}

#define LZ4_BLOCK_MAX (4u << 20)
static const unsigned char LZ4_HEAD[7] = {0x04, 0x22, 0x4d, 0x18, 0x60, 0x70, 0x73};

/* arrowipc.lz4_periodic: an LZ4 frame of `size` bytes repeating `pat` */
static PyObject *lz4_frame(const unsigned char *pat, size_t p, size_t size) {
    PyObject *frame = NULL;
    for (int write = 0; write < 2; write++) { /* measure, then fill */
        size_t at = 7;
        for (size_t pos = 0; pos < size; pos += LZ4_BLOCK_MAX) {
            size_t k = size - pos < LZ4_BLOCK_MAX ? size - pos : LZ4_BLOCK_MAX;
            lz4_block(frame, &at, pat, p, pos % p, k, write);
        }
        at += 4;
        if (!write) {
            frame = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)at);
            if (!frame) return NULL;
            memcpy(PyBytes_AS_STRING(frame), LZ4_HEAD, 7);
        } else {
            memset(PyBytes_AS_STRING(frame) + at - 4, 0, 4);
        }
    }
    return frame;
}

static PyObject *ipc_lz4_periodic(PyObject *self, PyObject *args) {
    Py_buffer pat;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "y*n", &pat, &size)) return NULL;
    PyObject *r = NULL;
    if (!pat.len || size < 0)
        PyErr_SetString(PyExc_ValueError, "lz4_periodic: a pattern and a size >= 0");
    else
        r = lz4_frame(pat.buf, (size_t)pat.len, (size_t)size);
    PyBuffer_Release(&pat);
    return r;
}

#define CONST_MIN 64

typedef struct {
    PyObject *key; /* a Const's pattern, or a bytes object (by identity) */
    Py_ssize_t size;
    int64_t at, len;
} Placed;

/* a buffer's size: None 0, a Const its size, else its buffer's length; -1 on error */
static Py_ssize_t ipc_nbytes(PyObject *buf, PyObject *const_type) {
    if (buf == Py_None) return 0;
    if ((PyObject *)Py_TYPE(buf) == const_type) {
        PyObject *s = PyObject_GetAttr(buf, s_size);
        Py_ssize_t n = s ? PyLong_AsSsize_t(s) : -1;
        Py_XDECREF(s);
        return n;
    }
    if (PyBytes_CheckExact(buf)) return PyBytes_GET_SIZE(buf);
    Py_buffer v;
    if (PyObject_GetBuffer(buf, &v, PyBUF_C_CONTIGUOUS) < 0) return -1;
    Py_ssize_t n = v.len;
    PyBuffer_Release(&v);
    return n;
}

static int list_add(PyObject *l, PyObject *o) { /* steals o */
    if (!o) return -1;
    int r = PyList_Append(l, o);
    Py_DECREF(o);
    return r;
}

/* the last item of a non-empty list, taken off it (a new reference), or NULL with an error */
static PyObject *stack_pop(PyObject *stack) {
    Py_ssize_t last = PyList_GET_SIZE(stack) - 1;
    PyObject *c = Py_NewRef(PyList_GET_ITEM(stack, last));
    if (PyList_SetSlice(stack, last, last + 1, NULL) < 0) Py_CLEAR(c);
    return c;
}

/* ipc_batch_message(num_rows, columns, Const[, dict_id, delta]) -> [metadata, body pieces...]:
 * arrowipc.batch_message (its docstring says what it writes); with dict_id >= 0, a
 * DictionaryBatch message around the batch (arrowipc.py_batch_message's twin) */
static PyObject *ipc_batch_message(PyObject *self, PyObject *args) {
    Py_ssize_t num_rows;
    PyObject *columns, *const_type;
    long long dict_id = -1;
    int delta = 0;
    if (!PyArg_ParseTuple(args, "nO!O|Lp", &num_rows, &PyList_Type, &columns, &const_type,
                          &dict_id, &delta))
        return NULL;
    if (ipc_names() < 0) return NULL;
    static const unsigned char pad0[8] = {0};
    static const unsigned char raw[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    PyObject *out = PyList_New(1), *stack = PyList_New(0), *raw_b = NULL;
    int64_t *nodes = NULL, *spans = NULL;
    size_t nn = 0, ns = 0, capn = 0, caps = 0;
    Placed *placed = NULL;
    size_t np_ = 0, capp = 0;
    PyObject *result = NULL;
    FB b = {0};
    if (!out || !stack) goto done;
    raw_b = PyBytes_FromStringAndSize((const char *)raw, 8);
    if (!raw_b) goto done;
    /* compress: some Const buffer of CONST_MIN bytes or more, in any column or child */
    int compress = 0;
    for (Py_ssize_t i = PyList_GET_SIZE(columns); i-- > 0;)
        if (PyList_Append(stack, PyList_GET_ITEM(columns, i)) < 0) goto done;
    while (PyList_GET_SIZE(stack) && !compress) {
        PyObject *c = stack_pop(stack);
        if (!c) goto done;
        PyObject *bufs = PyObject_GetAttr(c, s_buffers);
        PyObject *child = bufs ? PyObject_GetAttr(c, s_child) : NULL;
        Py_DECREF(c);
        if (!bufs || !child || !PyList_Check(bufs)) {
            if (bufs && child) PyErr_SetString(PyExc_TypeError, "batch_message: buffers is a list");
            Py_XDECREF(bufs);
            Py_XDECREF(child);
            goto done;
        }
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(bufs) && !compress; k++) {
            PyObject *buf = PyList_GET_ITEM(bufs, k);
            if ((PyObject *)Py_TYPE(buf) == const_type) {
                Py_ssize_t n = ipc_nbytes(buf, const_type);
                if (n < 0) {
                    Py_DECREF(bufs);
                    Py_DECREF(child);
                    goto done;
                }
                compress = n >= CONST_MIN;
            }
        }
        Py_DECREF(bufs);
        int r = child != Py_None ? PyList_Append(stack, child) : 0;
        Py_DECREF(child);
        if (r < 0) goto done;
    }
    if (PyList_SetSlice(stack, 0, PyList_GET_SIZE(stack), NULL) < 0) goto done;
    int64_t pos = 0;
    for (Py_ssize_t i = PyList_GET_SIZE(columns); i-- > 0;)
        if (PyList_Append(stack, PyList_GET_ITEM(columns, i)) < 0) goto done;
    while (PyList_GET_SIZE(stack)) { /* pre-order: a list's node and buffers, then its child's */
        PyObject *c = stack_pop(stack);
        if (!c) goto done;
        PyObject *ln = PyObject_GetAttr(c, s_length), *nc = ln ? PyObject_GetAttr(c, s_null_count) : NULL;
        PyObject *bufs = nc ? PyObject_GetAttr(c, s_buffers) : NULL;
        PyObject *child = bufs ? PyObject_GetAttr(c, s_child) : NULL;
        Py_DECREF(c);
        int64_t l = ln ? PyLong_AsLongLong(ln) : -1, z = nc ? PyLong_AsLongLong(nc) : -1;
        Py_XDECREF(ln);
        Py_XDECREF(nc);
        int bad = !child || PyErr_Occurred() || !PyList_Check(bufs);
        if (!bad && nn + 2 > capn) {
            capn = capn ? 2 * capn : 64;
            int64_t *m = PyMem_Realloc(nodes, capn * sizeof *m);
            if (!m) {
                PyErr_NoMemory();
                bad = 1;
            } else {
                nodes = m;
            }
        }
        if (bad) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "batch_message: a Column");
            Py_XDECREF(bufs);
            Py_XDECREF(child);
            goto done;
        }
        nodes[nn++] = l;
        nodes[nn++] = z;
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(bufs); k++) {
            PyObject *buf = PyList_GET_ITEM(bufs, k);
            if (ns + 2 > caps) {
                caps = caps ? 2 * caps : 128;
                int64_t *m = PyMem_Realloc(spans, caps * sizeof *m);
                if (!m) {
                    PyErr_NoMemory();
                    bad = 1;
                    break;
                }
                spans = m;
            }
            Py_ssize_t size = ipc_nbytes(buf, const_type);
            if (size < 0) {
                bad = 1;
                break;
            }
            if (!size) {
                spans[ns++] = pos;
                spans[ns++] = 0;
                continue;
            }
            int cst = (PyObject *)Py_TYPE(buf) == const_type;
            PyObject *key = NULL;
            if (cst) {
                key = PyObject_GetAttr(buf, s_pattern);
                if (!key || !PyBytes_Check(key)) {
                    if (key) PyErr_SetString(PyExc_TypeError, "batch_message: a Const's pattern is bytes");
                    Py_XDECREF(key);
                    bad = 1;
                    break;
                }
            } else if (PyBytes_CheckExact(buf)) {
                key = Py_NewRef(buf);
            }
            Placed *got = NULL;
            for (size_t q = 0; key && q < np_ && !got; q++) {
                Placed *pl = &placed[q];
                /* a Const: the same pattern and size; a bytes object: the same object */
                if (cst ? pl->size == size &&
                              PyBytes_GET_SIZE(pl->key) == PyBytes_GET_SIZE(key) &&
                              !memcmp(PyBytes_AS_STRING(pl->key), PyBytes_AS_STRING(key),
                                      (size_t)PyBytes_GET_SIZE(key))
                        : pl->size == -1 && pl->key == key)
                    got = pl;
            }
            if (got) {
                Py_DECREF(key);
                spans[ns++] = got->at;
                spans[ns++] = got->len;
                continue;
            }
            int64_t length = 0;
            int r = 0;
            if (compress) { /* each buffer: its uncompressed length (-1: as it is) first */
                if (cst && size >= CONST_MIN) {
                    unsigned char le[8];
                    fb_le(le, (uint64_t)size, 8);
                    r = list_add(out, PyBytes_FromStringAndSize((const char *)le, 8));
                    PyObject *fr = r < 0 ? NULL
                                         : lz4_frame((const unsigned char *)PyBytes_AS_STRING(key),
                                                     (size_t)PyBytes_GET_SIZE(key), (size_t)size);
                    length = 8 + (fr ? PyBytes_GET_SIZE(fr) : 0);
                    r = r < 0 ? r : list_add(out, fr);
                    goto placed_it;
                }
                r = PyList_Append(out, raw_b);
                length = 8;
            }
            if (r == 0) {
                if (cst) { /* the pattern repeated over size bytes */
                    PyObject *bb = PyBytes_FromStringAndSize(NULL, size);
                    if (bb) {
                        const char *p = PyBytes_AS_STRING(key);
                        Py_ssize_t pl = PyBytes_GET_SIZE(key);
                        for (Py_ssize_t i = 0; i < size; i++) PyBytes_AS_STRING(bb)[i] = p[i % pl];
                    }
                    r = list_add(out, bb);
                } else {
                    r = PyList_Append(out, buf);
                }
                length += size;
            }
        placed_it:
            if (r < 0) {
                Py_XDECREF(key);
                bad = 1;
                break;
            }
            if (key) {
                if (np_ == capp) {
                    capp = capp ? 2 * capp : 32;
                    Placed *m = PyMem_Realloc(placed, capp * sizeof *m);
                    if (!m) {
                        Py_DECREF(key);
                        PyErr_NoMemory();
                        bad = 1;
                        break;
                    }
                    placed = m;
                }
                placed[np_++] = (Placed){key, cst ? size : -1, pos, length}; /* owns key */
            }
            spans[ns++] = pos;
            spans[ns++] = length;
            int64_t pad = (8 - length % 8) % 8;
            if (pad && list_add(out, PyBytes_FromStringAndSize((const char *)pad0, pad)) < 0) {
                bad = 1;
                break;
            }
            pos += length + pad;
        }
        Py_DECREF(bufs);
        int r = !bad && child != Py_None ? PyList_Append(stack, child) : 0;
        Py_DECREF(child);
        if (bad || r < 0) goto done;
    }
    int64_t bufs_at = fb_structs(&b, spans, ns / 2);
    int64_t nds = fb_structs(&b, nodes, nn / 2);
    FBField f[4] = {{0, 8, num_rows}, {1, 0, nds}, {2, 0, bufs_at}, {3, 0, 0}};
    if (compress) { /* BodyCompression: codec LZ4_FRAME (0), method BUFFER (0) */
        FBField cf[2] = {{0, 1, 0}, {1, 1, 0}};
        f[3].value = fb_table(&b, cf, 2);
    }
    int64_t rb = fb_table(&b, f, compress ? 4 : 3);
    int header_type = 3; /* RecordBatch */
    if (dict_id >= 0) { /* DictionaryBatch: id, data, isDelta */
        FBField df[3] = {{0, 8, dict_id}, {1, 0, rb}, {2, 1, delta}};
        rb = fb_table(&b, df, 3), header_type = 2;
    }
    if (b.oom) goto done;
    PyObject *msg = fb_message(&b, header_type, rb, pos);
    if (!msg) goto done;
    PyList_SET_ITEM(out, 0, msg);
    result = Py_NewRef(out);
done:
    for (size_t q = 0; q < np_; q++) Py_DECREF(placed[q].key);
    PyMem_Free(placed);
    PyMem_Free(nodes);
    PyMem_Free(spans);
    PyMem_Free(b.mem);
    Py_XDECREF(raw_b);
    Py_XDECREF(stack);
    Py_XDECREF(out);
    return result;
}

/* ipc_writev(fd, pieces): every piece (bytes-like, C-contiguous) written in order with
 * writev, the GIL released meanwhile; safefs.write_all_v's twin (ENOSPC on a zero-length
 * write) */
static PyObject *ipc_writev(PyObject *self, PyObject *args) {
    int fd;
    PyObject *pieces;
    if (!PyArg_ParseTuple(args, "iO!", &fd, &PyList_Type, &pieces)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(pieces);
    Py_buffer *views = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_buffer));
    struct iovec *iov = PyMem_Calloc((size_t)(n ? n : 1), sizeof(struct iovec));
    Py_ssize_t got = 0, cnt = 0;
    PyObject *r = NULL;
    if (!views || !iov) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < n; got++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(pieces, got), &views[got], PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        if (views[got].len) iov[cnt++] = (struct iovec){views[got].buf, (size_t)views[got].len};
    }
    int err = 0;
    Py_BEGIN_ALLOW_THREADS;
    Py_ssize_t i = 0;
    while (i < cnt) {
        int k = cnt - i > 1024 ? 1024 : (int)(cnt - i);
        ssize_t w = writev(fd, iov + i, k);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            err = w < 0 ? errno : ENOSPC;
            break;
        }
        while (i < cnt && (size_t)w >= iov[i].iov_len) {
            w -= (ssize_t)iov[i].iov_len;
            i++;
        }
        if (i < cnt) {
            iov[i].iov_base = (char *)iov[i].iov_base + w;
            iov[i].iov_len -= (size_t)w;
        }
    }
    Py_END_ALLOW_THREADS;
    if (err) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    r = Py_NewRef(Py_None);
done:
    for (Py_ssize_t k = 0; k < got; k++) PyBuffer_Release(&views[k]);
    PyMem_Free(views);
    PyMem_Free(iov);
    return r;
}

static PyObject *layout(PyObject *self, PyObject *unused) {
    return Py_BuildValue("(nn)", (Py_ssize_t)sizeof(OpRec), (Py_ssize_t)sizeof(DescRec));
}

static PyMethodDef methods[] = {
    {"init", (PyCFunction)(void (*)(void))init, METH_VARARGS | METH_KEYWORDS,
     "Hand the core its Python helpers; returns the shared buffer."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "configure(active, nested, parents, mode, slow, flush_rows, wake)"},
    {"set_step", set_step, METH_O, "the current training step"},
    {"ext_setup", ext_setup, METH_VARARGS,
     "ext_setup(tables globals, state globals, on_step, _sampled_value, note_failure, _SKIP)"},
    {"ext_on_step", (PyCFunction)(void (*)(void))es_on_step, METH_FASTCALL,
     "pprobe.ext.tables.on_step's twin"},
    {"lifecycle_setup", lifecycle_setup, METH_VARARGS,
     "lifecycle_setup(lifecycle, dispatch, state globals, pre, ending, change, calls_none, "
     "fire_before, fire_after)"},
    {"lifecycle_pre", (PyCFunction)(void (*)(void))lc_pre, METH_FASTCALL,
     "lifecycle._on_optimizer_pre's idle steps"},
    {"lifecycle_ending", (PyCFunction)(void (*)(void))lc_ending, METH_FASTCALL,
     "lifecycle._on_step_ending's idle steps"},
    {"lifecycle_change", (PyCFunction)(void (*)(void))lc_change, METH_FASTCALL,
     "lifecycle._on_step_change"},
    {"calls_none", (PyCFunction)(void (*)(void))lc_calls_none_py, METH_FASTCALL,
     "dispatch.calls_none(point, at)'s twin"},
    {"untrack_sample", untrack_sample, METH_O,
     "untrack_sample(entry): an extension tables' sample, untracked (see the C comment)"},
    {"module_frames", module_frames, METH_VARARGS,
     "module_frames(on, code, code, paths, frame_path, training_started): rows read their "
     "module from the frames"},
    {"where", where_now, METH_NOARGS, "(module, phase) of a row recorded here now"},
    {"set_default_phase", set_default_phase, METH_O,
     "the phase of rows no hook gave one (init, other)"},
    {"set_op", set_op, METH_VARARGS, "set_op(index, selected, every, first, framework)"},
    {"set_stats", set_stats, METH_VARARGS,
     "set_stats(capsule, fallback, out_note, uninit_note, out_sid): statistics in the core"},
    {"set_seq", set_seq, METH_O, "the next sequence number"},
    {"clear_code_cache", clear_code_cache, METH_NOARGS, "forget code classifications"},
    {"as_caller", (PyCFunction)(void (*)(void))as_caller, METH_FASTCALL,
     "as_caller(fn=None): recorder.as_caller"},
    {"set_as_caller", set_as_caller, METH_VARARGS,
     "set_as_caller(classify, tramp_for, plain): as_caller's Python helpers"},
    {"set_opcodes", set_opcodes, METH_O, "the operator class of each (opcode, oparg)"},
    {"set_operators", set_operators, METH_O,
     "{(opclass, ufunc name, reflected): op index} for ndarray operators"},
    {"numpy_init", numpy_init, METH_VARARGS, "NumPy's types and dtype names"},
    {"hook", hook, METH_VARARGS, "hook(ufunc or dispatcher, op index): record its calls"},
    {"unhook_all", unhook_all, METH_NOARGS, "restore every hooked instance"},
    {"is_hooked", is_hooked, METH_O, "whether calls of the object are recorded"},
    {"set_type_attr", set_type_attr, METH_VARARGS, "set_type_attr(type, name, value or None)"},
    {"call", (PyCFunction)(void (*)(void))py_call, METH_FASTCALL,
     "call(op, fn, args, kwargs): recorder.call"},
    {"set_stacks", set_stacks, METH_VARARGS,
     "set_stacks(stack_id, depth): the stack interner and PPROBE_STACK_DEPTH"},
    {"torch_call", (PyCFunction)(void (*)(void))torch_call, METH_FASTCALL,
     "torch_call(func, args, kwargs): the api level's __torch_function__"},
    {"torch_init", torch_init, METH_VARARGS, "torch's types, dtype names and helpers"},
    {"torch_getters", torch_getters, METH_NOARGS,
     "the tensor types whose attributes are read through their getters"},
    {"torch_handler", torch_handler, METH_O,
     "torch_handler(fn): calls of the Python function fn run the api-level handler"},
    {"torch_mode", torch_mode, METH_VARARGS,
     "torch_mode(on, compiler_dict, torch_call): switch the api-level handler"},
    {"after_fork_child", after_fork_child, METH_NOARGS, "empty buffer in a forked child"},
    {"layout", layout, METH_NOARGS, "(op record size, desc record size)"},
    {"set_proxy_call", set_proxy_call, METH_VARARGS,
     "set_proxy_call(FunctionProxy, classes): the proxies' calls go to the core in C"},
    {"set_dump", set_dump, METH_O,
     "set_dump(fn or None): fn(x, op, seq, kind, idx, header) -> (path, note) dumps dump "
     "mode's arrays"},
    {"set_dumper", set_dumper, METH_VARARGS,
     "set_dumper(dumper, submit, head) or set_dumper(None): dump mode's common dumps in C"},
    {"npy_header", npy_header, METH_O,
     "npy_header(x): the .npy header of a plain ndarray of a builtin numeric dtype, else None"},
    {"set_other_pair", set_other_pair, METH_VARARGS,
     "set_other_pair(fn or None, shown_by_type=None): the args the core does not describe"},
    {"clear_arg_texts", clear_arg_texts, METH_NOARGS,
     "forget the args' texts learnt from other_pair (values' kinds changed)"},
    {"arg_keys", arg_keys, METH_O, "arg_keys(sets) -> the args cache's keys (writer._args)"},
    {"arg_texts", (PyCFunction)(void (*)(void))arg_texts, METH_FASTCALL,
     "arg_texts(sets, Text) -> each set's args text (UTF-8), or None for the Python twin"},
    {"desc_log_columns", (PyCFunction)(void (*)(void))desc_log_columns, METH_FASTCALL,
     "desc_log_columns(descs, size, at, Column, Const) -> the tensors batch's record columns "
     "and the greatest stats, path and note fields, in one pass; None: a deep shape"},
    {"field_ranges", (PyCFunction)(void (*)(void))field_ranges, METH_FASTCALL,
     "field_ranges(recs, itemsize, fields) -> [(min, max), ...] or None (no record)"},
    {"missing_ids", (PyCFunction)(void (*)(void))missing_ids, METH_FASTCALL,
     "missing_ids(recs, itemsize, offset, code, table, marker) -> the values j of the field "
     "with table[j] == marker, distinct, ascending"},
    {"shape_lists", (PyCFunction)(void (*)(void))shape_lists, METH_FASTCALL,
     "shape_lists(records, size, ndim_at, dims_at) -> (offsets, values) or None"},
    {"ipc_schema_message", ipc_schema_message, METH_VARARGS,
     "ipc_schema_message(fields, metadata) -> bytes: arrowipc.schema_message's twin"},
    {"ipc_batch_message", ipc_batch_message, METH_VARARGS,
     "ipc_batch_message(num_rows, columns, Const[, dict_id, delta]) -> [metadata, body...]: "
     "arrowipc.batch_message's twin (with dict_id: a DictionaryBatch)"},
    {"ipc_lz4_periodic", ipc_lz4_periodic, METH_VARARGS,
     "ipc_lz4_periodic(pattern, size) -> bytes: arrowipc.lz4_periodic's twin"},
    {"ipc_writev", ipc_writev, METH_VARARGS,
     "ipc_writev(fd, pieces): safefs.write_all_v's twin (the GIL released while writing)"},
    {"record_columns", (PyCFunction)(void (*)(void))record_columns, METH_FASTCALL,
     "record_columns(recs, itemsize, specs, Column, Const) -> the batch's columns made from "
     "the records' fixed fields (writer._py_record_columns's twin)"},
    {"dict_take", (PyCFunction)(void (*)(void))dict_take, METH_FASTCALL,
     "dict_take(table, idx, inner=None) -> dict_indices(table[idx]) in one pass"},
    {"arg_column", (PyCFunction)(void (*)(void))arg_column, METH_FASTCALL,
     "arg_column(refs, objs, cache) -> the args column, or the sets without a text"},
    {"dict_indices", dict_indices, METH_O,
     "dict_indices(ids) -> the one id of every row, or (nulls, bitmap or None, int32 indices): "
     "arrowipc.dict_indices's twin"},
    {"utf8_column", (PyCFunction)(void (*)(void))utf8_column, METH_FASTCALL,
     "utf8_column(items, ids=None, one=False) -> (nulls, bitmap or None, offsets, data), or "
     "the one id of every row (with one)"},
    {NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "pprobe._native",
                                       "pprobe's native recording core.", -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    PyTypeObject *types[] = {&BufferType, &ProbeType, &FieldType, &CounterType};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (PyType_Ready(types[i]) < 0) return NULL;
    struct {
        PyObject **p;
        const char *s;
    } strs[] = {{&str_shape, "shape"}, {&str_dtype, "dtype"}, {&str_is_cpu, "is_cpu"},
                {&str_requires_grad, "requires_grad"}, {&str_name, "__name__"},
                {&str_index, "index"}};
    for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++)
        if (!(*strs[i].p = PyUnicode_InternFromString(strs[i].s))) return NULL;
    g_main_ident = PyThread_get_thread_ident(); /* refined by init(): threading's main thread */
    if (window_init() != 0) {
        PyErr_SetString(PyExc_OSError, "pprobe: the flush window's condition variables");
        return NULL;
    }
    if (pthread_atfork(window_prefork, window_parent, window_child) != 0) {
        PyErr_SetString(PyExc_OSError, "pprobe: pthread_atfork for the flush window");
        return NULL;
    }
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    if (PyModule_AddIntConstant(m, "API", PPROBE_NATIVE_API) < 0 ||
        PyModule_AddObjectRef(m, "Buffer", (PyObject *)&BufferType) < 0 ||
        PyModule_AddObjectRef(m, "MethodProbe", (PyObject *)&ProbeType) < 0 ||
        PyModule_AddObjectRef(m, "ThreadField", (PyObject *)&FieldType) < 0 ||
        PyModule_AddObjectRef(m, "Counter", (PyObject *)&CounterType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
