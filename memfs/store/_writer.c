/* memfs.store._writer — the compiled twin of memfs.store.writer.commit (SPEC §3.1–§3.2).
 *
 * One commit, two renderings (PEP 399): memfs/store/writer.py is the specification and the
 * pure-Python twin; this is the same function, step for step, because every append of the
 * library and of the mount runs it and as Python it was half of an append's own work. The
 * store test suite runs against both (pytest --impl=c|py; scripts/test.sh runs both).
 *
 * What is C here is only the hot path: iterating the records, adding line + "\n" to
 * LogFile.pending, the offsets, Session.version, the boundary / 64 KiB / persist_at
 * decisions, the marks, the end-of-call write of the pending bytes (LogFile.write_pending,
 * rendered as write_pending() below), Session.appended and Session.last_change. Everything
 * else calls the Python that owns it:
 *
 *   the state machine   memfs.store.machine.apply, once per record: the only one
 *   a turn's time       memfs.store.meta.now_rfc3339
 *   persists            Session.request_persist
 *   the event cap       memfs.store.writer._enforce_cap (evict.enforce_cap + its error)
 *   a failed write      memfs.store.writer._failed_write (the rollback to the mark)
 *
 * Attributes are read by name. The first time an object of a class is seen, each name is
 * looked up on the class once: a plain __slots__ member becomes an offset, so reading it is
 * a load as it is for the interpreter; anything else (a property, a class with its own
 * __getattribute__/__setattr__) stays an ordinary attribute access. Slot order never matters.
 *
 * A mark is kept as a C struct and turned into writer._mark's tuple only when a failed write
 * needs it (mark() below returns it, for the tests that compare the twins).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <errno.h>
#include <time.h>
#include <unistd.h>

/* --- attributes by name ------------------------------------------------------------------ */

typedef struct {
    const char *name;
    PyObject *iname;    /* interned */
    Py_ssize_t offset;  /* of the slot in objects of the layout's type, for reading; -1: getattr */
    Py_ssize_t set_offset;  /* the same, for writing; -1: setattr */
} Field;

typedef struct {
    const char *what;
    PyTypeObject *type; /* the class the offsets are for (a strong reference), or NULL */
    Field *fields;
} Layout;

enum { S_LOG, S_STATE, S_CONFIG, S_VERSION, S_LAST_CHANGE, S_PERSIST_AT, S_APPENDED };
static Field session_fields[] = {{"log"}, {"state"}, {"config"}, {"version"}, {"last_change"},
                                 {"persist_at"}, {"appended"}, {NULL}};
enum { L_PENDING, L_FLUSHED_LEN, L_FD, L_DROPPED };
static Field log_fields[] = {{"pending"}, {"flushed_len"}, {"fd"}, {"dropped"}, {NULL}};
enum { C_MAX_EVENTS, C_WRITES_THROUGH, C_SYNCS };
static Field config_fields[] = {{"max_events"}, {"writes_through"}, {"syncs"}, {NULL}};
enum { T_INDEX, T_TURN_COUNT, T_EVENT_COUNT, T_STATUS, T_IN_TURN };
static Field state_fields[] = {{"index"}, {"turn_count"}, {"event_count"}, {"status"}, {"in_turn"}, {NULL}};
enum { I_BASE, I_START, I_END, I_COUNT, I_OUTCOME };
static Field index_fields[] = {{"base"}, {"start"}, {"end"}, {"count"}, {"outcome"}, {NULL}};

static Layout SESSION = {"session", NULL, session_fields}, LOG = {"log", NULL, log_fields},
              CONFIG = {"config", NULL, config_fields}, STATE = {"state", NULL, state_fields},
              INDEX = {"index", NULL, index_fields};

/* Look up ``L``'s names on ``type`` (the class of an object about to be used). */
static void resolve(Layout *L, PyTypeObject *type)
{
    /* a class of its own __getattribute__ / __setattr__ (a frozen dataclass) is asked */
    int plain_get = type->tp_getattro == PyObject_GenericGetAttr;
    int plain_set = type->tp_setattro == PyObject_GenericSetAttr;
    for (Field *f = L->fields; f->name; f++) {
        PyObject *descr = _PyType_Lookup(type, f->iname);
        f->offset = f->set_offset = -1;
        if (descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
            if (m->type == T_OBJECT_EX) {
                f->offset = plain_get ? m->offset : -1;
                f->set_offset = plain_set && !(m->flags & READONLY) ? m->offset : -1;
            }
        }
    }
    Py_INCREF(type);
    Py_XSETREF(L->type, type);
}

static inline void use(Layout *L, PyObject *obj)
{
    if (Py_TYPE(obj) != L->type)
        resolve(L, Py_TYPE(obj));
}

/* ``obj.name`` (a new reference). */
static inline PyObject *get(PyObject *obj, Layout *L, int i)
{
    use(L, obj);
    Field *f = &L->fields[i];
    if (f->offset < 0)
        return PyObject_GetAttr(obj, f->iname);
    PyObject *v = *(PyObject **)((char *)obj + f->offset);
    if (v == NULL)
        PyErr_Format(PyExc_AttributeError, "'%.50s' object has no attribute '%U'", Py_TYPE(obj)->tp_name,
                     f->iname);
    return Py_XNewRef(v);
}

/* ``obj.name = value``; steals ``value`` (which may be NULL: then an error is already set). */
static inline int set(PyObject *obj, Layout *L, int i, PyObject *value)
{
    if (value == NULL)
        return -1;
    use(L, obj);
    Field *f = &L->fields[i];
    if (f->set_offset < 0) {
        int r = PyObject_SetAttr(obj, f->iname, value);
        Py_DECREF(value);
        return r;
    }
    Py_XSETREF(*(PyObject **)((char *)obj + f->set_offset), value);
    return 0;
}

static int get_ssize(PyObject *obj, Layout *L, int i, Py_ssize_t *out)
{
    PyObject *v = get(obj, L, i);
    if (v == NULL)
        return -1;
    *out = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* ``bool(obj.name)``: 1, 0, or -1 */
static int get_truth(PyObject *obj, Layout *L, int i)
{
    PyObject *v = get(obj, L, i);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* --- what configure() gives -------------------------------------------------------------- */

static struct {
    PyObject *apply, *now_rfc3339, *enforce_cap, *failed_write;
    PyObject *validation_error, *cap_error, *turn_started;
    Py_ssize_t buffer_limit;
    PyObject *s_request_persist, *s_accepted, *empty, *newline, *zero, *three;
    int ready;
} W;

/* The exception being raised, taken (normalized, its traceback attached): a new reference. */
static PyObject *take_exception(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
}

/* Raise ``exc`` again (stolen). */
static void raise_exception(PyObject *exc)
{
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc, PyException_GetTraceback(exc));
}

/* --- the log file ------------------------------------------------------------------------ */

/* A write of at most this many bytes (one line, a turn of short lines: a few microseconds
 * into the page cache) is made holding the interpreter lock. Releasing it there let every
 * other thread waiting for it run first — a convoy of hand-offs per line: 8 threads appending
 * to one fsync session made 2.38x one native sync per event with the lock released and 2.62x
 * holding it (8 interleaved rounds, each tree in its own process). Larger writes release it. A
 * write the kernel throttles (dirty pages over the limit) holds the process's other Python
 * threads meanwhile; the bound keeps that to small writes. The Python twin (os.write) always
 * releases it: which thread runs when is not part of the commit's specification. */
#define HOLD_GIL_WRITE 4096

/* LogFile.write_pending: write the pending bytes whole (a short write is continued, EINTR
 * retried after the signal handlers ran, as os.write does); on an OSError cut the file back
 * to flushed_len and keep the bytes pending. 0, or -1 with an exception set. */
static int write_pending(PyObject *log)
{
    PyObject *data = get(log, &LOG, L_PENDING);
    if (data == NULL)
        return -1;
    Py_ssize_t size = PyObject_Size(data);
    if (size <= 0) {  /* ``if not data: return`` */
        Py_DECREF(data);
        return size < 0 ? -1 : 0;
    }
    Py_ssize_t flushed;
    PyObject *fdo = get(log, &LOG, L_FD);
    int fd = fdo ? _PyLong_AsInt(fdo) : -1;
    Py_XDECREF(fdo);
    if ((fd == -1 && PyErr_Occurred()) || get_ssize(log, &LOG, L_FLUSHED_LEN, &flushed) < 0) {
        Py_DECREF(data);
        return -1;
    }
    Py_buffer view;  /* holds the bytes still while the GIL is released */
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        Py_DECREF(data);
        return -1;
    }
    const char *p = view.buf;
    Py_ssize_t left = view.len;
    int failed = 0;
    while (left > 0) {
        ssize_t n;
        int err;
        if (left <= HOLD_GIL_WRITE) {
            n = write(fd, p, (size_t)left);
            err = errno;
        } else {
            Py_BEGIN_ALLOW_THREADS
            n = write(fd, p, (size_t)left);
            err = errno;
            Py_END_ALLOW_THREADS
        }
        if (n < 0) {
            if (err == EINTR && PyErr_CheckSignals() == 0)
                continue;
            if (err != EINTR) {
                errno = err;
                PyErr_SetFromErrno(PyExc_OSError);
            }
            failed = 1;
            break;
        }
        p += n;
        left -= n;
    }
    PyBuffer_Release(&view);
    if (failed) {
        Py_DECREF(data);
        if (PyErr_ExceptionMatches(PyExc_OSError) && ftruncate(fd, (off_t)flushed) < 0) {
            PyObject *first = take_exception();
            PyErr_SetFromErrno(PyExc_OSError);
            PyObject *second = take_exception();
            PyException_SetContext(second, first);  /* raised while handling the write's */
            raise_exception(second);
        }
        return -1;
    }
    int r = set(log, &LOG, L_FLUSHED_LEN, PyLong_FromSsize_t(flushed + size));
    Py_DECREF(data);
    if (r < 0)
        return -1;
    return set(log, &LOG, L_PENDING, PyByteArray_FromStringAndSize(NULL, 0));
}

/* --- marks ------------------------------------------------------------------------------- */

typedef struct {
    Py_ssize_t accepted, pending_len, n;
    PyObject *turn_count, *event_count, *status, *in_turn, *base, *last_change;  /* owned */
    PyObject *last_end, *last_count, *last_outcome;  /* owned; NULL when n is 0 */
} Mark;

static void mark_clear(Mark *m)
{
    Py_CLEAR(m->turn_count);
    Py_CLEAR(m->event_count);
    Py_CLEAR(m->status);
    Py_CLEAR(m->in_turn);
    Py_CLEAR(m->base);
    Py_CLEAR(m->last_change);
    Py_CLEAR(m->last_end);
    Py_CLEAR(m->last_count);
    Py_CLEAR(m->last_outcome);
}

/* writer._mark(s, accepted), kept in ``m`` (whose previous contents are dropped). */
static int mark_take(Mark *m, PyObject *s, Py_ssize_t accepted)
{
    mark_clear(m);
    m->accepted = accepted;
    PyObject *state = NULL, *index = NULL, *start = NULL, *col = NULL, *log = NULL, *pending = NULL;
    int r = -1;
    if ((state = get(s, &SESSION, S_STATE)) == NULL
        || (index = get(state, &STATE, T_INDEX)) == NULL
        || (start = get(index, &INDEX, I_START)) == NULL || (m->n = PyObject_Size(start)) < 0)
        goto done;
    if (m->n) {
        if ((col = get(index, &INDEX, I_END)) == NULL || (m->last_end = PySequence_GetItem(col, -1)) == NULL)
            goto done;
        Py_SETREF(col, get(index, &INDEX, I_COUNT));
        if (col == NULL || (m->last_count = PySequence_GetItem(col, -1)) == NULL)
            goto done;
        Py_SETREF(col, get(index, &INDEX, I_OUTCOME));
        if (col == NULL || (m->last_outcome = PySequence_GetItem(col, -1)) == NULL)
            goto done;
    }
    if ((log = get(s, &SESSION, S_LOG)) == NULL
        || (pending = get(log, &LOG, L_PENDING)) == NULL || (m->pending_len = PyObject_Size(pending)) < 0
        || (m->turn_count = get(state, &STATE, T_TURN_COUNT)) == NULL
        || (m->event_count = get(state, &STATE, T_EVENT_COUNT)) == NULL
        || (m->status = get(state, &STATE, T_STATUS)) == NULL
        || (m->in_turn = get(state, &STATE, T_IN_TURN)) == NULL
        || (m->base = get(index, &INDEX, I_BASE)) == NULL
        || (m->last_change = get(s, &SESSION, S_LAST_CHANGE)) == NULL)
        goto done;
    r = 0;
done:
    Py_XDECREF(state);
    Py_XDECREF(index);
    Py_XDECREF(start);
    Py_XDECREF(col);
    Py_XDECREF(log);
    Py_XDECREF(pending);
    return r;
}

/* The tuple writer._mark builds. */
static PyObject *mark_tuple(Mark *m)
{
    PyObject *last = m->n ? PyTuple_Pack(3, m->last_end, m->last_count, m->last_outcome) : Py_NewRef(Py_None);
    if (last == NULL)
        return NULL;
    PyObject *t = Py_BuildValue("(nnOOOOOnNO)", m->accepted, m->pending_len, m->turn_count, m->event_count,
                                m->status, m->in_turn, m->base, m->n, last, m->last_change);
    return t;
}

/* --- helpers ----------------------------------------------------------------------------- */


/* time.time() */
static PyObject *now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    long long ns = (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
    if (ns % 1000000000LL == 0)
        return PyFloat_FromDouble((double)(ns / 1000000000LL));
    return PyFloat_FromDouble((double)ns / 1e9);
}

/* ``callable(*args)`` with ``handled`` as the exception being handled (what an ``except``
 * block around the call would make it): exceptions raised inside get it as __context__. */
static PyObject *call_handling(PyObject *handled, PyObject *callable, PyObject *const *args, size_t nargs)
{
    PyObject *before = PyErr_GetHandledException();
    PyErr_SetHandledException(handled);
    PyObject *r = PyObject_Vectorcall(callable, args, nargs, NULL);
    PyErr_SetHandledException(before);
    Py_XDECREF(before);
    return r;
}

/* write_pending(log) as called inside ``except ... as handled``. */
static int write_pending_handling(PyObject *handled, PyObject *log)
{
    PyObject *before = PyErr_GetHandledException();
    PyErr_SetHandledException(handled);
    int r = write_pending(log);
    PyErr_SetHandledException(before);
    Py_XDECREF(before);
    return r;
}

/* ``except OSError as exc: _failed_write(s, mark, exc); raise``: leaves an exception set. */
static void failed_write(PyObject *s, Mark *m, PyObject *exc)
{
    PyObject *mark = mark_tuple(m), *r = NULL;
    if (mark != NULL) {
        PyObject *args[3] = {s, mark, exc};
        r = call_handling(exc, W.failed_write, args, 3);
        Py_DECREF(mark);
    }
    if (r == NULL) {  /* what _failed_write raised, raised while handling exc */
        Py_DECREF(exc);
        return;
    }
    Py_DECREF(r);
    raise_exception(exc);
}

static PyObject *record_item(PyObject *record, Py_ssize_t i, PyObject *key)
{
    if (PyTuple_CheckExact(record) && PyTuple_GET_SIZE(record) > i)
        return Py_NewRef(PyTuple_GET_ITEM(record, i));
    return PyObject_GetItem(record, key);
}

/* ``pending += line; pending += b"\n"``, the line being ``n`` long */
static int add_line(PyObject *pending, PyObject *line, Py_ssize_t held, Py_ssize_t n)
{
    if (PyBytes_CheckExact(line)) {
        if (PyByteArray_Resize(pending, held + n + 1) < 0)
            return -1;
        char *p = PyByteArray_AS_STRING(pending) + held;
        memcpy(p, PyBytes_AS_STRING(line), n);
        p[n] = '\n';
        return 0;
    }
    PyObject *r = PyNumber_InPlaceAdd(pending, line);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    if ((r = PyNumber_InPlaceAdd(pending, W.newline)) == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* --- commit ------------------------------------------------------------------------------ */

/* One record (the loop body of writer.commit). 0, or -1 with an exception set. */
static int commit_one(PyObject *s, PyObject *record, PyObject *log, PyObject *state, PyObject *max_events,
                      int writes_through, Py_ssize_t *accepted, Mark *m)
{
    PyObject *line = NULL, *kind = NULL, *pending = NULL, *ts = NULL, *r = NULL;
    Py_ssize_t flushed, n, version;
    int ret = -1;
    if ((line = record_item(record, 0, W.zero)) == NULL || (kind = record_item(record, 3, W.three)) == NULL)
        goto done;
    if ((pending = get(log, &LOG, L_PENDING)) == NULL)
        goto done;
    if (!PyByteArray_Check(pending)) {
        PyErr_Format(PyExc_TypeError, "LogFile.pending must be a bytearray, not %.50s", Py_TYPE(pending)->tp_name);
        goto done;
    }
    if (get_ssize(log, &LOG, L_FLUSHED_LEN, &flushed) < 0)
        goto done;
    Py_ssize_t held = PyByteArray_GET_SIZE(pending), offset = flushed + held;
    if ((n = PyBytes_CheckExact(line) ? PyBytes_GET_SIZE(line) : PyObject_Size(line)) < 0)
        goto done;
    Py_ssize_t end = offset + n + 1;
    if (add_line(pending, line, held, n) < 0)
        goto done;
    ++*accepted;
    if (get_ssize(s, &SESSION, S_VERSION, &version) < 0
        || set(s, &SESSION, S_VERSION, PyLong_FromSsize_t(version + 1)) < 0)
        goto done;
    ts = kind == W.turn_started ? PyObject_CallNoArgs(W.now_rfc3339) : Py_NewRef(W.empty);
    if (ts == NULL)
        goto done;
    PyObject *at = PyLong_FromSsize_t(offset), *to = PyLong_FromSsize_t(end);
    if (at != NULL && to != NULL) {
        PyObject *args[5] = {state, kind, at, to, ts};
        r = PyObject_Vectorcall(W.apply, args, 5, NULL);
    }
    Py_XDECREF(at);
    Py_XDECREF(to);
    if (r == NULL)
        goto done;
    int boundary = PyObject_IsTrue(r), persist = 0;
    if (boundary < 0)
        goto done;
    if (boundary) {
        if (write_pending(log) < 0 || mark_take(m, s, *accepted) < 0)
            goto done;
        persist = 1;
    } else if (PyByteArray_GET_SIZE(pending) >= W.buffer_limit) {
        if (write_pending(log) < 0 || mark_take(m, s, *accepted) < 0)
            goto done;
        persist = !writes_through;  /* the spec's 64 KiB persist is buffered mode's */
    } else {
        Py_ssize_t persist_at;
        if (get_ssize(s, &SESSION, S_PERSIST_AT, &persist_at) < 0)
            goto done;
        persist = end >= persist_at && !writes_through;  /* 64 KiB since the last request */
    }
    if (persist) {
        PyObject *res = PyObject_VectorcallMethod(W.s_request_persist, &s, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                                  NULL);
        if (res == NULL)
            goto done;
        Py_DECREF(res);
    }
    int over = PyObject_IsTrue(max_events);
    if (over > 0) {
        PyObject *count;
        if ((count = get(state, &STATE, T_EVENT_COUNT)) == NULL)
            goto done;
        over = PyObject_RichCompareBool(count, max_events, Py_GT);
        Py_DECREF(count);
    }
    if (over < 0)
        goto done;
    if (over) {
        if (write_pending(log) < 0 || mark_take(m, s, *accepted) < 0)
            goto done;
        PyObject *res = PyObject_Vectorcall(W.enforce_cap, &s, 1, NULL);
        /* ``finally: mark = _mark(s, accepted)`` */
        PyObject *exc = res == NULL ? take_exception() : NULL;
        int marked = mark_take(m, s, *accepted);
        if (marked < 0) {  /* an error in a finally block replaces the one in flight */
            if (exc != NULL) {
                PyObject *now_exc = take_exception();
                PyException_SetContext(now_exc, exc);
                raise_exception(now_exc);
            }
            Py_XDECREF(res);
            goto done;
        }
        if (res == NULL) {
            raise_exception(exc);
            goto done;
        }
        Py_DECREF(res);
    }
    ret = 0;
done:
    Py_XDECREF(line);
    Py_XDECREF(kind);
    Py_XDECREF(pending);
    Py_XDECREF(ts);
    Py_XDECREF(r);
    return ret;
}

/* The records, one at a time, and what happens at the end of the call when none failed. */
static int commit_all(PyObject *s, PyObject *records, PyObject *log, PyObject *state, PyObject *max_events,
                      int writes_through, Py_ssize_t *accepted, Mark *m)
{
    if (PyTuple_CheckExact(records) || PyList_CheckExact(records)) {
        int is_tuple = PyTuple_CheckExact(records);
        for (Py_ssize_t i = 0; i < (is_tuple ? PyTuple_GET_SIZE(records) : PyList_GET_SIZE(records)); i++) {
            PyObject *record = Py_NewRef(is_tuple ? PyTuple_GET_ITEM(records, i) : PyList_GET_ITEM(records, i));
            int r = commit_one(s, record, log, state, max_events, writes_through, accepted, m);
            Py_DECREF(record);
            if (r < 0)
                return -1;
        }
    } else {
        PyObject *it = PyObject_GetIter(records), *record;
        if (it == NULL)
            return -1;
        while ((record = PyIter_Next(it)) != NULL) {
            int r = commit_one(s, record, log, state, max_events, writes_through, accepted, m);
            Py_DECREF(record);
            if (r < 0) {
                Py_DECREF(it);
                return -1;
            }
        }
        Py_DECREF(it);
        if (PyErr_Occurred())  /* the iterator raised: a refused line of a batch */
            return -1;
    }
    if (writes_through && *accepted)
        return write_pending(log);
    return 0;
}

PyDoc_STRVAR(commit_doc,
"commit(s, records, /)\n--\n\n"
"Append ``records`` to session ``s`` (caller holds ``s.mutex``); return ``(accepted,\n"
"sync_target)``. Compiled twin of memfs.store.writer.commit, whose docstring is the\n"
"specification.");

static PyObject *commit(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!W.ready) {
        PyErr_SetString(PyExc_RuntimeError, "memfs.store._writer is not configured");
        return NULL;
    }
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "commit() takes 2 positional arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *s = args[0], *records = args[1];
    PyObject *log = NULL, *state = NULL, *config = NULL, *max_events = NULL, *result = NULL;
    Mark m = {0};
    Py_ssize_t accepted = 0;
    int writes_through, syncs;
    Py_INCREF(s);
    if ((log = get(s, &SESSION, S_LOG)) == NULL
        || (state = get(s, &SESSION, S_STATE)) == NULL || (config = get(s, &SESSION, S_CONFIG)) == NULL
        || (max_events = get(config, &CONFIG, C_MAX_EVENTS)) == NULL
        || (writes_through = get_truth(config, &CONFIG, C_WRITES_THROUGH)) < 0)
        goto done;
    if (mark_take(&m, s, 0) < 0)
        goto done;
    /* before any persist of this call: updated_at is its time */
    if (set(s, &SESSION, S_LAST_CHANGE, now()) < 0)
        goto done;

    PyObject *refused = NULL;
    if (commit_all(s, records, log, state, max_events, writes_through, &accepted, &m) < 0) {
        if (PyErr_ExceptionMatches(W.validation_error) || PyErr_ExceptionMatches(W.cap_error)) {
            refused = take_exception();  /* the lines before it stay committed */
            if (writes_through && accepted && write_pending_handling(refused, log) < 0) {
                if (PyErr_ExceptionMatches(PyExc_OSError))
                    failed_write(s, &m, take_exception());
                Py_DECREF(refused);
                goto done;
            }
        } else {
            if (PyErr_ExceptionMatches(PyExc_OSError))
                failed_write(s, &m, take_exception());
            goto done;
        }
    }
    Py_ssize_t appended;
    if (get_ssize(s, &SESSION, S_APPENDED, &appended) < 0
        || set(s, &SESSION, S_APPENDED, PyLong_FromSsize_t(appended + accepted)) < 0) {
        Py_XDECREF(refused);
        goto done;
    }
    if (refused != NULL) {
        PyObject *n = PyLong_FromSsize_t(accepted);
        if (n != NULL && PyObject_SetAttr(refused, W.s_accepted, n) == 0)
            raise_exception(refused);
        else
            Py_DECREF(refused);
        Py_XDECREF(n);
        goto done;
    }
    Py_ssize_t target = 0;
    if ((syncs = get_truth(config, &CONFIG, C_SYNCS)) < 0)
        goto done;
    if (syncs && accepted) {
        Py_ssize_t dropped, flushed;
        if (get_ssize(log, &LOG, L_DROPPED, &dropped) < 0
            || get_ssize(log, &LOG, L_FLUSHED_LEN, &flushed) < 0)
            goto done;
        target = dropped + flushed;
    }
    if ((result = PyTuple_New(2)) != NULL) {
        PyObject *a = PyLong_FromSsize_t(accepted), *t = a ? PyLong_FromSsize_t(target) : NULL;
        if (t == NULL) {
            Py_XDECREF(a);
            Py_CLEAR(result);
        } else {
            PyTuple_SET_ITEM(result, 0, a);
            PyTuple_SET_ITEM(result, 1, t);
        }
    }
done:
    mark_clear(&m);
    Py_XDECREF(log);
    Py_XDECREF(state);
    Py_XDECREF(config);
    Py_XDECREF(max_events);
    Py_DECREF(s);
    return result;
}

PyDoc_STRVAR(mark_doc,
"mark(s, accepted, /)\n--\n\n"
"The tuple memfs.store.writer._mark(s, accepted) returns, as this module takes it (for the\n"
"tests that hold the twins to one another).");

static PyObject *mark(PyObject *module, PyObject *args)
{
    PyObject *s;
    Py_ssize_t accepted;
    if (!PyArg_ParseTuple(args, "On:mark", &s, &accepted))
        return NULL;
    Mark m = {0};
    PyObject *t = mark_take(&m, s, accepted) < 0 ? NULL : mark_tuple(&m);
    mark_clear(&m);
    return t;
}

PyDoc_STRVAR(configure_doc,
"configure(apply, now_rfc3339, enforce_cap, failed_write, validation_error, cap_error,\n"
"          turn_started, buffer_limit)\n\n"
"Called once by memfs.store.writer with the Python this commit calls back into.");

static PyObject *configure(PyObject *module, PyObject *args)
{
    if (W.ready) {
        PyErr_SetString(PyExc_RuntimeError, "memfs.store._writer is configured once");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOOOOOn:configure", &W.apply, &W.now_rfc3339, &W.enforce_cap, &W.failed_write,
                          &W.validation_error, &W.cap_error, &W.turn_started, &W.buffer_limit))
        return NULL;
    PyObject *keep[] = {W.apply, W.now_rfc3339, W.enforce_cap, W.failed_write, W.validation_error, W.cap_error,
                        W.turn_started};
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++)
        Py_INCREF(keep[i]);
    struct { PyObject **at; const char *text; } strings[] = {
        {&W.s_request_persist, "request_persist"}, {&W.s_accepted, "accepted"}, {&W.empty, ""}, {NULL, NULL}};
    for (int i = 0; strings[i].at; i++)
        if ((*strings[i].at = PyUnicode_InternFromString(strings[i].text)) == NULL)
            return NULL;
    if ((W.newline = PyBytes_FromStringAndSize("\n", 1)) == NULL || (W.zero = PyLong_FromLong(0)) == NULL
        || (W.three = PyLong_FromLong(3)) == NULL)
        return NULL;
    Layout *layouts[] = {&SESSION, &LOG, &CONFIG, &STATE, &INDEX, NULL};
    for (int i = 0; layouts[i]; i++)
        for (Field *f = layouts[i]->fields; f->name; f++)
            if ((f->iname = PyUnicode_InternFromString(f->name)) == NULL)
                return NULL;
    W.ready = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"commit", (PyCFunction)(void (*)(void))commit, METH_FASTCALL, commit_doc},
    {"mark", mark, METH_VARARGS, mark_doc},
    {"configure", configure, METH_VARARGS, configure_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "memfs.store._writer",
    "The compiled twin of memfs.store.writer.commit; memfs.store.writer configures it and\n"
    "decides which twin runs (MEMFS_IMPL).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__writer(void)
{
    return PyModule_Create(&module);
}
