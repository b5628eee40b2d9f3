/* weightcheck._lintfast: two loops of header-only lint that run once per tensor name (issue #20).
 *
 * Why C: on a 92k-tensor, 163-shard checkpoint (DeepSeek-V3's names) each of these loops costs 0.03-0.1 s of
 * CPU in Python, already down to a few dict lookups per name; together they are most of what separates lint
 * from the `safe_open` floor. Each function here is the hot path of one Python function and defers every
 * case it does not take on itself to that Python code (a callback), so the results are the same objects in
 * the same order with or without this module (tests/test_native_lintfast.py compares them on fuzzed input):
 *
 *   tensor_entries   safetensors_header._parse's entry loop (well-formed entries; the rest: `slow`)
 *   group_names      names.group_by_template's `<head>.layers.<digits>.<tail>` path (new templates: `on_new`,
 *                    other names: `on_other`)
 *
 * Portable C against the CPython API only (no SIMD), built as an optional extension by setup.py: without a
 * compiler the Python loops run, and WEIGHTCHECK_NATIVE=0 selects them anywhere.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static PyObject *s_dtype, *s_shape, *s_data_offsets, *s_layers;

/* A u64 from an exact int, or -1 with `*ok` = 0 (negative, too big, or not an exact int; no error left set). */
static unsigned long long as_u64(PyObject *obj, int *ok) {
    if (!PyLong_CheckExact(obj)) {
        *ok = 0;
        return 0;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        *ok = 0;
        return 0;
    }
    return v;
}

/* The fast path of one header entry: a new TensorInfo, or NULL with no error set for "let Python decide",
 * or NULL with an error set. Takes only what the Python fast path also takes (a subset of it suffices: the
 * Python callback then runs the same fast path and, failing it, the exact checks). */
static PyObject *fast_entry(PyObject *name, PyObject *entry, PyObject *dtype_of, PyTypeObject *cls,
                            unsigned long long *begin_out, unsigned long long *end_out) {
    if (!PyDict_CheckExact(entry))
        return NULL;
    PyObject *dtype = PyDict_GetItemWithError(entry, s_dtype);
    if (dtype == NULL)
        return NULL;
    PyObject *shape = PyDict_GetItemWithError(entry, s_shape);
    if (shape == NULL)
        return NULL;
    PyObject *offsets = PyDict_GetItemWithError(entry, s_data_offsets);
    if (offsets == NULL)
        return NULL;
    if (!PyUnicode_CheckExact(dtype) || !PyList_CheckExact(shape) || !PyList_CheckExact(offsets) ||
        PyList_GET_SIZE(offsets) != 2)
        return NULL;
    PyObject *known = PyDict_GetItemWithError(dtype_of, dtype);
    if (known == NULL || !PyTuple_CheckExact(known) || PyTuple_GET_SIZE(known) != 2)
        return NULL;
    int ok = 1;
    unsigned long long bits = as_u64(PyTuple_GET_ITEM(known, 1), &ok);
    unsigned long long numel = 1;
    Py_ssize_t ndim = PyList_GET_SIZE(shape);
    for (Py_ssize_t i = 0; i < ndim && ok; i++) {
        unsigned long long dim = as_u64(PyList_GET_ITEM(shape, i), &ok);
        if (ok && __builtin_mul_overflow(numel, dim, &numel))
            ok = 0;
    }
    PyObject *begin = PyList_GET_ITEM(offsets, 0), *end = PyList_GET_ITEM(offsets, 1);
    unsigned long long b = as_u64(begin, &ok), e = as_u64(end, &ok), nbits = 0;
    if (!ok || __builtin_mul_overflow(numel, bits, &nbits) || b > e || (nbits & 7) || e - b != (nbits >> 3))
        return NULL;
    PyObject *shape_tuple = PyList_AsTuple(shape);
    if (shape_tuple == NULL)
        return NULL;
    PyObject *items = PyTuple_Pack(5, name, PyTuple_GET_ITEM(known, 0), shape_tuple, begin, end);
    Py_DECREF(shape_tuple);
    if (items == NULL)
        return NULL;
    /* tuple.__new__(cls, items): the NamedTuple without its constructor's Python-level call */
    PyObject *args = PyTuple_Pack(1, items);
    Py_DECREF(items);
    if (args == NULL)
        return NULL;
    PyObject *info = PyTuple_Type.tp_new(cls, args, NULL);
    Py_DECREF(args);
    *begin_out = b;
    *end_out = e;
    return info;
}

/* tensor_entries(doc, dtype_of, cls, slow) -> (tensors, end or None) | None
 *
 * `doc`: the parsed header (name -> entry, `__metadata__` removed); `dtype_of`: dtype -> (dtype, bits);
 * `cls`: TensorInfo; `slow(name, entry)`: the Python path for an entry, returning a TensorInfo or None (a
 * problem was reported: stop, return None). `end`: where the data ends when the offsets tile in header
 * order, else None (the caller sorts). */
static PyObject *tensor_entries(PyObject *self, PyObject *args) {
    PyObject *doc, *dtype_of, *cls, *slow;
    if (!PyArg_ParseTuple(args, "O!O!O!O:tensor_entries", &PyDict_Type, &doc, &PyDict_Type, &dtype_of,
                          &PyType_Type, &cls, &slow))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "cls must be a tuple subclass");
        return NULL;
    }
    PyObject *tensors = PyDict_New();
    if (tensors == NULL)
        return NULL;
    int tiled = 1;
    unsigned long long pos = 0;
    Py_ssize_t i = 0;
    PyObject *name, *entry;
    while (PyDict_Next(doc, &i, &name, &entry)) {
        unsigned long long b = 0, e = 0;
        int exact = 1;
        PyObject *info = fast_entry(name, entry, dtype_of, (PyTypeObject *)cls, &b, &e);
        if (info == NULL) {
            if (PyErr_Occurred())
                goto fail;
            exact = 0;
            Py_INCREF(name); /* the callback runs Python code: hold what PyDict_Next lent */
            Py_INCREF(entry);
            info = PyObject_CallFunctionObjArgs(slow, name, entry, NULL);
            Py_DECREF(entry);
            Py_DECREF(name);
            if (info == NULL)
                goto fail;
            if (info == Py_None) {
                Py_DECREF(info);
                Py_DECREF(tensors);
                Py_RETURN_NONE;
            }
        }
        if (PyDict_SetItem(tensors, name, info) < 0) {
            Py_DECREF(info);
            goto fail;
        }
        if (tiled && !exact) {
            /* The Python path's TensorInfo: its offsets, as `info[3] == pos and info[4] >= pos` reads them. */
            int ok = PyTuple_Check(info) && PyTuple_GET_SIZE(info) == 5;
            if (ok) {
                b = as_u64(PyTuple_GET_ITEM(info, 3), &ok);
                e = as_u64(PyTuple_GET_ITEM(info, 4), &ok);
            }
            if (!ok)
                tiled = 0;
        }
        Py_DECREF(info);
        if (tiled) {
            if (b == pos && e >= pos)
                pos = e;
            else
                tiled = 0;
        }
    }
    if (tiled)
        return Py_BuildValue("(NN)", tensors, PyLong_FromUnsignedLongLong(pos));
    return Py_BuildValue("(NO)", tensors, Py_None);
fail:
    Py_DECREF(tensors);
    return NULL;
}

#define ID_CACHE 1024

static void free_ids(PyObject **ids) {
    for (int i = 0; i < 2 * ID_CACHE; i++)
        Py_XDECREF(ids[i]);
    PyMem_Free(ids);
}

/* group_names(names, on_new, on_other) -> None
 *
 * For each name of the form `<head>.layers.<ASCII digits>.<tail>` (the first `.layers.`, `head` and `tail`
 * not empty): the group of (head, tail) is `on_new(head, tail)` -> (list, expert id or None), asked once per
 * pair, and `(name, (layer,))` or `(name, (layer, expert))` is appended to that list. Any other name goes to
 * `on_other(name)`. The order of calls is the order of the names, as in the Python loop. */
static PyObject *group_names(PyObject *self, PyObject *args) {
    PyObject *names, *on_new, *on_other;
    if (!PyArg_ParseTuple(args, "OOO:group_names", &names, &on_new, &on_other))
        return NULL;
    PyObject *iter = PyObject_GetIter(names);
    if (iter == NULL)
        return NULL;
    PyObject *seen = PyDict_New(); /* head -> {tail -> (list, expert)} */
    PyObject **ids = PyMem_Calloc(2 * ID_CACHE, sizeof(PyObject *));
    if (seen == NULL || ids == NULL) {
        Py_XDECREF(seen);
        PyMem_Free(ids);
        Py_DECREF(iter);
        return seen == NULL ? NULL : PyErr_NoMemory();
    }
    PyObject **singles = ids + ID_CACHE;
    PyObject *name;
    while ((name = PyIter_Next(iter)) != NULL) {
        int taken = 0;
        if (PyUnicode_CheckExact(name)) {
            Py_ssize_t n = PyUnicode_GET_LENGTH(name);
            Py_ssize_t at = PyUnicode_Find(name, s_layers, 0, n, 1);
            if (at == -2)
                goto fail_name;
            Py_ssize_t start = at + 8; /* len(".layers.") */
            Py_ssize_t dot = at > 0 ? PyUnicode_FindChar(name, '.', start, n, 1) : -1;
            if (dot == -2)
                goto fail_name;
            if (dot > start && dot + 1 < n) {
                int kind = PyUnicode_KIND(name);
                const void *data = PyUnicode_DATA(name);
                int digits = 1;
                for (Py_ssize_t k = start; k < dot && digits; k++) {
                    Py_UCS4 ch = PyUnicode_READ(kind, data, k);
                    digits = ch >= '0' && ch <= '9';
                }
                if (digits) {
                    PyObject *head = PyUnicode_Substring(name, 0, at);
                    PyObject *tail = head ? PyUnicode_Substring(name, dot + 1, n) : NULL;
                    PyObject *per = NULL, *hit = NULL, *idx = NULL, *values = NULL, *item = NULL;
                    int failed = 1;
                    if (tail == NULL)
                        goto done;
                    per = PyDict_GetItemWithError(seen, head);
                    if (per == NULL) {
                        if (PyErr_Occurred() || (per = PyDict_New()) == NULL)
                            goto done;
                        if (PyDict_SetItem(seen, head, per) < 0) {
                            Py_DECREF(per);
                            goto done;
                        }
                        Py_DECREF(per); /* `seen` holds it */
                    }
                    hit = PyDict_GetItemWithError(per, tail);
                    if (hit == NULL) {
                        if (PyErr_Occurred())
                            goto done;
                        hit = PyObject_CallFunctionObjArgs(on_new, head, tail, NULL);
                        if (hit == NULL)
                            goto done;
                        if (!PyTuple_CheckExact(hit) || PyTuple_GET_SIZE(hit) != 2 ||
                            !PyList_Check(PyTuple_GET_ITEM(hit, 0))) {
                            PyErr_SetString(PyExc_TypeError, "on_new must return (list, expert id or None)");
                            Py_DECREF(hit);
                            goto done;
                        }
                        if (PyDict_SetItem(per, tail, hit) < 0) {
                            Py_DECREF(hit);
                            goto done;
                        }
                        Py_DECREF(hit); /* `per` holds it */
                    }
                    PyObject *expert = PyTuple_GET_ITEM(hit, 1);
                    /* A layer id written plainly below ID_CACHE ("0".."1023", no leading zero): one string
                     * and one `(id,)` tuple per id for the whole call, not per name (92k names, 61 ids). */
                    long v = -1;
                    if (dot - start <= 4 && (dot - start == 1 || PyUnicode_READ(kind, data, start) != '0')) {
                        v = 0;
                        for (Py_ssize_t k = start; k < dot; k++)
                            v = v * 10 + (long)(PyUnicode_READ(kind, data, k) - '0');
                        if (v >= ID_CACHE)
                            v = -1;
                    }
                    if (v >= 0 && ids[v] == NULL && (ids[v] = PyUnicode_Substring(name, start, dot)) == NULL)
                        goto done;
                    idx = v >= 0 ? Py_NewRef(ids[v]) : PyUnicode_Substring(name, start, dot);
                    if (idx == NULL)
                        goto done;
                    if (expert == Py_None && v >= 0) {
                        if (singles[v] == NULL && (singles[v] = PyTuple_Pack(1, idx)) == NULL)
                            goto done;
                        values = Py_NewRef(singles[v]);
                    } else {
                        values = expert == Py_None ? PyTuple_Pack(1, idx) : PyTuple_Pack(2, idx, expert);
                    }
                    if (values == NULL)
                        goto done;
                    item = PyTuple_Pack(2, name, values);
                    if (item == NULL || PyList_Append(PyTuple_GET_ITEM(hit, 0), item) < 0)
                        goto done;
                    failed = 0;
                done:
                    Py_XDECREF(item);
                    Py_XDECREF(values);
                    Py_XDECREF(idx);
                    Py_XDECREF(tail);
                    Py_XDECREF(head);
                    if (failed)
                        goto fail_name;
                    taken = 1;
                }
            }
        }
        if (!taken) {
            PyObject *r = PyObject_CallFunctionObjArgs(on_other, name, NULL);
            if (r == NULL)
                goto fail_name;
            Py_DECREF(r);
        }
        Py_DECREF(name);
    }
    free_ids(ids);
    Py_DECREF(seen);
    Py_DECREF(iter);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
fail_name:
    Py_DECREF(name);
    free_ids(ids);
    Py_DECREF(seen);
    Py_DECREF(iter);
    return NULL;
}

static PyMethodDef methods[] = {
    {"tensor_entries", tensor_entries, METH_VARARGS, "The well-formed entries of a parsed safetensors header."},
    {"group_names", group_names, METH_VARARGS, "Tensor names grouped by layer template (see names.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "weightcheck._lintfast", NULL, -1, methods};

PyMODINIT_FUNC PyInit__lintfast(void) {
    s_dtype = PyUnicode_InternFromString("dtype");
    s_shape = PyUnicode_InternFromString("shape");
    s_data_offsets = PyUnicode_InternFromString("data_offsets");
    s_layers = PyUnicode_InternFromString(".layers.");
    if (!s_dtype || !s_shape || !s_data_offsets || !s_layers)
        return NULL;
    return PyModule_Create(&module);
}
