/* A C-level SIGTERM handler: flush the log, then die of SIGTERM as before.
 *
 * A Python-level handler (signal.signal) would change what the program sees and when it dies:
 * signal.getsignal(SIGTERM) would no longer be SIG_DFL, and Python runs handlers only in the
 * main thread between bytecodes, so death waits for any long C call (a matmul, a collective).
 *
 * Here the handler only does async-signal-safe things: it writes a byte to a pipe, which
 * wakes pprobe's watcher thread (it flushes the log and writes meta.json, then calls
 * disarm()), and posts a semaphore that wakes a C thread, the reaper. The reaper waits for
 * disarm() at most `grace` seconds, then puts SIG_DFL back and sends SIGTERM again: the
 * process dies of the signal, with the status it would have had, at most `grace` seconds
 * later (sooner once the flush is done), whatever its main thread is doing. Python's own
 * table of handlers is not touched, so signal.getsignal() still says SIG_DFL, and a program
 * that sets its own handler (or SIG_DFL, or SIG_IGN) simply replaces this one.
 *
 * Plain POSIX and the stable parts of the C API; built optionally (setup.py). Without it,
 * SIGTERM keeps its default action and the rows since the last flush are lost (README).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t wake_fd = -1; /* the watcher's pipe (write end) */
static volatile sig_atomic_t fired = 0;    /* a SIGTERM was caught */
static pid_t armed_pid = 0;                /* the process whose pipe wake_fd is */
static double grace = 1.0;
static sem_t term_sem, done_sem;
static int sems_ready = 0;

static void default_and_kill(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    kill(getpid(), SIGTERM); /* pending until the handler (if any) returns, then fatal */
}

static void on_sigterm(int signum)
{
    int saved = errno;
    (void)signum;
    if (getpid() != armed_pid || fired) {
        /* A forked child not yet re-armed (the pipe is its parent's), or a second SIGTERM:
           the default action, now. */
        default_and_kill();
    } else {
        fired = 1;
        if (wake_fd >= 0) {
            char c = 1;
            ssize_t r = write((int)wake_fd, &c, 1);
            (void)r;
        }
        sem_post(&term_sem);
    }
    errno = saved;
}

static void *reaper(void *arg)
{
    struct timespec ts;
    sigset_t all;
    (void)arg;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals go to the program's threads */
    while (sem_wait(&term_sem) != 0 && errno == EINTR) {
    }
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)grace;
    ts.tv_nsec += (long)((grace - (double)(time_t)grace) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec += 1;
        ts.tv_nsec -= 1000000000L;
    }
    while (sem_timedwait(&done_sem, &ts) != 0 && errno == EINTR) {
    }
    default_and_kill();
    return NULL;
}

static int start_reaper(void)
{
    pthread_t t;
    pthread_attr_t attr;
    int rc;
    if (sems_ready) {
        sem_destroy(&term_sem);
        sem_destroy(&done_sem);
    }
    if (sem_init(&term_sem, 0, 0) != 0 || sem_init(&done_sem, 0, 0) != 0)
        return -1;
    sems_ready = 1;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    rc = pthread_create(&t, &attr, reaper, NULL);
    pthread_attr_destroy(&attr);
    return rc == 0 ? 0 : -1;
}

static int installed(void)
{
    struct sigaction cur;
    if (sigaction(SIGTERM, NULL, &cur) != 0)
        return 0;
    return !(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == on_sigterm;
}

/* arm(wake_fd, grace) -> bool: install the handler where SIGTERM has its default action (or
   has this handler: the pipe and grace are updated). In a forked child, a new reaper. */
static PyObject *arm(PyObject *self, PyObject *args)
{
    int fd;
    double g;
    struct sigaction cur, sa;
    (void)self;
    if (!PyArg_ParseTuple(args, "id", &fd, &g))
        return NULL;
    if (sigaction(SIGTERM, NULL, &cur) != 0)
        Py_RETURN_FALSE;
    int ours = !(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == on_sigterm;
    if (!ours && (cur.sa_flags & SA_SIGINFO || cur.sa_handler != SIG_DFL))
        Py_RETURN_FALSE; /* the program's own handler, or SIG_IGN */
    if (armed_pid != getpid()) { /* first time in this process (or a forked child) */
        fired = 0;
        if (start_reaper() != 0)
            Py_RETURN_FALSE;
        armed_pid = getpid();
    }
    wake_fd = fd;
    grace = g > 0 ? g : 0.0;
    if (!ours) {
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sigterm;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART | SA_ONSTACK; /* the program's system calls go on */
        if (sigaction(SIGTERM, &sa, NULL) != 0)
            Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* disarm() -> None: after a SIGTERM, die of it now (the flush is done); else put SIGTERM's
   default action back, if this handler is still the one installed. */
static PyObject *disarm(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    if (fired && armed_pid == getpid()) {
        sem_post(&done_sem);
        Py_BEGIN_ALLOW_THREADS
        default_and_kill();
        for (;;)
            pause(); /* the signal is on its way */
        Py_END_ALLOW_THREADS
    }
    if (installed()) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = SIG_DFL;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
    }
    Py_RETURN_NONE;
}

/* is_armed() -> bool: whether this handler is SIGTERM's now. */
static PyObject *is_armed(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyBool_FromLong(installed() && armed_pid == getpid());
}

static PyMethodDef methods[] = {
    {"arm", arm, METH_VARARGS, "arm(wake_fd, grace) -> bool"},
    {"disarm", disarm, METH_NOARGS, "disarm() -> None"},
    {"is_armed", is_armed, METH_NOARGS, "is_armed() -> bool"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pprobe._sigterm", "Flush on SIGTERM, then die of it.", -1, methods,
};

PyMODINIT_FUNC PyInit__sigterm(void) { return PyModule_Create(&module); }
