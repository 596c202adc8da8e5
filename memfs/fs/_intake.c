/*
 * memfs.fs._intake — the mount's requests read from /dev/fuse by threads of its own.
 *
 * pyfuse3 reads each FUSE request on its trio event loop: a pass of the loop, a task switch
 * and Python around every request, ~100 µs of CPU per request here. An `fsync`-mode append
 * then also waited for a syncer thread, so one writer reached under half of native
 * `write`+`fdatasync` (SPEC §6 forbids the loop itself to wait for the disk). With the intake,
 * threads of this module read the requests instead:
 *
 *   a WRITE (in memfs only events.jsonl is ever open for writing) is served on the thread that
 *   read it: its line is committed under the interpreter lock by the Python callable given to
 *   start() (see run_job for what it returns) — called by this thread, or by the one that holds
 *   the lock for all the writes waiting for it ("combining", below) — then, without the lock,
 *   the thread runs the fdatasync the callback asked for and writes the reply itself.
 *   A thread that takes a write while no other thread waits in /dev/fuse starts one (at most
 *   MAX_THREADS), so a slow write never holds up other requests; a thread that finds MAX_IDLE
 *   others waiting when it is done with a write ends (with 2, 8 writers into 8 sessions made
 *   threads end and start again: 23 at the peak, and 6.9k against 10.8k ev/s with 8; with 16
 *   and combining, 1.05, 1.37 and 1.14 of 8 in three interleaved runs);
 *   anything else is queued, whole, for the event loop. pyfuse3's read loop takes it from the
 *   queue: this module defines the two libfuse functions that loop calls,
 *   fuse_session_fd() (pyfuse3 waits for its descriptor to become readable: here, an eventfd
 *   counting the queued requests) and fuse_session_receive_buf() (here, a pop from the
 *   queue). It is loaded with RTLD_GLOBAL before pyfuse3 (memfs/fs/intake.py), so the
 *   dynamic linker binds pyfuse3's calls to these; until arm() they forward to libfuse's.
 *
 * The Python twin is pyfuse3's own reading, which serves every request on the loop as before
 * (memfs/fs/intake.py says when each is used: the intake only in `fsync`-mode mounts).
 *
 * The threads run under Linux's SCHED_BATCH policy (same nice level): a batch thread that
 * wakes — a request read, its fdatasync done, its combined write committed — does not preempt
 * the thread running on its CPU. That is often the one holding the interpreter lock for the
 * queued writes of all the others (combining, below), and a preempted combiner held up every
 * write queued behind it: with 8 writers into 8 sessions its log write() was preempted in the
 * kernel (cond_resched in generic_perform_write) often enough that writes over 50 µs made 40%
 * of the time spent in write(), p99 120 µs. Counted in the threads, 4 s of 8×8 each: a commit
 * 27.5 → 21.6 µs, the wait of a write queued behind the combiner 179 → 110 µs. Side by side,
 * six runs of 7–11 rounds: 8×8 1.07–1.19× (median 1.14), one writer 0.94–1.07× (median 0.97,
 * within this machine's noise: there is rarely anything to preempt).
 *
 * Ending: the kernel ends the session (unmount: a read fails with ENODEV), and the thread that
 * sees it marks the queue ended: pyfuse3's tasks then get 0 from fuse_session_receive_buf and
 * libfuse's exit flag is set, as libfuse's own read does. stop() ends the threads (a thread in
 * the middle of a write finishes it first; one waiting in read() is woken by a signal of its
 * own, INTAKE_SIGNAL, whose handler does nothing).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define FUSE_USE_VERSION 31
#include <fuse3/fuse_lowlevel.h>
#include <linux/fuse.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 32
#define MAX_IDLE 16                          /* a thread done with a write ends if as many wait */
#define INTAKE_SIGNAL (SIGRTMIN + 7)         /* wakes a thread blocked in read() at stop() */

typedef struct item {
    struct item *next;
    size_t len;
    char data[];
} item;

/* --- state (one FUSE session per process) --------------------------------------------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t exited_cv = PTHREAD_COND_INITIALIZER;
static item *q_head, *q_tail;                /* requests for the event loop, oldest first */
static int qfd = -1;                         /* eventfd (semaphore): one count per queued request */
static atomic_int armed;                     /* the two libfuse functions serve the queue */
static atomic_int ended;                     /* the kernel ended the session */
static atomic_int stopping;
static int devfd = -1;                       /* our duplicate of the session's /dev/fuse */
static size_t bufsize;                       /* what libfuse reads with: max_write + a header */
static PyObject *callback;                   /* callback(fh, off, data, may_hop): see run_job */
static pthread_t threads[MAX_THREADS];
static int live[MAX_THREADS];                /* slot in use */
static int nthreads, idle, starting, peak;   /* under mu; starting: spawned, not yet reading */
static atomic_llong n_writes, n_forwarded, n_fd_calls;

static int (*real_receive)(struct fuse_session *, struct fuse_buf *);
static int (*real_fd)(struct fuse_session *);
static void (*real_exit)(struct fuse_session *);

static void *libfuse_symbol(const char *name)
{
    void *lib = dlopen("libfuse3.so.3", RTLD_NOW | RTLD_NOLOAD);
    void *sym = NULL;
    if (lib != NULL) {
        sym = dlvsym(lib, name, "FUSE_3.0");
        if (sym == NULL)
            sym = dlsym(lib, name);
        dlclose(lib);
    }
    if (sym == NULL) {
        fprintf(stderr, "memfs intake: libfuse3's %s not found\n", name);
        abort();
    }
    return sym;
}

static void resolve(void)
{
    if (real_receive == NULL) {
        real_fd = libfuse_symbol("fuse_session_fd");
        real_exit = libfuse_symbol("fuse_session_exit");
        real_receive = libfuse_symbol("fuse_session_receive_buf");
    }
}

/* --- the two libfuse functions pyfuse3's loop calls ------------------------------------ */

int fuse_session_fd(struct fuse_session *se)
{
    if (atomic_load(&armed)) {
        atomic_fetch_add(&n_fd_calls, 1);
        return qfd;
    }
    resolve();
    return real_fd(se);
}

int fuse_session_receive_buf(struct fuse_session *se, struct fuse_buf *buf)
{
    uint64_t one;
    item *it;

    if (!atomic_load(&armed)) {
        resolve();
        return real_receive(se, buf);
    }
    it = NULL;
    if (read(qfd, &one, sizeof one) == sizeof one) {
        pthread_mutex_lock(&mu);
        it = q_head;
        if (it != NULL) {
            q_head = it->next;
            if (q_head == NULL)
                q_tail = NULL;
        }
        pthread_mutex_unlock(&mu);
    }
    if (it == NULL) {  /* nothing queued (another task took it), or the end's count */
        if (atomic_load(&ended)) {
            resolve();
            real_exit(se);
            one = 1;
            (void)!write(qfd, &one, sizeof one);  /* the other tasks waiting see it too */
            return 0;
        }
        return -EINTR;  /* pyfuse3 waits again */
    }
    if (buf->mem == NULL || malloc_usable_size(buf->mem) < it->len) {
        free(buf->mem);
        buf->mem = malloc(it->len < 65536 ? 65536 : it->len);
        if (buf->mem == NULL) {
            free(it);
            return -ENOMEM;
        }
    }
    memcpy(buf->mem, it->data, it->len);
    buf->size = it->len;
    buf->flags = 0;
    buf->pos = 0;
    free(it);
    return (int)buf->size;
}

/* --- a reply pyfuse3 cannot shape ------------------------------------------------------ */

/* A handle opened read-only has nothing to flush: memfs's flush handler commits a writer's
 * final fragment (SPEC §6: close() reports a bad last line) and does nothing else. Every
 * close() of a reader still sent a FLUSH and waited for its reply — one of the five requests
 * `stat f; cat f` waits for — because pyfuse3's FileInfo cannot say FOPEN_NOFLUSH. This
 * module's fuse_reply_open (bound before libfuse's, as the two above, in every mount this
 * module is loaded in) sets it for handles opened O_RDONLY (opendir's reply too, where it
 * changes nothing: a directory is never flushed). Its twin (MEMFS_IMPL=py) sends
 * them, answered by the same handler, which returns at once. */
#if FUSE_MAJOR_VERSION > 3 || FUSE_MINOR_VERSION >= 11  /* (fuse_file_info.noflush: libfuse 3.11) */
static int (*real_reply_open)(fuse_req_t, const struct fuse_file_info *);
static atomic_long n_noflush;

int fuse_reply_open(fuse_req_t req, const struct fuse_file_info *f)
{
    if (real_reply_open == NULL)
        real_reply_open = libfuse_symbol("fuse_reply_open");
    if ((f->flags & O_ACCMODE) == O_RDONLY && !f->noflush) {
        struct fuse_file_info copy = *f;
        copy.noflush = 1;
        atomic_fetch_add(&n_noflush, 1);
        return real_reply_open(req, &copy);
    }
    return real_reply_open(req, f);
}
#else  /* built against an older libfuse: readers' close() sends FLUSH, as with the twin */
static atomic_long n_noflush = -1;
#endif

/* --- the threads ------------------------------------------------------------------------ */

static void forward(const char *data, size_t len)
{
    item *it = malloc(sizeof(item) + len);
    uint64_t one = 1;
    if (it == NULL)
        return;  /* the request stays unanswered, as on any server out of memory */
    it->next = NULL;
    it->len = len;
    memcpy(it->data, data, len);
    pthread_mutex_lock(&mu);
    if (q_tail != NULL)
        q_tail->next = it;
    else
        q_head = it;
    q_tail = it;
    pthread_mutex_unlock(&mu);
    (void)!write(qfd, &one, sizeof one);
    atomic_fetch_add(&n_forwarded, 1);
}

static void end_session(void)
{
    uint64_t one = 1;
    atomic_store(&ended, 1);
    (void)!write(qfd, &one, sizeof one);
}

static void reply(uint64_t unique, int error, uint32_t written)
{
    struct fuse_out_header out = {.len = sizeof out, .error = error, .unique = unique};
    struct fuse_write_out wo = {.size = written};
    struct iovec iov[2] = {{&out, sizeof out}, {&wo, sizeof wo}};
    int n = 1;
    if (error == 0) {
        out.len += sizeof wo;
        n = 2;
    }
    /* ENOENT: the request was interrupted and withdrawn meanwhile; nothing to do */
    (void)!writev(devfd, iov, n);
}

/* A thread's Python side: its thread state, and the condition its queued writes wait on. */
typedef struct {
    PyThreadState *ts;
    PyGILState_STATE gil;
    pthread_cond_t cv;
} pyside;

static void take_gil(pyside *py)
{
    if (py->ts == NULL)
        py->gil = PyGILState_Ensure();  /* this thread's Python state, kept until it ends */
    else
        PyEval_RestoreThread(py->ts);
}

/* --- combining: one thread holds the interpreter lock for the writes that wait for it -------
 *
 * The writes of several writers tend to arrive together (their fdatasyncs end together, and
 * the writers' next writes follow at once), and each needs the interpreter lock for its
 * commit: taken in turn, thread by thread, each hand-over of the lock cost a wakeup, and 8
 * writers into 8 sessions waited ~190 µs per write for it, more than the commit's own
 * ~20 µs. So a thread that needs the lock queues its write; the first one finding nobody at
 * the queue takes the lock and commits every queued write in order (at most MAX_COMBINE, then
 * it hands the queue to the next write's thread), waking each write's thread as soon as its
 * commit is done: that thread then runs its fdatasync and replies, without the lock. The
 * callback never waits for the disk here: a write that may (a cap rewrite, the session's
 * lock) comes back as None and its own thread serves it afterwards, the lock released while it
 * waits. The end_sync(goal) of a synced write is queued as a report, made by the next thread
 * that holds the lock (a sync of its own would only be redundant meanwhile), or at stop(). */
typedef struct job {
    struct job *next;
    const char *buf;          /* the WRITE request as read */
    pthread_cond_t *cv;       /* its thread waits on it */
    int state;                /* 0 queued, 1 committed, 2 its thread serves the queue */
    int hop;                  /* the callback returned None: its own thread serves it */
    long long result;         /* bytes written, or -errno */
    int sync_fd;              /* >= 0: fdatasync (a duplicate, closed here) before the reply */
    PyObject *synced, *goal;  /* end_sync(goal), to report once synced */
} job;

typedef struct report {
    struct report *next;
    PyObject *synced, *goal;
    int call;                 /* 0: the sync failed, only release the references */
} report;

#define MAX_COMBINE 16
static pthread_mutex_t cmu = PTHREAD_MUTEX_INITIALIZER;  /* the queue, combining, reports */
static job *j_head, *j_tail;
static int combining;                                    /* a thread serves the queue */
static report *reports;
static atomic_llong n_combined;                          /* writes committed by another thread */

/* The end_syncs of finished syncs (the interpreter lock held). */
static void drain_reports(void)
{
    report *r, *next;
    PyObject *ret;

    pthread_mutex_lock(&cmu);
    r = reports;
    reports = NULL;
    pthread_mutex_unlock(&cmu);
    for (; r != NULL; r = next) {
        next = r->next;
        if (r->call) {
            ret = PyObject_CallOneArg(r->synced, r->goal);
            if (ret == NULL)
                PyErr_WriteUnraisable(r->synced);
            Py_XDECREF(ret);
        }
        Py_DECREF(r->synced);
        Py_DECREF(r->goal);
        free(r);
    }
}

/* callback(fh, offset, data, may_hop) for one write (the interpreter lock held). It returns
 * the bytes written, -errno, (written, fd, end_sync, goal) — fdatasync fd before the reply,
 * then report goal to end_sync — or, with may_hop false, None for a write that may block. */
static void run_job(job *j, int may_hop)
{
    const struct fuse_in_header *in = (const void *)j->buf;
    const struct fuse_write_in *arg = (const void *)(j->buf + sizeof *in);
    const char *data = j->buf + sizeof *in + sizeof *arg;
    PyObject *args[4], *ret;

    j->result = -EIO;
    j->hop = 0;
    args[0] = PyLong_FromUnsignedLongLong(arg->fh);
    args[1] = PyLong_FromLongLong((long long)arg->offset);
    args[2] = PyBytes_FromStringAndSize(data, arg->size);
    args[3] = may_hop ? Py_True : Py_False;
    if (args[0] != NULL && args[1] != NULL && args[2] != NULL) {
        ret = PyObject_Vectorcall(callback, args, 4, NULL);
        if (ret == Py_None && !may_hop) {
            j->hop = 1;
        } else if (ret != NULL && PyTuple_Check(ret) && PyTuple_GET_SIZE(ret) == 4) {
            j->result = PyLong_AsLongLong(PyTuple_GET_ITEM(ret, 0));
            j->sync_fd = (int)PyLong_AsLong(PyTuple_GET_ITEM(ret, 1));
            j->synced = PyTuple_GET_ITEM(ret, 2);
            j->goal = PyTuple_GET_ITEM(ret, 3);
            Py_INCREF(j->synced);
            Py_INCREF(j->goal);
        } else if (ret != NULL) {
            j->result = PyLong_AsLongLong(ret);
        }
        Py_XDECREF(ret);
    }
    Py_XDECREF(args[0]);
    Py_XDECREF(args[1]);
    Py_XDECREF(args[2]);
    if (PyErr_Occurred()) {
        PyErr_WriteUnraisable(callback);
        j->result = -EIO;
        j->hop = 0;
    }
}

/* Commit the queued writes, this thread's own first (the interpreter lock held; this thread
 * is the one serving the queue). */
static void combine(void)
{
    job *j;
    int n = 0;

    drain_reports();
    for (;;) {
        pthread_mutex_lock(&cmu);
        j = j_head;
        if (j == NULL) {
            combining = 0;
            pthread_mutex_unlock(&cmu);
            return;
        }
        if (n == MAX_COMBINE) {  /* enough: the next write's thread serves the rest */
            j->state = 2;
            pthread_cond_signal(j->cv);
            pthread_mutex_unlock(&cmu);
            return;
        }
        j_head = j->next;
        if (j_head == NULL)
            j_tail = NULL;
        pthread_mutex_unlock(&cmu);
        run_job(j, 0);
        n++;
        pthread_mutex_lock(&cmu);
        j->state = 1;
        pthread_cond_signal(j->cv);
        pthread_mutex_unlock(&cmu);
    }
}

/* Serve one WRITE on this thread (see the top of the file and "combining" above). */
static void serve_write(const char *buf, size_t len, pyside *py)
{
    const struct fuse_in_header *in = (const void *)buf;
    const struct fuse_write_in *arg = (const void *)(buf + sizeof *in);
    job j = {.buf = buf, .cv = &py->cv, .result = -EIO, .sync_fd = -1};
    report *r;
    int serve;

    if (len < sizeof *in + sizeof *arg || len - sizeof *in - sizeof *arg < arg->size) {
        reply(in->unique, -EIO, 0);
        return;
    }
    pthread_mutex_lock(&cmu);
    if (j_tail != NULL)
        j_tail->next = &j;
    else
        j_head = &j;
    j_tail = &j;
    if (combining) {
        while (j.state == 0)
            pthread_cond_wait(&py->cv, &cmu);
    } else {
        combining = 1;
        j.state = 2;
    }
    serve = j.state == 2;
    pthread_mutex_unlock(&cmu);
    if (serve || j.hop) {
        take_gil(py);
        if (serve)
            combine();
        if (j.hop)
            run_job(&j, 1);  /* may wait (a cap rewrite on a worker), the lock released meanwhile */
        py->ts = PyEval_SaveThread();
    }
    if (!serve && !j.hop)  /* (a write given back was committed by its own thread) */
        atomic_fetch_add(&n_combined, 1);
    if (j.sync_fd >= 0) {
        if (fdatasync(j.sync_fd) != 0 && j.result >= 0)
            j.result = -errno;  /* the lines are in the log, as when an append's own sync fails */
        close(j.sync_fd);
    }
    if (j.synced != NULL) {
        r = malloc(sizeof *r);
        if (r != NULL) {
            r->synced = j.synced;
            r->goal = j.goal;
            r->call = j.result >= 0;
            pthread_mutex_lock(&cmu);
            r->next = reports;
            reports = r;
            pthread_mutex_unlock(&cmu);
        } else {  /* (no report: the log only learns of this sync later) */
            PyEval_RestoreThread(py->ts);
            Py_DECREF(j.synced);
            Py_DECREF(j.goal);
            py->ts = PyEval_SaveThread();
        }
    }
    atomic_fetch_add(&n_writes, 1);
    if (j.result >= 0)
        reply(in->unique, 0, (uint32_t)j.result);
    else
        reply(in->unique, (int)(j.result < -4095 ? -EIO : j.result), 0);
}

static int spawn_locked(void);

static void *reader(void *slot_arg)
{
    int slot = (int)(intptr_t)slot_arg;
    char *buf = malloc(bufsize);
    pyside py = {NULL, PyGILState_UNLOCKED, PTHREAD_COND_INITIALIZER};
    sigset_t only;

    sigfillset(&only);
    sigdelset(&only, INTAKE_SIGNAL);
    pthread_sigmask(SIG_SETMASK, &only, NULL);
    {
        struct sched_param none = {0};
        (void)sched_setscheduler(0, SCHED_BATCH, &none);  /* this thread (see the top; a failure
                                                               leaves it as it was) */
    }
    pthread_mutex_lock(&mu);
    starting--;  /* (counted as a reader from now on: idle, or serving) */
    pthread_mutex_unlock(&mu);
    while (buf != NULL && !atomic_load(&stopping) && !atomic_load(&ended)) {
        ssize_t n;
        const struct fuse_in_header *in = (const void *)buf;
        int keep;

        pthread_mutex_lock(&mu);
        idle++;
        pthread_mutex_unlock(&mu);
        n = atomic_load(&stopping) ? -1 : read(devfd, buf, bufsize);
        if (n < 0 && atomic_load(&stopping))
            errno = EINTR;
        pthread_mutex_lock(&mu);
        idle--;
        if (n >= (ssize_t)sizeof *in && in->opcode == FUSE_WRITE && idle == 0 && starting == 0)
            spawn_locked();  /* someone must keep reading while this write waits (a thread that
                                is starting will: a burst of writes no longer starts one each;
                                8 writers peaked at 11 threads against 11-13, once 31 before) */
        pthread_mutex_unlock(&mu);
        if (n < 0) {
            if (errno == ENODEV) {
                end_session();
                break;
            }
            continue;  /* EINTR, EAGAIN; ENOENT: a request withdrawn before it was read */
        }
        if ((size_t)n < sizeof *in)
            continue;
        if (in->opcode == FUSE_WRITE) {
            serve_write(buf, (size_t)n, &py);
            pthread_mutex_lock(&mu);
            keep = idle < MAX_IDLE;
            pthread_mutex_unlock(&mu);
            if (!keep)
                break;
        } else {
            forward(buf, (size_t)n);
        }
    }
    free(buf);
    if (py.ts != NULL) {
        take_gil(&py);
        drain_reports();
        PyGILState_Release(py.gil);
    }
    pthread_cond_destroy(&py.cv);
    pthread_mutex_lock(&mu);
    live[slot] = 0;
    nthreads--;
    pthread_cond_broadcast(&exited_cv);
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* Start a reader (caller holds mu); 0 when none could be started. */
static int spawn_locked(void)
{
    pthread_attr_t attr;
    sigset_t all, old;
    int slot, err;

    if (atomic_load(&stopping) || nthreads >= MAX_THREADS)
        return 0;
    for (slot = 0; live[slot]; slot++)
        ;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);  /* no signal reaches it before it chose its mask */
    err = pthread_create(&threads[slot], &attr, reader, (void *)(intptr_t)slot);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (err != 0)
        return 0;
    live[slot] = 1;
    nthreads++;
    starting++;
    if (nthreads > peak)
        peak = nthreads;
    return 1;
}

static void on_signal(int sig)
{
    (void)sig;
}

/* --- the module's functions ---------------------------------------------------------------- */

static PyObject *intake_arm(PyObject *self, PyObject *noargs)
{
    if (qfd < 0) {
        qfd = eventfd(0, EFD_SEMAPHORE | EFD_NONBLOCK | EFD_CLOEXEC);
        if (qfd < 0)
            return PyErr_SetFromErrno(PyExc_OSError);
    }
    atomic_store(&armed, 1);
    return PyLong_FromLong(qfd);
}

static PyObject *intake_disarm(PyObject *self, PyObject *noargs)
{
    atomic_store(&armed, 0);
    Py_RETURN_NONE;
}

static PyObject *intake_start(PyObject *self, PyObject *args)
{
    int fd, threads, i, started = 0;
    PyObject *cb;
    struct sigaction sa;

    if (!PyArg_ParseTuple(args, "iOi:start", &fd, &cb, &threads))
        return NULL;
    if (!atomic_load(&armed) || devfd >= 0) {
        PyErr_SetString(PyExc_RuntimeError, "intake: not armed, or started already");
        return NULL;
    }
    devfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (devfd < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;  /* no SA_RESTART: a read() it interrupts returns EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(INTAKE_SIGNAL, &sa, NULL);
    bufsize = 256 * (size_t)sysconf(_SC_PAGESIZE) + 4096;

    Py_INCREF(cb);
    callback = cb;
    atomic_store(&stopping, 0);
    pthread_mutex_lock(&mu);
    for (i = 0; i < (threads < 1 ? 1 : threads); i++)
        started += spawn_locked();
    pthread_mutex_unlock(&mu);
    if (!started) {
        PyErr_SetString(PyExc_OSError, "intake: no thread could be started");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *intake_stop(PyObject *self, PyObject *noargs)
{
    struct timespec until;
    int i;

    if (devfd < 0)
        Py_RETURN_NONE;
    atomic_store(&stopping, 1);
    Py_BEGIN_ALLOW_THREADS  /* a thread finishing a write needs the interpreter lock */
    pthread_mutex_lock(&mu);
    while (nthreads > 0) {
        for (i = 0; i < MAX_THREADS; i++)
            if (live[i])
                pthread_kill(threads[i], INTAKE_SIGNAL);
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 10 * 1000 * 1000;  /* again in 10 ms: a signal may precede its read() */
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&exited_cv, &mu, &until);
    }
    pthread_mutex_unlock(&mu);
    Py_END_ALLOW_THREADS
    close(devfd);
    devfd = -1;
    drain_reports();  /* the last syncs' reports */
    Py_CLEAR(callback);
    Py_RETURN_NONE;
}

static PyObject *intake_stats(PyObject *self, PyObject *noargs)
{
    int threads, top;
    pthread_mutex_lock(&mu);
    threads = nthreads;
    top = peak;
    pthread_mutex_unlock(&mu);
    return Py_BuildValue("{sLsLsLsLsLsisisi}", "writes", (long long)atomic_load(&n_writes),
                         "noflush", (long long)atomic_load(&n_noflush),
                         "combined", (long long)atomic_load(&n_combined),
                         "forwarded", (long long)atomic_load(&n_forwarded),
                         "fd_calls", (long long)atomic_load(&n_fd_calls),
                         "threads", threads, "peak_threads", top, "armed", atomic_load(&armed));
}

static PyMethodDef methods[] = {
    {"arm", intake_arm, METH_NOARGS,
     "arm() -> fd: pyfuse3's fuse_session_fd() returns the queue's eventfd from now on"},
    {"disarm", intake_disarm, METH_NOARGS, "disarm(): libfuse's own functions again (before start)"},
    {"start", intake_start, METH_VARARGS,
     "start(fuse_fd, callback, threads): read requests from fuse_fd on threads; writes go to\n"
     "callback(fh, offset, data, may_hop) (see run_job)"},
    {"stop", intake_stop, METH_NOARGS, "stop(): end the threads (a write in progress finishes)"},
    {"stats", intake_stats, METH_NOARGS, "stats() -> dict of counters"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "memfs.fs._intake", NULL, -1, methods};

PyMODINIT_FUNC PyInit__intake(void)
{
    return PyModule_Create(&module);
}
