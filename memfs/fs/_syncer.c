/*
 * memfs.fs._syncer — fdatasync on threads that never take Python's interpreter lock.
 *
 * The compiled twin of memfs.fs.syncer.PySyncer (the specification; MEMFS_IMPL=py selects
 * it). A Syncer owns N pthreads, a queue of jobs and an eventfd:
 *
 *   submit(fd, tag)  takes fd (the caller passes a descriptor of its own, e.g. a duplicate,
 *                    and does not close it: the syncer does) and queues the job; a thread
 *                    runs fdatasync on it, closes it, records (tag, errno: 0 on success)
 *                    and adds 1 to the eventfd. A descriptor that is not open is refused at
 *                    once (OSError EBADF); when submit raises, fd is still the caller's;
 *   fileno()         the eventfd: readable once completions are waiting;
 *   done()           drains the eventfd and returns the waiting completions, oldest first;
 *   close()          stops the threads once the queued jobs ran (their completions are
 *                    dropped) and closes the eventfd.
 *
 * An event loop waits on fileno() and calls done(): a completion costs it one wakeup, and no
 * thread competes with it for the interpreter lock (the Python twin's threads take it twice
 * per job).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

typedef struct job {
    struct job *next;
    int fd;
    long long tag;
    int err;
} job;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *queue, *queue_tail;  /* jobs to run */
    job *done, *done_tail;    /* jobs run, for done() */
    pthread_t *threads;
    int nthreads;
    int efd;
    int stopping;
    int initialized;
} Syncer;

static void *worker(void *arg) {
    Syncer *s = (Syncer *)arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->queue == NULL && !s->stopping)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->queue == NULL)
            break; /* stopping and nothing left */
        job *j = s->queue;
        s->queue = j->next;
        if (s->queue == NULL)
            s->queue_tail = NULL;
        pthread_mutex_unlock(&s->mu);
        j->err = fdatasync(j->fd) == 0 ? 0 : errno;
        close(j->fd);
        j->next = NULL;
        pthread_mutex_lock(&s->mu);
        if (s->done_tail)
            s->done_tail->next = j;
        else
            s->done = j;
        s->done_tail = j;
        /* Tell the loop after unlocking: woken while the mutex is held, its done() would
         * only block on it. */
        pthread_mutex_unlock(&s->mu);
        uint64_t one = 1;
        ssize_t w = write(s->efd, &one, sizeof one); /* cannot fail short of overflow */
        (void)w;
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void stop(Syncer *s) {
    if (!s->initialized)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < s->nthreads; i++)
        pthread_join(s->threads[i], NULL);
    Py_END_ALLOW_THREADS
    free(s->threads);
    s->threads = NULL;
    for (job *j = s->done; j;) {
        job *next = j->next;
        free(j);
        j = next;
    }
    s->done = s->done_tail = NULL;
    if (s->efd >= 0)
        close(s->efd);
    s->efd = -1;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    s->initialized = 0;
}

static int Syncer_init(Syncer *s, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"threads", NULL};
    int n = 8;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|i:Syncer", kwlist, &n))
        return -1;
    if (n < 1 || n > 256) {
        PyErr_SetString(PyExc_ValueError, "threads must be 1..256");
        return -1;
    }
    if (s->initialized) {
        PyErr_SetString(PyExc_RuntimeError, "Syncer already initialized");
        return -1;
    }
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->queue = s->queue_tail = s->done = s->done_tail = NULL;
    s->stopping = 0;
    s->threads = calloc((size_t)n, sizeof(pthread_t));
    if (s->threads == NULL) {
        close(s->efd);
        s->efd = -1;
        PyErr_NoMemory();
        return -1;
    }
    s->initialized = 1;
    s->nthreads = 0;
    for (int i = 0; i < n; i++) {
        int rc = pthread_create(&s->threads[i], NULL, worker, s);
        if (rc != 0) {
            stop(s);
            errno = rc;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        s->nthreads++;
    }
    return 0;
}

static PyObject *Syncer_submit(Syncer *s, PyObject *args) {
    int fd;
    long long tag;
    if (!PyArg_ParseTuple(args, "iL:submit", &fd, &tag))
        return NULL;
    if (!s->initialized || s->stopping) {
        PyErr_SetString(PyExc_ValueError, "Syncer is closed");
        return NULL;
    }
    if (fcntl(fd, F_GETFD) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    job *j = malloc(sizeof *j);
    if (j == NULL)
        return PyErr_NoMemory();
    j->fd = fd; /* ours from here on: the worker closes it */
    j->tag = tag;
    j->err = 0;
    j->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->queue_tail)
        s->queue_tail->next = j;
    else
        s->queue = j;
    s->queue_tail = j;
    pthread_mutex_unlock(&s->mu);
    /* Signalled after unlocking: a thread woken while the mutex is held would wake only to
     * wait for it (two more futex calls and a context switch per job). A waiting thread
     * cannot miss the job: it looks at the queue under the mutex before it waits. */
    pthread_cond_signal(&s->cv);
    Py_RETURN_NONE;
}

static PyObject *Syncer_done(Syncer *s, PyObject *Py_UNUSED(ignored)) {
    if (!s->initialized) {
        PyErr_SetString(PyExc_ValueError, "Syncer is closed");
        return NULL;
    }
    uint64_t count;
    ssize_t r = read(s->efd, &count, sizeof count); /* EAGAIN when nothing is waiting */
    (void)r;
    pthread_mutex_lock(&s->mu);
    job *list = s->done;
    s->done = s->done_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    PyObject *out = PyList_New(0);
    while (list) {
        job *next = list->next;
        if (out != NULL) {
            PyObject *item = Py_BuildValue("(Li)", list->tag, list->err);
            if (item == NULL || PyList_Append(out, item) < 0)
                Py_CLEAR(out);
            Py_XDECREF(item);
        }
        free(list);
        list = next;
    }
    return out;
}

static PyObject *Syncer_fileno(Syncer *s, PyObject *Py_UNUSED(ignored)) {
    if (!s->initialized) {
        PyErr_SetString(PyExc_ValueError, "Syncer is closed");
        return NULL;
    }
    return PyLong_FromLong(s->efd);
}

static PyObject *Syncer_close(Syncer *s, PyObject *Py_UNUSED(ignored)) {
    stop(s);
    Py_RETURN_NONE;
}

static void Syncer_dealloc(Syncer *s) {
    stop(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMethodDef Syncer_methods[] = {
    {"submit", (PyCFunction)Syncer_submit, METH_VARARGS, "submit(fd, tag): fdatasync fd on a thread, then close it (the syncer takes fd)."},
    {"done", (PyCFunction)Syncer_done, METH_NOARGS, "done() -> [(tag, errno), ...]: the completions waiting."},
    {"fileno", (PyCFunction)Syncer_fileno, METH_NOARGS, "The eventfd, readable when completions wait."},
    {"close", (PyCFunction)Syncer_close, METH_NOARGS, "Run what is queued, stop the threads, close the eventfd."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SyncerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "memfs.fs._syncer.Syncer",
    .tp_basicsize = sizeof(Syncer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "fdatasync on threads without the interpreter lock; completions on an eventfd.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Syncer_init,
    .tp_dealloc = (destructor)Syncer_dealloc,
    .tp_methods = Syncer_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "memfs.fs._syncer", "fdatasync off the event loop, without the GIL.", -1, NULL,
};

PyMODINIT_FUNC PyInit__syncer(void) {
    if (PyType_Ready(&SyncerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&SyncerType);
    if (PyModule_AddObject(m, "Syncer", (PyObject *)&SyncerType) < 0) {
        Py_DECREF(&SyncerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
