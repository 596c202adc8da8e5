/* memfs._contract — the event contract's per-line work (SPEC §2), compiled.
 *
 * memfs/events.py owns the contract: the field tables of every event type (as data), the
 * reasons for refusing lines that are not well-formed envelopes, and the documentation. It
 * hands all of that to configure() once at import. This module only interprets those tables
 * and runs the straight path of parse_line and decode_stored, because those two run for
 * every line appended or rescanned, and as Python code they cost more than the JSON parsing
 * itself (see the "Decisions" section of README.md).
 *
 * A table ("check") is one of these tuples, each starting with its kind and what a value
 * must be (the end of a refusal's reason):
 *   ("str"|"bool"|"int"|"uint"|"number"|"object"|"any"|"str_list", what)
 *   ("one_of", what, frozenset_of_str)      ("equal", what, value)
 *   ("fields", what, [field, ...])          the value is an object with these fields
 *   ("list_of", what, check)                a list whose every element passes ``check``
 *   ("by", what, key, {value: check}, fallback_check)
 *                                           an object, checked by the check its string
 *                                           ``key`` selects (the fallback otherwise)
 *   ("present", what, [(key, check), ...], fallback_check)
 *                                           an object, checked by the check of the first
 *                                           ``key`` it has with a non-null value (the
 *                                           fallback otherwise): "``message`` or
 *                                           ``error.message``" (a rule of two dialects)
 * The cases of "by" and "present", their fallbacks and an event type's own check are
 * "fields", "by" or "present" checks: checks of an object.
 * and a field is (name, required, check, what_if_missing or None). A required field must be
 * present and pass (null fails every check but "any"); an optional one may be absent or null.
 * Fields are checked in order. Missing required fields come first: when two or more of one
 * object are missing, the reason names them all ("missing required fields a, b"), else the
 * first wrong field is reported ("\"a\" must be ..."), with its dotted path
 * (``item.changes[0].path``).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef enum {
    K_STR, K_BOOL, K_INT, K_UINT, K_NUMBER, K_OBJECT, K_ANY, K_STR_LIST,
    K_ONE_OF, K_EQUAL, K_FIELDS, K_LIST_OF, K_BY, K_PRESENT
} CheckKind;

static const char *const KIND_NAMES[] = {
    "str", "bool", "int", "uint", "number", "object", "any", "str_list",
    "one_of", "equal", "fields", "list_of", "by", "present", NULL
};

typedef struct Check Check;

typedef struct {
    PyObject *name;          /* str */
    int required;
    Check *check;
    PyObject *missing_what;  /* str: what a missing required field must be */
} Field;

struct Check {
    CheckKind kind;
    PyObject *what;          /* str */
    PyObject *value;         /* one_of: frozenset; equal: the value */
    Py_ssize_t nfields;      /* fields */
    Field *fields;
    Check *item;             /* list_of */
    PyObject *key;           /* by: the field that selects */
    PyObject *cases;         /* by: dict value -> int index into case_checks */
    Py_ssize_t ncases;       /* present: the keys, in order, beside case_checks */
    PyObject **case_keys;
    Check **case_checks;
    Check *fallback;
};

static int is_object_check(const Check *c)
{
    return c->kind == K_FIELDS || c->kind == K_BY || c->kind == K_PRESENT;
}

/* Everything configure() was given; compiled tables live as long as the process. */
static struct {
    PyObject *loads, *decode_error, *validation_error, *undecodable_reason, *unwrap_slow;
    PyObject *newline_reason, *type_reason, *other_kind;
    PyObject *table;         /* dict etype -> int index */
    Check **checks;          /* by index: NULL for a type with no field checks */
    PyObject **kinds;        /* by index: the Kind member */
    PyObject *s_event, *s_schema_version, *s_type;
    PyObject *missing_mark;  /* a BAD's ``what`` when its ``path`` is a list of missing fields */
    int ready;
} C;

/* --- compiling tables ---------------------------------------------------------------------- */

static Check *compile_check(PyObject *spec);

static int compile_fields(Check *c, PyObject *list)
{
    PyObject *seq = PySequence_Fast(list, "fields must be a sequence");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    c->nfields = n;
    c->fields = PyMem_Calloc(n ? n : 1, sizeof(Field));
    if (c->fields == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name, *required, *check, *missing;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "UOOO:field", &name, &required, &check,
                              &missing)) {
            Py_DECREF(seq);
            return -1;
        }
        Field *f = &c->fields[i];
        Py_INCREF(name);
        PyUnicode_InternInPlace(&name);
        f->name = name;
        f->required = PyObject_IsTrue(required);
        f->check = compile_check(check);
        if (f->check == NULL) {
            Py_DECREF(seq);
            return -1;
        }
        f->missing_what = missing == Py_None ? f->check->what : missing;
        Py_INCREF(f->missing_what);
    }
    Py_DECREF(seq);
    return 0;
}

static Check *compile_check(PyObject *spec)
{
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 2) {
        PyErr_Format(PyExc_TypeError, "a check is a tuple (kind, what, ...), not %R", spec);
        return NULL;
    }
    PyObject *kind = PyTuple_GET_ITEM(spec, 0), *what = PyTuple_GET_ITEM(spec, 1);
    if (!PyUnicode_Check(kind) || !PyUnicode_Check(what)) {
        PyErr_Format(PyExc_TypeError, "bad check %R", spec);
        return NULL;
    }
    int k = -1;
    for (int i = 0; KIND_NAMES[i]; i++)
        if (PyUnicode_CompareWithASCIIString(kind, KIND_NAMES[i]) == 0)
            k = i;
    if (k < 0) {
        PyErr_Format(PyExc_ValueError, "unknown check kind %R", kind);
        return NULL;
    }
    Check *c = PyMem_Calloc(1, sizeof(Check));
    if (c == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    c->kind = (CheckKind)k;
    c->what = Py_NewRef(what);
    Py_ssize_t size = PyTuple_GET_SIZE(spec);
    switch (c->kind) {
    case K_ONE_OF:
    case K_EQUAL:
        if (size != 3)
            goto bad_size;
        c->value = Py_NewRef(PyTuple_GET_ITEM(spec, 2));
        if (c->kind == K_ONE_OF && !PyFrozenSet_Check(c->value)) {
            PyErr_SetString(PyExc_TypeError, "one_of takes a frozenset");
            return NULL;
        }
        break;
    case K_FIELDS:
        if (size != 3)
            goto bad_size;
        if (compile_fields(c, PyTuple_GET_ITEM(spec, 2)) < 0)
            return NULL;
        break;
    case K_LIST_OF:
        if (size != 3)
            goto bad_size;
        if ((c->item = compile_check(PyTuple_GET_ITEM(spec, 2))) == NULL)
            return NULL;
        break;
    case K_BY: {
        if (size != 5)
            goto bad_size;
        PyObject *cases = PyTuple_GET_ITEM(spec, 3);
        if (!PyUnicode_Check(PyTuple_GET_ITEM(spec, 2)) || !PyDict_Check(cases)) {
            PyErr_SetString(PyExc_TypeError, "by takes a key and a dict of cases");
            return NULL;
        }
        c->key = Py_NewRef(PyTuple_GET_ITEM(spec, 2));
        PyUnicode_InternInPlace(&c->key);
        c->cases = PyDict_New();
        c->case_checks = PyMem_Calloc(PyDict_GET_SIZE(cases) + 1, sizeof(Check *));
        if (c->cases == NULL || c->case_checks == NULL)
            return NULL;
        Py_ssize_t pos = 0, i = 0;
        PyObject *value, *fields;
        while (PyDict_Next(cases, &pos, &value, &fields)) {
            PyObject *index = PyLong_FromSsize_t(i);
            if (index == NULL || PyDict_SetItem(c->cases, value, index) < 0)
                return NULL;
            Py_DECREF(index);
            if ((c->case_checks[i] = compile_check(fields)) == NULL)
                return NULL;
            if (!is_object_check(c->case_checks[i++]))
                goto not_object;
        }
        if ((c->fallback = compile_check(PyTuple_GET_ITEM(spec, 4))) == NULL)
            return NULL;
        if (!is_object_check(c->fallback))
            goto not_object;
        break;
    }
    case K_PRESENT: {
        if (size != 4)
            goto bad_size;
        PyObject *seq = PySequence_Fast(PyTuple_GET_ITEM(spec, 2), "present takes a sequence of cases");
        if (seq == NULL)
            return NULL;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        c->ncases = n;
        c->case_keys = PyMem_Calloc(n + 1, sizeof(PyObject *));
        c->case_checks = PyMem_Calloc(n + 1, sizeof(Check *));
        if (c->case_keys == NULL || c->case_checks == NULL) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return NULL;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *key, *check;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "UO:present case", &key, &check)) {
                Py_DECREF(seq);
                return NULL;
            }
            Py_INCREF(key);
            PyUnicode_InternInPlace(&key);
            c->case_keys[i] = key;
            if ((c->case_checks[i] = compile_check(check)) == NULL) {
                Py_DECREF(seq);
                return NULL;
            }
            if (!is_object_check(c->case_checks[i])) {
                Py_DECREF(seq);
                goto not_object;
            }
        }
        Py_DECREF(seq);
        if ((c->fallback = compile_check(PyTuple_GET_ITEM(spec, 3))) == NULL)
            return NULL;
        if (!is_object_check(c->fallback))
            goto not_object;
        break;
    }
    default:
        if (size != 2)
            goto bad_size;
    }
    return c;
bad_size:
    PyErr_Format(PyExc_TypeError, "wrong number of parts in check %R", spec);
    return NULL;
not_object:
    PyErr_Format(PyExc_TypeError, "the cases of %R must be checks of an object", spec);
    return NULL;
}

/* --- running tables ------------------------------------------------------------------------ */

/* A check returns OK, BAD (with *path: a new reference to the path below the value, or NULL
 * for the value itself, and *what: a borrowed reference) or ERR (a Python exception is set).
 * When *what is C.missing_mark, *path is a list: the paths of two or more missing fields. */
enum { OK = 0, BAD = -1, ERR = -2 };

static PyObject *join_one(PyObject *head, PyObject *tail)
{
    if (PyUnicode_READ_CHAR(tail, 0) == '[')
        return PyUnicode_Concat(head, tail);
    return PyUnicode_FromFormat("%U.%U", head, tail);
}

/* ``head`` followed by ``tail`` (a path below it, or a list of them): head.tail, or
 * head[i]... for list indexes. Steals ``tail``. */
static PyObject *join_path(PyObject *head, PyObject *tail)
{
    if (tail == NULL)
        return Py_NewRef(head);
    PyObject *joined;
    if (PyList_CheckExact(tail)) {
        joined = tail;  /* (a list made for this path only: rewritten in place) */
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(tail); i++) {
            PyObject *one = join_one(head, PyList_GET_ITEM(tail, i));
            if (one == NULL) {
                Py_DECREF(tail);
                return NULL;
            }
            PyList_SetItem(tail, i, one);  /* steals one, drops the old item */
        }
        return joined;
    }
    joined = join_one(head, tail);
    Py_DECREF(tail);
    return joined;
}

static int run_check(const Check *c, PyObject *v, PyObject **path, PyObject **what);

/* Every field, in order. The first wrong value is kept, and only presence is checked after
 * it; missing required fields win over it: one is reported as a wrong field (with what it
 * must be), two or more as the list of their names. */
static int run_fields(const Check *c, PyObject *obj, PyObject **path, PyObject **what)
{
    const Field *first_missing = NULL;
    PyObject *missing = NULL, *bad_path = NULL, *bad_what = NULL;
    int bad = 0;
    for (Py_ssize_t i = 0; i < c->nfields; i++) {
        const Field *f = &c->fields[i];
        PyObject *v = PyDict_GetItemWithError(obj, f->name);
        if (v == NULL) {
            if (PyErr_Occurred())
                goto error;
            if (!f->required)
                continue;
            if (first_missing == NULL) {
                first_missing = f;
                continue;
            }
            if (missing == NULL && (missing = PyList_New(1)) == NULL)
                goto error;
            if (PyList_GET_ITEM(missing, 0) == NULL)
                PyList_SET_ITEM(missing, 0, Py_NewRef(first_missing->name));
            if (PyList_Append(missing, f->name) < 0)
                goto error;
            continue;
        }
        if (bad || first_missing != NULL || (v == Py_None && !f->required))
            continue;
        PyObject *below = NULL;
        int r = run_check(f->check, v, &below, &bad_what);
        if (r == BAD) {
            if ((bad_path = join_path(f->name, below)) == NULL)
                goto error;
            bad = 1;
        } else if (r == ERR) {
            goto error;
        }
    }
    if (missing != NULL) {
        Py_XDECREF(bad_path);
        *path = missing;
        *what = C.missing_mark;
        return BAD;
    }
    if (first_missing != NULL) {
        Py_XDECREF(bad_path);
        *path = Py_NewRef(first_missing->name);
        *what = first_missing->missing_what;
        return BAD;
    }
    if (bad) {
        *path = bad_path;
        *what = bad_what;
        return BAD;
    }
    return OK;
error:
    Py_XDECREF(missing);
    Py_XDECREF(bad_path);
    return ERR;
}

static int run_check(const Check *c, PyObject *v, PyObject **path, PyObject **what)
{
    int ok;
    switch (c->kind) {
    case K_STR:
        ok = PyUnicode_CheckExact(v);
        break;
    case K_BOOL:
        ok = PyBool_Check(v);
        break;
    case K_INT:
        ok = PyLong_CheckExact(v);  /* a JSON boolean is never an integer */
        break;
    case K_UINT:
        ok = PyLong_CheckExact(v) && _PyLong_Sign(v) >= 0;
        break;
    case K_NUMBER:
        ok = PyLong_CheckExact(v) || PyFloat_CheckExact(v);
        break;
    case K_OBJECT:
        ok = PyDict_CheckExact(v);
        break;
    case K_ANY:
        ok = 1;
        break;
    case K_STR_LIST:
        ok = PyList_CheckExact(v);
        for (Py_ssize_t i = 0; ok && i < PyList_GET_SIZE(v); i++)
            ok = PyUnicode_CheckExact(PyList_GET_ITEM(v, i));
        break;
    case K_ONE_OF:
        ok = PyUnicode_CheckExact(v) ? PySet_Contains(c->value, v) : 0;
        if (ok < 0)
            return ERR;
        break;
    case K_EQUAL:
        ok = PyObject_RichCompareBool(v, c->value, Py_EQ);
        if (ok < 0)
            return ERR;
        break;
    case K_FIELDS:
        if (!PyDict_CheckExact(v)) {
            ok = 0;
            break;
        }
        return run_fields(c, v, path, what);
    case K_LIST_OF:
        if (!PyList_CheckExact(v)) {
            ok = 0;
            break;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); i++) {
            PyObject *below = NULL;
            int r = run_check(c->item, PyList_GET_ITEM(v, i), &below, what);
            if (r == OK)
                continue;
            if (r == ERR)
                return ERR;
            PyObject *index = PyUnicode_FromFormat("[%zd]", i);
            if (index == NULL) {
                Py_XDECREF(below);
                return ERR;
            }
            *path = join_path(index, below);
            Py_DECREF(index);
            return *path == NULL ? ERR : BAD;
        }
        return OK;
    case K_BY: {
        if (!PyDict_CheckExact(v)) {
            ok = 0;
            break;
        }
        const Check *target = c->fallback;
        PyObject *selector = PyDict_GetItemWithError(v, c->key);
        if (selector != NULL && PyUnicode_CheckExact(selector)) {
            PyObject *index = PyDict_GetItemWithError(c->cases, selector);
            if (index != NULL)
                target = c->case_checks[PyLong_AsSsize_t(index)];
        }
        if (PyErr_Occurred())
            return ERR;
        return run_check(target, v, path, what);
    }
    case K_PRESENT: {
        if (!PyDict_CheckExact(v)) {
            ok = 0;
            break;
        }
        const Check *target = c->fallback;
        for (Py_ssize_t i = 0; i < c->ncases; i++) {
            PyObject *found = PyDict_GetItemWithError(v, c->case_keys[i]);
            if (found == NULL && PyErr_Occurred())
                return ERR;
            if (found != NULL && found != Py_None) {
                target = c->case_checks[i];
                break;
            }
        }
        return run_check(target, v, path, what);
    }
    default:
        ok = 0;
    }
    if (ok)
        return OK;
    *path = NULL;
    *what = c->what;
    return BAD;
}

/* --- the two entry points ------------------------------------------------------------------ */

static void raise_validation(PyObject *reason)
{
    if (reason == NULL)
        return;
    PyObject *exc = PyObject_CallOneArg(C.validation_error, reason);
    Py_DECREF(reason);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

/* The index of ``etype`` in the table, or -1 (not a known type), or -2 (error). */
static Py_ssize_t type_index(PyObject *etype)
{
    PyObject *index = PyDict_GetItemWithError(C.table, etype);
    if (index == NULL)
        return PyErr_Occurred() ? -2 : -1;
    return PyLong_AsSsize_t(index);
}

/* Run the field checks of a known type on ``event``: 0 accepted, -1 refused (a
 * ValidationError is set when ``raise_reason``, else nothing is), -2 error. */
static int check_event(Py_ssize_t index, PyObject *etype, PyObject *event, int raise_reason)
{
    const Check *check = C.checks[index];
    if (check == NULL)
        return 0;
    PyObject *path = NULL, *what = NULL;
    int r = run_check(check, event, &path, &what);  /* an object check: event is a dict */
    if (r == OK)
        return 0;
    if (r == ERR)
        return -2;
    if (raise_reason) {
        if (what == C.missing_mark) {
            PyObject *sep = PyUnicode_FromString(", "), *names = sep ? PyUnicode_Join(sep, path) : NULL;
            Py_XDECREF(sep);
            raise_validation(names ? PyUnicode_FromFormat("%U: missing required fields %U", etype, names) : NULL);
            Py_XDECREF(names);
        } else {
            raise_validation(PyUnicode_FromFormat("%U: \"%U\" must be %U", etype, path, what));
        }
    }
    Py_DECREF(path);
    return raise_reason ? -2 : -1;
}

PyDoc_STRVAR(parse_line_doc, "parse_line(raw: bytes) -> (line, type, event, kind)\n\nSee memfs.events.parse_line.");

static PyObject *parse_line(PyObject *module, PyObject *raw)
{
    if (!C.ready) {
        PyErr_SetString(PyExc_RuntimeError, "memfs._contract is not configured");
        return NULL;
    }
    if (!PyBytes_CheckExact(raw)) {
        PyErr_Format(PyExc_TypeError, "parse_line takes bytes, not %.100s", Py_TYPE(raw)->tp_name);
        return NULL;
    }
    PyObject *line, *obj = NULL, *event = NULL, *stored = NULL, *record = NULL;
    const char *s = PyBytes_AS_STRING(raw);
    Py_ssize_t n = PyBytes_GET_SIZE(raw);
    if (n && s[n - 1] == '}') {
        line = Py_NewRef(raw);
    } else {  /* the writer's line: one trailing \n, then one trailing \r, dropped */
        Py_ssize_t m = n;
        if (m && s[m - 1] == '\n')
            m--;
        if (m && s[m - 1] == '\r')
            m--;
        if ((line = PyBytes_FromStringAndSize(s, m)) == NULL)
            return NULL;
    }
    obj = PyObject_Vectorcall(C.loads, &line, 1, NULL);
    if (obj == NULL) {
        if (PyErr_ExceptionMatches(C.decode_error)) {
            PyObject *type, *exc, *tb;
            PyErr_Fetch(&type, &exc, &tb);
            PyErr_NormalizeException(&type, &exc, &tb);
            raise_validation(PyObject_CallFunctionObjArgs(C.undecodable_reason, line, exc, NULL));
            Py_XDECREF(type);
            Py_XDECREF(exc);
            Py_XDECREF(tb);
        }
        goto done;
    }
    if (memchr(PyBytes_AS_STRING(line), '\n', PyBytes_GET_SIZE(line)) != NULL) {
        /* JSON may span lines; a stored line may not */
        raise_validation(Py_NewRef(C.newline_reason));
        goto done;
    }
    PyObject *found, *version;
    if (PyDict_CheckExact(obj)
        && (found = PyDict_GetItemWithError(obj, C.s_event)) != NULL && PyDict_CheckExact(found)
        && (version = PyDict_GetItemWithError(obj, C.s_schema_version)) != NULL && PyUnicode_CheckExact(version)) {
        event = Py_NewRef(found);
        stored = Py_NewRef(line);
    } else {  /* a bare event to wrap, or a refusal with its reason: both in Python */
        if (PyErr_Occurred())
            goto done;
        PyObject *pair = PyObject_CallFunctionObjArgs(C.unwrap_slow, obj, line, NULL);
        if (pair == NULL)
            goto done;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            Py_DECREF(pair);
            PyErr_SetString(PyExc_TypeError, "unwrap_slow must return (event, stored)");
            goto done;
        }
        event = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
        stored = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
        Py_DECREF(pair);
    }
    PyObject *etype = PyDict_GetItemWithError(event, C.s_type);
    if (etype == NULL || !PyUnicode_CheckExact(etype)) {
        if (!PyErr_Occurred())
            raise_validation(Py_NewRef(C.type_reason));
        goto done;
    }
    Py_ssize_t index = type_index(etype);
    if (index == -2)
        goto done;
    if (index >= 0 && check_event(index, etype, event, 1) < 0)
        goto done;
    if ((record = PyTuple_New(4)) == NULL)  /* memfs.events.Record */
        goto done;
    PyTuple_SET_ITEM(record, 0, Py_NewRef(stored));
    PyTuple_SET_ITEM(record, 1, Py_NewRef(etype));
    PyTuple_SET_ITEM(record, 2, Py_NewRef(event));
    PyTuple_SET_ITEM(record, 3, Py_NewRef(index >= 0 ? C.kinds[index] : C.other_kind));
done:
    Py_DECREF(line);
    Py_XDECREF(obj);
    Py_XDECREF(event);
    Py_XDECREF(stored);
    return record;
}

PyDoc_STRVAR(decode_stored_doc, "decode_stored(line: bytes) -> (Kind, dict) | None\n\n"
             "See memfs.events.decode_stored.");

static PyObject *decode_stored(PyObject *module, PyObject *line)
{
    if (!C.ready) {
        PyErr_SetString(PyExc_RuntimeError, "memfs._contract is not configured");
        return NULL;
    }
    PyObject *obj = PyObject_Vectorcall(C.loads, &line, 1, NULL), *result = NULL;
    if (obj == NULL) {
        if (PyErr_ExceptionMatches(C.decode_error)) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        return NULL;
    }
    PyObject *event, *version, *etype;
    if (!PyDict_CheckExact(obj)
        || (event = PyDict_GetItemWithError(obj, C.s_event)) == NULL || !PyDict_CheckExact(event)
        || (version = PyDict_GetItemWithError(obj, C.s_schema_version)) == NULL || !PyUnicode_CheckExact(version)
        || (etype = PyDict_GetItemWithError(event, C.s_type)) == NULL || !PyUnicode_CheckExact(etype)) {
        if (!PyErr_Occurred())
            result = Py_NewRef(Py_None);
        goto done;
    }
    Py_ssize_t index = type_index(etype);
    if (index == -2)
        goto done;
    PyObject *kind = index >= 0 ? C.kinds[index] : C.other_kind;
    if (kind != C.other_kind) {  /* only lifecycle events are checked: they make turns */
        int r = check_event(index, etype, event, 0);
        if (r == -2)
            goto done;
        if (r == -1) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    result = PyTuple_Pack(2, kind, event);
done:
    Py_DECREF(obj);
    return result;
}

PyDoc_STRVAR(configure_doc,
             "configure(loads, decode_error, validation_error, undecodable_reason, unwrap_slow,\n"
             "          newline_reason, type_reason, other_kind, table)\n\n"
             "Called once by memfs.events. ``table`` maps each known event type to\n"
             "(fields check or None, Kind).");

static PyObject *configure(PyObject *module, PyObject *args)
{
    PyObject *table;
    if (C.ready) {
        PyErr_SetString(PyExc_RuntimeError, "memfs._contract is configured once");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOOOUUOO!:configure", &C.loads, &C.decode_error, &C.validation_error,
                          &C.undecodable_reason, &C.unwrap_slow, &C.newline_reason, &C.type_reason,
                          &C.other_kind, &PyDict_Type, &table))
        return NULL;
    Py_ssize_t n = PyDict_GET_SIZE(table), pos = 0, i = 0;
    C.table = PyDict_New();
    C.checks = PyMem_Calloc(n + 1, sizeof(Check *));
    C.kinds = PyMem_Calloc(n + 1, sizeof(PyObject *));
    if (C.table == NULL || C.checks == NULL || C.kinds == NULL)
        return PyErr_NoMemory();
    PyObject *etype, *entry;
    while (PyDict_Next(table, &pos, &etype, &entry)) {
        PyObject *spec, *kind;
        if (!PyArg_ParseTuple(entry, "OO:table entry", &spec, &kind))
            return NULL;
        if (spec != Py_None) {
            if ((C.checks[i] = compile_check(spec)) == NULL)
                return NULL;
            if (!is_object_check(C.checks[i])) {
                PyErr_Format(PyExc_TypeError, "the check of %R must be a check of an object", etype);
                return NULL;
            }
        }
        C.kinds[i] = Py_NewRef(kind);
        PyObject *index = PyLong_FromSsize_t(i++);
        if (index == NULL || PyDict_SetItem(C.table, etype, index) < 0)
            return NULL;
        Py_DECREF(index);
    }
    Py_INCREF(C.loads);
    Py_INCREF(C.decode_error);
    Py_INCREF(C.validation_error);
    Py_INCREF(C.undecodable_reason);
    Py_INCREF(C.unwrap_slow);
    Py_INCREF(C.newline_reason);
    Py_INCREF(C.type_reason);
    Py_INCREF(C.other_kind);
    C.s_event = PyUnicode_InternFromString("event");
    C.s_schema_version = PyUnicode_InternFromString("schema_version");
    C.s_type = PyUnicode_InternFromString("type");
    C.missing_mark = PyUnicode_FromString("missing required fields");
    if (C.s_event == NULL || C.s_schema_version == NULL || C.s_type == NULL || C.missing_mark == NULL)
        return NULL;
    C.ready = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, configure_doc},
    {"parse_line", parse_line, METH_O, parse_line_doc},
    {"decode_stored", decode_stored, METH_O, decode_stored_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "memfs._contract",
    "The event contract's per-line work, compiled: memfs.events configures and documents it.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__contract(void)
{
    return PyModule_Create(&module);
}
