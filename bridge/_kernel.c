/* The compiled per-page kernel: the template check and the values of a page that follows its template.
 *
 * The same function as bridge/parse/template.py's `PageTemplate.values_of_bytes` in Python, which stays
 * the reference and the fallback (a machine without a compiler installs and runs without this module).
 * tests/test_kernel.py feeds both the same real and mutated pages and compares the results exactly.
 *
 * values_of_bytes(segments: tuple[bytes, ...], body: bytes) -> tuple[float, ...] | None
 *
 * `segments` are the page's bytes between its values (the first runs from the start of the page to the
 * first value, each next one from a value's line end to the next value, the last to the end of the
 * page). The body follows the template when it is exactly segment, value, segment, ..., segment, and
 * no value holds a newline. Each value is read as Python's float() reads bytes (surrounding ASCII white
 * space allowed, "inf"/"nan" in any case, overflow to ±inf), except that an underscore makes the page
 * miss the template (float() reads "1_000"; the exposition format does not). Any miss returns None and
 * the caller reads the page line by line.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define SHORT_TOKEN 128

/* Python's float() of one token, or -1 with no exception set when it is not a number. */
static int parse_token(const char *start, Py_ssize_t size, double *out) {
    while (size > 0 && Py_ISSPACE(*start)) {
        start++;
        size--;
    }
    while (size > 0 && Py_ISSPACE(start[size - 1])) {
        size--;
    }
    if (size == 0 || memchr(start, '_', size) != NULL || memchr(start, '\0', size) != NULL) {
        return -1;
    }
    char small[SHORT_TOKEN];
    char *buffer = small;
    if (size >= SHORT_TOKEN) {
        buffer = PyMem_Malloc(size + 1);
        if (buffer == NULL) {
            PyErr_Clear();
            return -1;
        }
    }
    memcpy(buffer, start, size);
    buffer[size] = '\0';
    char *end = NULL;
    double value = PyOS_string_to_double(buffer, &end, NULL);
    int ok = !(value == -1.0 && PyErr_Occurred()) && end == buffer + size;
    if (buffer != small) {
        PyMem_Free(buffer);
    }
    if (!ok) {
        PyErr_Clear();
        return -1;
    }
    *out = value;
    return 0;
}

static PyObject *values_of_bytes(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyTuple_Check(args[0]) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "values_of_bytes(segments: tuple[bytes, ...], body: bytes)");
        return NULL;
    }
    PyObject *segments = args[0];
    const char *body = PyBytes_AS_STRING(args[1]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[1]);
    Py_ssize_t count = PyTuple_GET_SIZE(segments);
    if (count == 0) {
        Py_RETURN_NONE;
    }
    PyObject *values = PyTuple_New(count - 1);
    if (values == NULL) {
        return NULL;
    }
    Py_ssize_t position = 0;
    for (Py_ssize_t index = 0; index < count; index++) {
        PyObject *segment = PyTuple_GET_ITEM(segments, index);
        if (!PyBytes_Check(segment)) {
            Py_DECREF(values);
            PyErr_SetString(PyExc_TypeError, "segments must be bytes");
            return NULL;
        }
        Py_ssize_t length = PyBytes_GET_SIZE(segment);
        if (length > size - position || memcmp(body + position, PyBytes_AS_STRING(segment), length) != 0) {
            goto miss;
        }
        position += length;
        if (index == count - 1) {
            break;
        }
        const char *newline = memchr(body + position, '\n', size - position);
        if (newline == NULL) {
            goto miss;
        }
        Py_ssize_t end = newline - body;
        double value;
        if (parse_token(body + position, end - position, &value) < 0) {
            goto miss;
        }
        PyObject *number = PyFloat_FromDouble(value);
        if (number == NULL) {
            Py_DECREF(values);
            return NULL;
        }
        PyTuple_SET_ITEM(values, index, number);
        position = end;
    }
    if (position != size) {
        goto miss;
    }
    return values;
miss:
    Py_DECREF(values);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"values_of_bytes", (PyCFunction)(void (*)(void))values_of_bytes, METH_FASTCALL,
     "The values of a page that follows its template's segments, or None (see bridge/parse/template.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kernel = {
    PyModuleDef_HEAD_INIT, "bridge._kernel", "The compiled per-page kernel (bridge/_kernel.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__kernel(void) { return PyModule_Create(&kernel); }
