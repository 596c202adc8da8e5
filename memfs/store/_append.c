/* memfs.store._append — SessionHandle.append and one-line LineAppender.write, compiled (SPEC §3, §6).
 *
 * Every single append of the library and of the filesystem (one line per write() through the
 * mount) runs append(); a write() of exactly one line reaches it from LineAppender.write
 * without a Python frame in between (the appender's other writes stay in Python,
 * memfs/store/appender.py). As Python this was a third of a mounted append's own work,
 * and between two FUSE round trips each interpreted line costs several times what it costs
 * in a loop (see "Decisions" in README.md). It is a line-for-line rendering of the rules
 * memfs/store/log.py documents; everything that is not the straight path calls back into
 * the Python that owns it:
 *
 *   validation           memfs.events.parse_line (itself C), or _Shared.check_line for
 *                        anything but bytes within max_line_bytes on an open handle
 *   a refused line       _Shared.refuse (rejected.jsonl), then the ValidationError is raised
 *   the state machine    memfs.store.machine.apply, once per line: the only one
 *   pending bytes        _Shared.write_pending
 *   metadata             _Shared.request_persist at boundaries (and 64 KiB, buffered mode)
 *   the event cap        memfs.store.evict.enforce_cap
 *   fsync mode           _Shared.sync_to, after the session's mutex is released
 *
 * SessionHandle and _Shared have __slots__: configure() looks up where each slot this
 * function uses lives in the object, once, so reading a field is a load, as it is for the
 * interpreter.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <errno.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* the _Shared slots this function reads or writes */
#define SLOTS(X) X(closed) X(pending) X(flushed_len) X(mode) X(fd) X(state) X(persist_at) \
                 X(max_events) X(max_line_bytes) X(dropped) X(version) X(last_change) X(mutex)
/* and SessionHandle's */
#define HANDLE_SLOTS(X) X(_s) X(_closed) X(_read_only)
#define DECLARE_OFFSET(name) Py_ssize_t name;
#define SLOT_NAME(name) #name,

static struct {
    PyTypeObject *shared_type, *handle_type;
    struct { SLOTS(DECLARE_OFFSET) } at;
    struct { HANDLE_SLOTS(DECLARE_OFFSET) } handle_at;
    PyObject *parse_line, *apply, *enforce_cap, *now_rfc3339;
    PyObject *acquire, *release;  /* the mutex type's methods, unbound */
    PyObject *validation_error, *session_closed, *cap_error;
    PyObject *turn_started;   /* the Kind member that opens a turn (its entry gets a time) */
    char boundary[16];        /* by Kind value: the line is a turn boundary */
    Py_ssize_t nkinds, buffer_limit;
    long fsync_mode;
    PyObject *s_writable, *s_check_line, *s_refuse, *s_write_pending,
        *s_request_persist, *s_sync_to, *s_accepted, *s_event_count, *empty;
    int ready;
} A;

/* A slot's value (borrowed), or NULL with AttributeError when it was never set. */
static inline PyObject *slot(PyObject *obj, Py_ssize_t offset, const char *name)
{
    PyObject *value = *(PyObject **)((char *)obj + offset);
    if (value == NULL)
        PyErr_Format(PyExc_AttributeError, "%.100s has no %s", Py_TYPE(obj)->tp_name, name);
    return value;
}
#define GET(s, name) slot((s), A.at.name, #name)
#define GET_HANDLE(h, name) slot((h), A.handle_at.name, #name)
/* Replace a slot's value; steals ``value``. */
#define SET(s, name, value) Py_XSETREF(*(PyObject **)((char *)(s) + A.at.name), (value))

static int get_ssize(PyObject *s, Py_ssize_t offset, const char *name, Py_ssize_t *out)
{
    PyObject *v = slot(s, offset, name);
    if (v == NULL)
        return -1;
    *out = PyLong_AsSsize_t(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}
#define GET_SSIZE(s, name, out) get_ssize((s), A.at.name, #name, (out))

static int set_ssize(PyObject *s, Py_ssize_t offset, Py_ssize_t value)
{
    PyObject *v = PyLong_FromSsize_t(value);
    if (v == NULL)
        return -1;
    Py_XSETREF(*(PyObject **)((char *)s + offset), v);
    return 0;
}
#define SET_SSIZE(s, name, value) set_ssize((s), A.at.name, (value))

static PyObject *call_method(PyObject *obj, PyObject *name, PyObject *arg1, PyObject *arg2, PyObject *arg3)
{
    PyObject *args[4] = {obj, arg1, arg2, arg3};
    size_t n = arg3 ? 4 : arg2 ? 3 : arg1 ? 2 : 1;
    return PyObject_VectorcallMethod(name, args, n | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* Set ``accepted`` on the pending exception when it is an OSError or a CapRewriteError (the
 * lines it covers). */
static void mark_accepted(int accepted)
{
    if (!PyErr_ExceptionMatches(PyExc_OSError) && !PyErr_ExceptionMatches(A.cap_error))
        return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *n = PyLong_FromLong(accepted);
    if (n == NULL || PyObject_SetAttr(value, A.s_accepted, n) < 0)
        PyErr_Clear();  /* the OSError itself matters more */
    Py_XDECREF(n);
    PyErr_Restore(type, value, tb);
}

/* write() ``line`` and a newline to ``fd``, whole (a short write is continued; EINTR is
 * retried after signal handlers ran, as os.write does). -1 with an exception set. */
static int write_line(int fd, const char *line, Py_ssize_t n)
{
    static const char newline = '\n';
    char copy[4096];
    struct iovec iov[2] = {{(void *)line, (size_t)n}, {(void *)&newline, 1}};
    int iovcnt = 2;
    if (n < (Py_ssize_t)sizeof copy) {  /* short: one write() of a copy costs less than writev() */
        memcpy(copy, line, n);
        copy[n] = '\n';
        iov[0].iov_base = copy;
        iov[0].iov_len = n + 1;
        iovcnt = 1;
    }
    struct iovec *v = iov;
    while (iovcnt) {
        ssize_t r;
        int err;
        Py_BEGIN_ALLOW_THREADS
        r = iovcnt == 1 ? write(fd, v->iov_base, v->iov_len) : writev(fd, v, iovcnt);
        err = errno;
        Py_END_ALLOW_THREADS
        if (r < 0) {
            if (err == EINTR) {
                if (PyErr_CheckSignals() < 0)
                    return -1;
                continue;
            }
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        while (iovcnt && (size_t)r >= v->iov_len) {
            r -= v->iov_len;
            v++;
            iovcnt--;
        }
        if (iovcnt) {
            v->iov_base = (char *)v->iov_base + r;
            v->iov_len -= r;
        }
    }
    return 0;
}

/* Lines that do not take the straight path: validated (and, refused, recorded) by Python. */
static PyObject *validate(PyObject *handle, PyObject *s, PyObject *line, PyObject *pid)
{
    PyObject *closed = GET_HANDLE(handle, _closed), *read_only = GET_HANDLE(handle, _read_only);
    PyObject *record = NULL;
    PyObject *limit = GET(s, max_line_bytes);
    if (closed == NULL || read_only == NULL || limit == NULL)
        return NULL;
    if (closed == Py_False && read_only == Py_False && PyBytes_CheckExact(line)
        && PyBytes_GET_SIZE(line) <= PyLong_AsSsize_t(limit)) {
        record = PyObject_Vectorcall(A.parse_line, &line, 1, NULL);
        if (record == NULL && PyErr_ExceptionMatches(A.validation_error)) {
            PyObject *type, *exc, *tb;
            PyErr_Fetch(&type, &exc, &tb);
            PyErr_NormalizeException(&type, &exc, &tb);
            PyObject *r = call_method(s, A.s_refuse, line, exc, pid);
            if (r != NULL) {
                Py_DECREF(r);
                PyErr_Restore(type, exc, tb);
            } else {  /* the refusal could not be recorded: that error is the one to raise */
                Py_XDECREF(type);
                Py_XDECREF(exc);
                Py_XDECREF(tb);
            }
        }
    } else if (!PyErr_Occurred()) {
        PyObject *r = call_method(handle, A.s_writable, NULL, NULL, NULL);
        if (r != NULL) {
            Py_DECREF(r);
            record = call_method(s, A.s_check_line, line, pid, NULL);
        }
    }
    return record;
}

static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* Add ``line`` and a newline after the ``held`` bytes of ``pending``. */
static int add_pending(PyObject *pending, Py_ssize_t held, const char *line, Py_ssize_t n)
{
    if (PyByteArray_Resize(pending, held + n + 1) < 0)
        return -1;
    memcpy(PyByteArray_AS_STRING(pending) + held, line, n);
    PyByteArray_AS_STRING(pending)[held + n] = '\n';
    return 0;
}

/* commit(), given the session's pending buffer and state (held by the caller). */
static int commit_line(PyObject *s, PyObject *line, PyObject *kind, PyObject *pending, PyObject *state,
                       Py_ssize_t *sync_target)
{
    PyObject *closed = GET(s, closed);
    Py_ssize_t flushed, mode, persist_at, max_events;
    if (closed == NULL || GET_SSIZE(s, flushed_len, &flushed) < 0
        || GET_SSIZE(s, mode, &mode) < 0 || GET_SSIZE(s, persist_at, &persist_at) < 0
        || GET_SSIZE(s, max_events, &max_events) < 0)
        return -1;
    int is_closed = PyObject_IsTrue(closed);
    if (is_closed < 0)
        return -1;
    if (is_closed) {  /* the last handle was closed while this append was validating */
        PyErr_SetString(A.session_closed, "session handle is closed");
        return -1;
    }
    if (!PyByteArray_CheckExact(pending)) {
        PyErr_SetString(PyExc_TypeError, "_Shared.pending must be a bytearray");
        return -1;
    }
    Py_ssize_t k = PyLong_AsSsize_t(kind);
    if (k < 0 || k >= A.nkinds) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "not a Kind: %R", kind);
        return -1;
    }
    const char *bytes = PyBytes_AS_STRING(line);
    Py_ssize_t n = PyBytes_GET_SIZE(line), held = PyByteArray_GET_SIZE(pending);
    Py_ssize_t offset = flushed + held, end = offset + n + 1;
    int boundary = A.boundary[k];
    /* Whenever the line has to reach the file now (write/fsync mode, a boundary, 64 KiB) its
     * bytes are written before the state changes: a failed write takes back just the line. */
    if (mode || boundary || end - flushed >= A.buffer_limit) {
        if (held == 0) {  /* the usual write-mode case: straight to the file */
            Py_ssize_t fd;
            if (GET_SSIZE(s, fd, &fd) < 0)
                return -1;
            if (write_line((int)fd, bytes, n) < 0) {
                /* part of it may be in the file: cut it, so that the next append cannot merge
                 * into a torn line (O_APPEND writes at the file's real end) */
                if (PyErr_ExceptionMatches(PyExc_OSError) && ftruncate((int)fd, flushed) < 0) {
                    PyErr_Clear();
                    PyErr_SetFromErrno(PyExc_OSError);
                }
                mark_accepted(0);
                return -1;
            }
            if (SET_SSIZE(s, flushed_len, end) < 0)
                return -1;
        } else {
            if (add_pending(pending, held, bytes, n) < 0)
                return -1;
            PyObject *r = call_method(s, A.s_write_pending, NULL, NULL, NULL);
            if (r == NULL) {
                if (PyErr_ExceptionMatches(PyExc_OSError)) {
                    /* earlier buffered lines stay pending (their appends succeeded); this one
                     * goes. A copy: the failed write may still hold a view of the old one. */
                    PyObject *kept = PyByteArray_FromStringAndSize(PyByteArray_AS_STRING(pending), held);
                    if (kept == NULL)
                        return -1;
                    SET(s, pending, kept);
                }
                mark_accepted(0);
                return -1;
            }
            Py_DECREF(r);
        }
    } else if (add_pending(pending, held, bytes, n) < 0) {
        return -1;
    }
    PyObject *changed = PyFloat_FromDouble(now_seconds());
    if (changed == NULL)
        return -1;
    SET(s, last_change, changed);

    PyObject *ts = kind == A.turn_started ? PyObject_CallNoArgs(A.now_rfc3339) : Py_NewRef(A.empty);
    PyObject *at = PyLong_FromSsize_t(offset), *to = PyLong_FromSsize_t(end), *r = NULL;
    if (ts != NULL && at != NULL && to != NULL) {
        PyObject *args[5] = {state, kind, at, to, ts};
        r = PyObject_Vectorcall(A.apply, args, 5, NULL);
    }
    Py_XDECREF(ts);
    Py_XDECREF(at);
    Py_XDECREF(to);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    Py_ssize_t version;
    if (GET_SSIZE(s, version, &version) < 0 || SET_SSIZE(s, version, version + 1) < 0)
        return -1;
    if (boundary || (end >= persist_at && !mode)) {  /* (64 KiB: buffered mode only) */
        if ((r = call_method(s, A.s_request_persist, NULL, NULL, NULL)) == NULL)
            return -1;
        Py_DECREF(r);
    }
    if (max_events) {
        PyObject *count = PyObject_GetAttr(state, A.s_event_count);
        if (count == NULL)
            return -1;
        Py_ssize_t events = PyLong_AsSsize_t(count);
        Py_DECREF(count);
        if (events == -1 && PyErr_Occurred())
            return -1;
        if (events > max_events) {
            if ((r = PyObject_Vectorcall(A.enforce_cap, &s, 1, NULL)) == NULL) {
                mark_accepted(1);  /* the line is accepted (in the log or still buffered) */
                return -1;
            }
            Py_DECREF(r);
        }
    }
    *sync_target = 0;
    if (mode == A.fsync_mode) {
        Py_ssize_t dropped;
        if (GET_SSIZE(s, dropped, &dropped) < 0 || GET_SSIZE(s, flushed_len, &flushed) < 0)
            return -1;
        *sync_target = dropped + flushed;
    }
    return 0;
}

/* The part under the session's mutex. Returns 0 or -1 (exception set); ``*sync_target`` is
 * the position fsync mode must reach once the mutex is released (0: none). */
static int commit(PyObject *s, PyObject *line, PyObject *kind, Py_ssize_t *sync_target)
{
    PyObject *pending = GET(s, pending), *state = GET(s, state);
    if (pending == NULL || state == NULL)
        return -1;
    Py_INCREF(pending);  /* held: Python code (write_pending, apply, ...) runs in between */
    Py_INCREF(state);
    int r = commit_line(s, line, kind, pending, state, sync_target);
    Py_DECREF(pending);
    Py_DECREF(state);
    return r;
}

PyDoc_STRVAR(append_doc,
"append($self, /, line, pid=None)\n--\n\n"
"Validate and append one event line (SPEC §2–§3).\n\n"
"``line`` is the raw JSON bytes or text (an envelope or a bare event; a trailing newline is\n"
"optional) or a dict to serialize. A refused line raises ValidationError carrying the reason\n"
"and is recorded in ``rejected.jsonl``; it never reaches ``events.jsonl``. If the event cap\n"
"cannot be enforced, CapRewriteError (``accepted`` 1) is raised *after* the event was\n"
"accepted. A failed write\n"
"raises OSError (``accepted`` 0: the line was taken back; 1: it is in the log and what failed\n"
"came after). ``pid`` is the writer's, recorded with a refused line (default: this process).\n"
"Compiled: memfs/store/_append.c.");

static PyObject *append(PyObject *handle, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *line = nargs > 0 ? args[0] : NULL, *pid = nargs > 1 ? args[1] : Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (!A.ready) {
        PyErr_SetString(PyExc_RuntimeError, "memfs.store._append is not configured");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, i);
        if (PyUnicode_CompareWithASCIIString(key, "pid") == 0 && nargs < 2)
            pid = args[nargs + i];
        else if (PyUnicode_CompareWithASCIIString(key, "line") == 0 && nargs < 1)
            line = args[nargs + i];
        else
            return PyErr_Format(PyExc_TypeError, "append() got an unexpected or repeated argument %R", key);
    }
    if (line == NULL || nargs > 2)
        return PyErr_Format(PyExc_TypeError, "append() takes a line and an optional pid");

    if (Py_TYPE(handle) != A.handle_type)
        return PyErr_Format(PyExc_TypeError, "append() needs a SessionHandle, not %.100s",
                            Py_TYPE(handle)->tp_name);
    PyObject *s = GET_HANDLE(handle, _s), *record = NULL, *mutex, *r;
    if (s == NULL)
        return NULL;
    if (Py_TYPE(s) != A.shared_type)
        return PyErr_Format(PyExc_TypeError, "SessionHandle._s is a %.100s", Py_TYPE(s)->tp_name);
    Py_INCREF(s);
    if ((record = validate(handle, s, line, pid)) == NULL)
        goto fail;
    if (!PyTuple_CheckExact(record) || PyTuple_GET_SIZE(record) != 4
        || !PyBytes_CheckExact(PyTuple_GET_ITEM(record, 0))) {
        PyErr_SetString(PyExc_TypeError, "a record is (line, type, event, kind)");
        goto fail;
    }
    if ((mutex = GET(s, mutex)) == NULL)
        goto fail;
    Py_INCREF(mutex);
    if ((r = PyObject_Vectorcall(A.acquire, &mutex, 1, NULL)) == NULL) {
        Py_DECREF(mutex);
        goto fail;
    }
    Py_DECREF(r);
    Py_ssize_t sync_target = 0;
    int failed = commit(s, PyTuple_GET_ITEM(record, 0), PyTuple_GET_ITEM(record, 3), &sync_target) < 0;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    r = PyObject_Vectorcall(A.release, &mutex, 1, NULL);
    Py_DECREF(mutex);
    if (r == NULL) {  /* cannot happen with the owner releasing; keep the first error */
        if (failed) {
            PyErr_Clear();
            PyErr_Restore(type, value, tb);
        } else {
            failed = 1;
        }
    } else {
        Py_DECREF(r);
        PyErr_Restore(type, value, tb);
    }
    if (failed)
        goto fail;
    if (sync_target) {
        PyObject *target = PyLong_FromSsize_t(sync_target);
        r = target ? call_method(s, A.s_sync_to, target, NULL, NULL) : NULL;
        Py_XDECREF(target);
        if (r == NULL)
            goto fail;
        Py_DECREF(r);
    }
    Py_DECREF(record);
    Py_DECREF(s);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(record);
    Py_DECREF(s);
    return NULL;
}

/* Make ``def`` a method of ``type`` (it replaces the placeholder of the class body). */
static int install(PyObject *type, PyMethodDef *def)
{
    PyObject *method = PyDescr_NewMethod((PyTypeObject *)type, def);
    if (method == NULL)
        return -1;
    int r = PyObject_SetAttrString(type, def->ml_name, method);
    Py_DECREF(method);
    return r;
}

/* Where each named slot of ``type`` lives in its objects, into ``offsets``. */
static int find_slots(PyTypeObject *type, const char *const *names, Py_ssize_t *offsets)
{
    for (int i = 0; names[i]; i++) {
        PyObject *descr = PyDict_GetItemString(type->tp_dict, names[i]);
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)
            || ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "%s.%s must be a slot", type->tp_name, names[i]);
            return -1;
        }
        offsets[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
    }
    return 0;
}

static PyMethodDef append_def = {"append", (PyCFunction)(void (*)(void))append, METH_FASTCALL | METH_KEYWORDS,
                                 append_doc};

/* --- LineAppender.write ------------------------------------------------------------------- */

static struct {
    PyTypeObject *type;
    struct { Py_ssize_t handle, pid, partial; } at;
    PyObject *s_write_lines, *s_after_error;
    int ready;
} W;

PyDoc_STRVAR(write_doc,
"write($self, data, /)\n--\n\n"
"Append the complete lines of ``partial + data``; return how many bytes of ``data`` were\n"
"taken (see memfs.store.appender). Compiled: a write that is exactly one line, with no\n"
"fragment held, goes straight to SessionHandle.append; any other to _write_lines.");

static PyObject *appender_write(PyObject *self, PyObject *data)
{
    if (!W.ready) {
        PyErr_SetString(PyExc_RuntimeError, "memfs.store._append is not configured for LineAppender");
        return NULL;
    }
    if (!PyObject_TypeCheck(self, W.type))
        return PyErr_Format(PyExc_TypeError, "write() needs a LineAppender, not %.100s",
                            Py_TYPE(self)->tp_name);
    if (Py_TYPE(self) == W.type && PyBytes_CheckExact(data)) {
        PyObject *handle = slot(self, W.at.handle, "handle"), *pid = slot(self, W.at.pid, "pid");
        PyObject *partial = slot(self, W.at.partial, "partial");
        if (handle == NULL || pid == NULL || partial == NULL)
            return NULL;
        const char *p = PyBytes_AS_STRING(data);
        Py_ssize_t n = PyBytes_GET_SIZE(data);
        if (PyByteArray_CheckExact(partial) && PyByteArray_GET_SIZE(partial) == 0 && n > 0
            && memchr(p, '\n', n) == p + n - 1) {
            /* without its newline: as the line is recorded in rejected.jsonl when refused */
            PyObject *line = PyBytes_FromStringAndSize(p, n - 1);
            if (line == NULL)
                return NULL;
            PyObject *args[2] = {line, pid};
            Py_INCREF(handle);
            PyObject *r = append(handle, args, 2, NULL);
            Py_DECREF(handle);
            Py_DECREF(line);
            if (r == NULL) {  /* a failure after the line was accepted does not fail the write */
                PyObject *type, *exc, *tb;
                PyErr_Fetch(&type, &exc, &tb);
                PyErr_NormalizeException(&type, &exc, &tb);
                if (tb != NULL)  /* re-raised, it keeps where it came from */
                    PyException_SetTraceback(exc, tb);
                r = call_method(self, W.s_after_error, exc, NULL, NULL);
                Py_XDECREF(type);
                Py_XDECREF(exc);
                Py_XDECREF(tb);
                if (r == NULL)
                    return NULL;
            }
            Py_DECREF(r);
            return PyLong_FromSsize_t(n);
        }
    }
    return call_method(self, W.s_write_lines, data, NULL, NULL);
}

static PyMethodDef write_def = {"write", appender_write, METH_O, write_doc};

PyDoc_STRVAR(configure_appender_doc,
"configure_appender(appender_type)\n\n"
"Called once by memfs.store.appender with LineAppender (slots handle, pid, partial; methods\n"
"_write_lines(data) and _after_error(exc), which raises or returns); installs its write.");

static PyObject *configure_appender(PyObject *module, PyObject *type)
{
    if (W.ready) {
        PyErr_SetString(PyExc_RuntimeError, "LineAppender is configured once");
        return NULL;
    }
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "configure_appender takes a type");
        return NULL;
    }
    static const char *const names[] = {"handle", "pid", "partial", NULL};
    if (find_slots((PyTypeObject *)type, names, (Py_ssize_t *)&W.at) < 0)
        return NULL;
    if ((W.s_write_lines = PyUnicode_InternFromString("_write_lines")) == NULL
        || (W.s_after_error = PyUnicode_InternFromString("_after_error")) == NULL)
        return NULL;
    if (install(type, &write_def) < 0)
        return NULL;
    W.type = (PyTypeObject *)Py_NewRef(type);
    W.ready = 1;
    Py_RETURN_NONE;
}



PyDoc_STRVAR(configure_doc,
"configure(handle_type, shared_type, mutex_type, parse_line, apply, enforce_cap, now_rfc3339,\n"
"          validation_error, session_closed, cap_error, turn_started, boundary, buffer_limit,\n"
"          fsync_mode)\n\n"
"Called once by memfs.store.log with SessionHandle, _Shared, the type of _Shared.mutex, ...;\n"
"installs SessionHandle.append. ``boundary``\n"
"holds, by Kind value, whether a line of that kind is a turn boundary.");

static PyObject *configure(PyObject *module, PyObject *args)
{
    PyObject *boundary;
    PyTypeObject *mutex_type;
    if (A.ready) {
        PyErr_SetString(PyExc_RuntimeError, "memfs.store._append is configured once");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!O!O!OOOOOOOOO!nl:configure", &PyType_Type, &A.handle_type, &PyType_Type,
                          &A.shared_type, &PyType_Type, &mutex_type, &A.parse_line, &A.apply,
                          &A.enforce_cap, &A.now_rfc3339, &A.validation_error, &A.session_closed,
                          &A.cap_error,
                          &A.turn_started, &PyTuple_Type, &boundary, &A.buffer_limit, &A.fsync_mode))
        return NULL;
    A.nkinds = PyTuple_GET_SIZE(boundary);
    if (A.nkinds > (Py_ssize_t)sizeof(A.boundary)) {
        PyErr_SetString(PyExc_ValueError, "too many kinds");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < A.nkinds; i++)
        if ((A.boundary[i] = (char)PyObject_IsTrue(PyTuple_GET_ITEM(boundary, i))) < 0)
            return NULL;
    static const char *const names[] = {SLOTS(SLOT_NAME) NULL};
    static const char *const handle_names[] = {HANDLE_SLOTS(SLOT_NAME) NULL};
    if (find_slots(A.shared_type, names, (Py_ssize_t *)&A.at) < 0
        || find_slots(A.handle_type, handle_names, (Py_ssize_t *)&A.handle_at) < 0)
        return NULL;
    if ((A.acquire = PyObject_GetAttrString((PyObject *)mutex_type, "acquire")) == NULL
        || (A.release = PyObject_GetAttrString((PyObject *)mutex_type, "release")) == NULL)
        return NULL;
    PyObject **keep[] = {(PyObject **)&A.handle_type, (PyObject **)&A.shared_type, &A.parse_line, &A.apply,
                         &A.enforce_cap, &A.now_rfc3339,
                         &A.validation_error, &A.session_closed, &A.cap_error, &A.turn_started, NULL};
    for (int i = 0; keep[i]; i++)
        Py_INCREF(*keep[i]);
    struct { PyObject **at; const char *text; } strings[] = {
        {&A.s_writable, "_writable"}, {&A.s_check_line, "check_line"}, {&A.s_refuse, "refuse"},
        {&A.s_write_pending, "write_pending"}, {&A.s_request_persist, "request_persist"},
        {&A.s_sync_to, "sync_to"},
        {&A.s_accepted, "accepted"}, {&A.s_event_count, "event_count"}, {&A.empty, ""}, {NULL, NULL}};
    for (int i = 0; strings[i].at; i++)
        if ((*strings[i].at = PyUnicode_InternFromString(strings[i].text)) == NULL)
            return NULL;
    if (install((PyObject *)A.handle_type, &append_def) < 0)
        return NULL;
    A.ready = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, configure_doc},
    {"configure_appender", configure_appender, METH_O, configure_appender_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "memfs.store._append",
    "Single appends, compiled: memfs.store.log and memfs.store.appender configure them and\n"
    "document the rules.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__append(void)
{
    return PyModule_Create(&module);
}
