/* The compiled per-page kernel: the template check and the values of a page that follows its template.
 *
 * The same functions as their Python references (named below), which stay the fallback (a machine without a
 * compiler installs and runs without this module). tests/test_kernel.py feeds both the same real and mutated
 * pages and compares the results exactly.
 *
 * Arguments are flat: a page's values are one bytes of native float64 (`values`), a plan's numbers one bytes
 * of native int32 (`lengths`, `layout`, `positions`), its constant text one bytes. Between scrapes the caches
 * are cold, and a thousand small Python objects per page (a float per value, a bytes per piece of text) cost
 * more in cache misses than the work itself; three buffers read front to back do not. Every number is checked
 * against the buffer it points into: arguments that disagree are an exception, never a read outside a buffer.
 *
 * values_of_bytes(text: bytes, lengths: bytes, body: bytes) -> bytes | None
 *
 * bridge/parse/template.py `PageTemplate.values_of_bytes_python`. `text` is the page's bytes between its
 * values, cut into segments of `lengths` (the first runs from the start of the page to the first value, each
 * next one from a value's line end to the next value, the last to the end of the page). The body follows
 * the template when it is exactly segment, value, segment, ..., segment, and no value holds a newline. Each
 * value is read as Python's float() reads bytes (surrounding ASCII white space allowed, "inf"/"nan" in any
 * case, overflow to ±inf), except that an underscore makes the page miss the template (float() reads "1_000";
 * the exposition format does not). Any miss returns None and the caller reads the page line by line. The
 * values come back as native float64 bytes.
 *
 * records_of(text, layout, scales, values, start_ns, end_ns) -> tuple[bytes, bytes]
 *
 * A page's record lines (gpu_telemetry_export.jsonl) and the live report's rows, from its values and the
 * record program the normaliser compiled for its template (bridge/normalize.py `RecordProgram`, laid out by
 * `flat_program`): per record, the JSON text around the values, the sample position and scale of each value.
 * The lines are the bytes `orjson.dumps(record_to_dict(record)) + b"\n"` gives for each record
 * (bridge/record_log.py, the reference; tests/test_kernel.py compares them byte for byte); the rows are each
 * record's values as native float64, record after record. A float is written as orjson 3 writes it: the
 * shortest digits that read back to the same double (Ryu, vendored in bridge/vendor/ryu/ from
 * github.com/ulfjack/ryu), fixed notation for decimal exponents -5..15 ("0.00001", "1000000000000000.0"),
 * otherwise "1e-6" / "1e+16"; not finite: null.
 *
 * points_of(frame, layout, values, ts_ns, into=None) -> bytes | bytearray
 *
 * An OTLP page chunk from its plan (bridge/otlp/plan.py `PagePlan`): a copy of `frame`, the plan's chunk with
 * placeholder points, with each point of `layout` ((offset, sample position) pairs) written at its offset as
 * `0x19 ts_ns 0x21 value` (fixed64 little-endian, double little-endian): the bytes `b"".join` of the plan's
 * pieces gives after filling them with struct.pack (the reference, kept in plan.py). With `into`, a bytearray
 * of the frame's size that already holds the frame (a buffer of the plan's), the points are written there and
 * `into` is returned: no copy of the frame.
 *
 * sums_of(values, positions, last) -> tuple[bytes, tuple[int, ...]]
 *
 * The values at `positions` (a plan's counter points), gathered as float64 bytes, and the indices k whose value
 * is below `last`'s k-th (the previous page's: a counter reset), as `value < last` compares two floats in
 * Python (the reference, kept in plan.py).
 *
 * line_shape(line) -> tuple[int, tuple[bytes, ...], tuple[bytes, ...]] | None
 * scan_lines(batch, position, shapes) -> tuple[int, int]
 *
 * The report's reader of record-log lines (bridge/report/series.py `SeriesAccumulator.add_path`). A JSON line's
 * shape is its text around its number tokens: `line_shape` cuts a line into those literal segments and the
 * tokens, with a key (a hash of the line's first literal bytes). `scan_lines` reads the lines of a batch
 * from `position` while each one has the shape of a registered target (`shapes`: key -> list of targets
 * (segments, columns, timestamp slot, rows out, times out), registered by the Python reader from a line it
 * read with orjson): the literal segments equal, every token a JSON number; it appends the line's values in
 * the target's column order (native float64) and its timestamp (int64) to the target's two bytearrays,
 * and stops at the first line no target takes (returned: its position, and the count of lines taken). A
 * token it cannot read exactly as orjson and the Python reader would (an integer of more than 19 digits,
 * a value beyond float64, a timestamp that is not an int64) stops it there too, and so does a line longer
 * than SCAN_MAX_LINE bytes (record_log.py's MAX_LINE_BYTES: no record is that long; the Python reader
 * skips it), so no line costs the scan more than that.
 *
 * blank_at(values, positions, blanks, not_finite) -> tuple[int, ...]
 *
 * The positions (of `positions`, or of every value when None) whose value is one of `blanks` (DCGM's
 * sentinels, bridge/fields.py BLANK_VALUES) or, with `not_finite`, NaN or ±inf: what the normaliser and the
 * OTLP plan ask of every page, usually to hear "none".
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Ryu (Apache 2.0 or Boost 1.0, bridge/vendor/ryu/): its shortest double to decimal (only the static
 * decoder `d2d` and `d2d_small_int` are used; its own printing is not) and its decimal to double `s2d_n`,
 * correctly rounded for up to 17 significant digits (the tokens Clinger's fast path cannot take). */
#include "ryu/d2s.c"
#include "ryu/s2d.c"

#define SHORT_TOKEN 128


/* ---- flat arguments ----------------------------------------------------------------------------------- */

/* A page's values as the kernel passes them around: bytes of native float64, one per sample line. */
static int doubles_of(PyObject *raw, const double **out, Py_ssize_t *count) {
    if (!PyBytes_Check(raw) || PyBytes_GET_SIZE(raw) % (Py_ssize_t)sizeof(double) != 0) {
        PyErr_SetString(PyExc_TypeError, "values are bytes of native float64");
        return -1;
    }
    *out = (const double *)PyBytes_AS_STRING(raw);
    *count = PyBytes_GET_SIZE(raw) / (Py_ssize_t)sizeof(double);
    return 0;
}

/* A plan's numbers (lengths, offsets, positions): bytes of native int32, never negative. */
static int ints_of(PyObject *raw, const int32_t **out, Py_ssize_t *count) {
    if (!PyBytes_Check(raw) || PyBytes_GET_SIZE(raw) % (Py_ssize_t)sizeof(int32_t) != 0) {
        PyErr_SetString(PyExc_TypeError, "a plan's numbers are bytes of native int32");
        return -1;
    }
    *out = (const int32_t *)PyBytes_AS_STRING(raw);
    *count = PyBytes_GET_SIZE(raw) / (Py_ssize_t)sizeof(int32_t);
    for (Py_ssize_t k = 0; k < *count; k++) {
        if ((*out)[k] < 0) {
            PyErr_SetString(PyExc_ValueError, "a plan's numbers are never negative");
            return -1;
        }
    }
    return 0;
}

/* (first, second), taking the caller's references to both. */
static PyObject *pair_of(PyObject *first, PyObject *second) {
    PyObject *pair = PyTuple_Pack(2, first, second);
    Py_DECREF(first);
    Py_DECREF(second);
    return pair;
}

/* `index` appended to a list of positions (what blank_at and sums_of find). */
static int append_index(PyObject *list, Py_ssize_t index) {
    PyObject *at = PyLong_FromSsize_t(index);
    if (at == NULL || PyList_Append(list, at) < 0) {
        Py_XDECREF(at);
        return -1;
    }
    Py_DECREF(at);
    return 0;
}

/* A double as read from unaligned bytes. */
static double double_at(const double *values, Py_ssize_t index) {
    double value;
    memcpy(&value, (const char *)values + index * (Py_ssize_t)sizeof(double), sizeof(double));
    return value;
}

/* A plain decimal token ("501.073", "-42", "1.5e3", "457.62929649600005") of at most 17 significant digits,
 * read as float() reads it. Clinger's fast path: when its digits make an integer m <= 2^53 and its power of
 * ten 10^e has |e| <= 22, it is exactly m * 10^e or m / 10^-e, one correctly rounded operation on two exact
 * doubles. Otherwise Ryu's s2d, away from the subnormal and overflow ends. Anything else returns 0 and takes
 * CPython's reader. (Only where doubles are evaluated as doubles: FLT_EVAL_METHOD 0, as on x86-64.) */
static int parse_plain(const char *start, Py_ssize_t size, double *out) {
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 0
    static const double powers[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    const char *p = start, *end = start + size;
    int negative = 0;
    if (p < end && (*p == '-' || *p == '+')) {
        negative = *p == '-';
        p++;
    }
    uint64_t mantissa = 0;
    int digits = 0, fraction = 0, any = 0;
    for (; p < end && *p >= '0' && *p <= '9'; p++, any = 1) {
        if (mantissa != 0 || *p != '0') {
            if (++digits > 17) {
                return 0;
            }
            mantissa = mantissa * 10 + (uint64_t)(*p - '0');
        }
    }
    if (p < end && *p == '.') {
        for (p++; p < end && *p >= '0' && *p <= '9'; p++, any = 1) {
            fraction++;
            if (mantissa != 0 || *p != '0') {
                if (++digits > 17) {
                    return 0;
                }
                mantissa = mantissa * 10 + (uint64_t)(*p - '0');
            }
        }
    }
    if (!any) {
        return 0;
    }
    int exponent = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int exponent_negative = 0;
        if (p < end && (*p == '-' || *p == '+')) {
            exponent_negative = *p == '-';
            p++;
        }
        int exponent_digits = 0;
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            if (++exponent_digits > 4) {
                return 0;
            }
            exponent = exponent * 10 + (*p - '0');
        }
        if (exponent_digits == 0) {
            return 0;
        }
        if (exponent_negative) {
            exponent = -exponent;
        }
    }
    if (p != end) {
        return 0;
    }
    exponent -= fraction;
    double value;
    if (mantissa == 0) {
        value = 0.0;
    } else if (mantissa <= (1ULL << 53) && exponent >= -22 && exponent <= 22) {
        value = exponent < 0 ? (double)mantissa / powers[-exponent] : (double)mantissa * powers[exponent];
    } else if (exponent >= -300 && exponent <= 290 && size < 64 && start[0] != '+') {
        /* Ryu's s2d for the rest of the plain tokens of at most 16 digits, away from the subnormal and
         * overflow ends (left to CPython's reader) */
        if (s2d_n(start, (int)size, &value) != SUCCESS) {
            return 0;
        }
        return *out = value, 1;
    } else {
        return 0;
    }
    *out = negative ? -value : value;
    return 1;
#else
    (void)start;
    (void)size;
    (void)out;
    return 0;
#endif
}

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
    if (parse_plain(start, size, out)) {
        return 0;
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
    if (nargs != 3 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "values_of_bytes(text: bytes, lengths: bytes, body: bytes)");
        return NULL;
    }
    const char *text = PyBytes_AS_STRING(args[0]);
    Py_ssize_t text_size = PyBytes_GET_SIZE(args[0]);
    const int32_t *lengths;
    Py_ssize_t count;
    if (ints_of(args[1], &lengths, &count) < 0) {
        return NULL;
    }
    const char *body = PyBytes_AS_STRING(args[2]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[2]);
    if (count == 0) {
        Py_RETURN_NONE;
    }
    PyObject *values = PyBytes_FromStringAndSize(NULL, (count - 1) * (Py_ssize_t)sizeof(double));
    if (values == NULL) {
        return NULL;
    }
    char *out = PyBytes_AS_STRING(values);
    Py_ssize_t position = 0;
    Py_ssize_t cursor = 0;  /* in `text` */
    for (Py_ssize_t index = 0; index < count; index++) {
        Py_ssize_t length = lengths[index];
        if (length > text_size - cursor) {
            Py_DECREF(values);
            PyErr_SetString(PyExc_ValueError, "values_of_bytes: the lengths run past the text");
            return NULL;
        }
        if (length > size - position || memcmp(body + position, text + cursor, length) != 0) {
            goto miss;
        }
        position += length;
        cursor += length;
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
        memcpy(out + index * (Py_ssize_t)sizeof(double), &value, sizeof(double));
        position = end;
    }
    if (position != size || cursor != text_size) {
        goto miss;
    }
    return values;
miss:
    Py_DECREF(values);
    Py_RETURN_NONE;
}


/* ---- record lines ---------------------------------------------------------------------------------- */

/* An int64 in decimal, as orjson writes an int. At most 20 characters. */
static int write_int64(char *out, long long value) {
    char digits[24];
    int count = 0;
    unsigned long long magnitude = value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value;
    do {
        digits[count++] = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude != 0);
    int length = 0;
    if (value < 0) {
        out[length++] = '-';
    }
    while (count > 0) {
        out[length++] = digits[--count];
    }
    return length;
}

/* A double as orjson 3 writes it (see the top of this file). At most 25 characters. */
static int write_double(char *out, double value) {
    if (!isfinite(value)) {
        memcpy(out, "null", 4);
        return 4;
    }
    const uint64_t bits = double_to_bits(value);
    const bool sign = (bits >> 63) != 0;
    const uint64_t ieee_mantissa = bits & ((1ull << DOUBLE_MANTISSA_BITS) - 1);
    const uint32_t ieee_exponent = (uint32_t)((bits >> DOUBLE_MANTISSA_BITS) & ((1u << DOUBLE_EXPONENT_BITS) - 1));
    int length = 0;
    if (sign) {
        out[length++] = '-';
    }
    if (ieee_exponent == 0 && ieee_mantissa == 0) {
        memcpy(out + length, "0.0", 3);
        return length + 3;
    }
    floating_decimal_64 decimal;
    if (!d2d_small_int(ieee_mantissa, ieee_exponent, &decimal)) {
        decimal = d2d(ieee_mantissa, ieee_exponent);
    }
    uint64_t mantissa = decimal.mantissa;
    int32_t exponent = decimal.exponent;
    while (mantissa % 10 == 0) {  /* a small integer keeps its trailing zeros in the mantissa */
        mantissa /= 10;
        exponent++;
    }
    char digits[20];
    int count = (int)decimalLength17(mantissa);
    for (int k = count - 1; k >= 0; k--) {
        digits[k] = (char)('0' + mantissa % 10);
        mantissa /= 10;
    }
    const int scientific = exponent + count - 1; /* value = d.ddd × 10^scientific */
    if (scientific >= 16 || scientific < -5) {
        out[length++] = digits[0];
        if (count > 1) {
            out[length++] = '.';
            memcpy(out + length, digits + 1, count - 1);
            length += count - 1;
        }
        out[length++] = 'e';
        out[length++] = scientific < 0 ? '-' : '+';
        length += write_int64(out + length, scientific < 0 ? -scientific : scientific);
    } else if (scientific >= 0) {
        const int whole = scientific + 1;
        for (int k = 0; k < whole; k++) {
            out[length++] = k < count ? digits[k] : '0';
        }
        out[length++] = '.';
        if (count > whole) {
            memcpy(out + length, digits + whole, count - whole);
            length += count - whole;
        } else {
            out[length++] = '0';
        }
    } else {
        out[length++] = '0';
        out[length++] = '.';
        for (int k = 0; k < -scientific - 1; k++) {
            out[length++] = '0';
        }
        memcpy(out + length, digits, count);
        length += count;
    }
    return length;
}

/* A number of a values tuple or a program as a double: a float or an int only, so that no Python code runs
 * while the kernel holds borrowed references (a float subclass's __float__ could change what they point to). */
static int as_double(PyObject *number, double *out) {
    if (PyFloat_CheckExact(number)) {
        *out = PyFloat_AS_DOUBLE(number);
        return 0;
    }
    if (PyLong_CheckExact(number)) {
        *out = PyLong_AsDouble(number);
        return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
    }
    PyErr_Format(PyExc_TypeError, "the kernel reads floats and ints, not %.100s", Py_TYPE(number)->tp_name);
    return -1;
}

static PyObject *records_of(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "records_of(text: bytes, layout: bytes, scales: bytes, values: bytes, "
                                         "start_ns: int, end_ns: int | None)");
        return NULL;
    }
    const char *text = PyBytes_AS_STRING(args[0]);
    Py_ssize_t text_size = PyBytes_GET_SIZE(args[0]);
    const int32_t *layout;
    Py_ssize_t layout_size, nscales, nvalues;
    const double *scales, *values;
    if (ints_of(args[1], &layout, &layout_size) < 0 || doubles_of(args[2], &scales, &nscales) < 0 ||
        doubles_of(args[3], &values, &nvalues) < 0) {
        return NULL;
    }
    long long start_ns = PyLong_AsLongLong(args[4]);
    if (start_ns == -1 && PyErr_Occurred()) {
        return NULL;
    }
    int has_end = args[5] != Py_None;
    long long end_ns = has_end ? PyLong_AsLongLong(args[5]) : 0;
    if (end_ns == -1 && PyErr_Occurred()) {
        return NULL;
    }
    /* The size of the lines: the text, and at most 25 characters a value and 20 a time. */
    Py_ssize_t keys = 0, records = 0;
    for (Py_ssize_t at = 0; at < layout_size; records++) {
        if (layout_size - at < 5 || (layout_size - at - 5) / 2 < layout[at]) {
            PyErr_SetString(PyExc_ValueError, "records_of: a record's layout runs past the end");
            return NULL;
        }
        keys += layout[at];
        at += 5 + 2 * (Py_ssize_t)layout[at];
    }
    if (keys != nscales) {
        PyErr_SetString(PyExc_ValueError, "records_of: one scale per key");
        return NULL;
    }
    PyObject *lines = PyBytes_FromStringAndSize(NULL, text_size + 25 * keys + 60 * records + 2 * records);
    PyObject *rows = PyBytes_FromStringAndSize(NULL, keys * (Py_ssize_t)sizeof(double));
    if (lines == NULL || rows == NULL) {
        goto fail;
    }
    char *out = PyBytes_AS_STRING(lines);
    char *row = PyBytes_AS_STRING(rows);
    Py_ssize_t cursor = 0;
    Py_ssize_t scale = 0;
#define TEXT(length) do {                                                                              \
        Py_ssize_t n_ = (length);                                                                      \
        if (n_ > text_size - cursor) {                                                                 \
            PyErr_SetString(PyExc_ValueError, "records_of: the layout runs past the text");            \
            goto fail;                                                                                 \
        }                                                                                              \
        memcpy(out, text + cursor, n_);                                                                \
        out += n_;                                                                                     \
        cursor += n_;                                                                                  \
    } while (0)
    for (Py_ssize_t at = 0; at < layout_size;) {
        const int32_t *record = layout + at;
        Py_ssize_t width = record[0];
        TEXT(record[1]);
        out += write_int64(out, start_ns);
        TEXT(record[2]);
        for (Py_ssize_t k = 0; k < width; k++) {
            Py_ssize_t position = record[5 + 2 * k + 1];
            if (position >= nvalues) {
                PyErr_SetString(PyExc_IndexError, "a program's sample position is outside the page's values");
                goto fail;
            }
            double value = double_at(values, position);
            double factor = double_at(scales, scale++);
            if (factor != 1.0) {
                value *= factor;
            }
            memcpy(row, &value, sizeof(double));
            row += sizeof(double);
            TEXT(record[5 + 2 * k]);
            out += write_double(out, value);
        }
        TEXT(record[3]);
        out += write_int64(out, start_ns);
        TEXT(record[4]);
        if (has_end) {
            out += write_int64(out, end_ns);
        }
        memcpy(out, "}\n", 2);
        out += 2;
        at += 5 + 2 * width;
    }
#undef TEXT
    if (cursor != text_size) {
        PyErr_SetString(PyExc_ValueError, "records_of: the layout does not use the whole text");
        goto fail;
    }
    if (_PyBytes_Resize(&lines, out - PyBytes_AS_STRING(lines)) < 0) {
        lines = NULL;
        goto fail;
    }
    return pair_of(lines, rows);
fail:
    Py_XDECREF(lines);
    Py_XDECREF(rows);
    return NULL;
}

/* ---- OTLP points ------------------------------------------------------------------------------------ */

static void put_le64(char *out, uint64_t value) {
    for (int k = 0; k < 8; k++) {
        out[k] = (char)(value >> (8 * k));
    }
}

static PyObject *points_of(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 4 || nargs > 5 || !(PyBytes_Check(args[0]) || PyByteArray_Check(args[0]))
            || (nargs == 5 && args[4] != Py_None && !PyByteArray_Check(args[4]))) {
        PyErr_SetString(PyExc_TypeError, "points_of(frame: bytes | bytearray, layout: bytes, values: bytes, "
                                         "ts_ns: int, into: bytearray | None = None)");
        return NULL;
    }
    const int32_t *layout;
    const double *values;
    Py_ssize_t layout_size, nvalues;
    if (ints_of(args[1], &layout, &layout_size) < 0 || doubles_of(args[2], &values, &nvalues) < 0) {
        return NULL;
    }
    if (layout_size % 2 != 0) {
        PyErr_SetString(PyExc_ValueError, "points_of: the layout is (offset, position) pairs");
        return NULL;
    }
    unsigned long long ts_ns = PyLong_AsUnsignedLongLong(args[3]);
    if (ts_ns == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    const char *frame = PyBytes_Check(args[0]) ? PyBytes_AS_STRING(args[0]) : PyByteArray_AS_STRING(args[0]);
    Py_ssize_t size = PyBytes_Check(args[0]) ? PyBytes_GET_SIZE(args[0]) : PyByteArray_GET_SIZE(args[0]);
    for (Py_ssize_t k = 0; k < layout_size; k += 2) {
        if (layout[k] > size - 18 || layout[k + 1] >= nvalues) {
            PyErr_SetString(PyExc_ValueError, "points_of: a point outside the frame or the values");
            return NULL;
        }
    }
    /* `into`: a buffer that already holds this frame (a chunk of the plan's sent in an earlier batch): only the
       points are written, not the frame's ~100 KB copied again. */
    PyObject *chunk;
    char *out;
    if (nargs == 5 && args[4] != Py_None) {
        if (PyByteArray_GET_SIZE(args[4]) != size) {
            PyErr_SetString(PyExc_ValueError, "points_of: the buffer is not the frame's size");
            return NULL;
        }
        chunk = Py_NewRef(args[4]);
        out = PyByteArray_AS_STRING(chunk);
    } else {
        chunk = PyBytes_FromStringAndSize(frame, size);
        if (chunk == NULL) {
            return NULL;
        }
        out = PyBytes_AS_STRING(chunk);
    }
    char point[18];
    point[0] = 0x19;
    put_le64(point + 1, ts_ns);
    point[9] = 0x21;
    for (Py_ssize_t k = 0; k < layout_size; k += 2) {
        double value = double_at(values, layout[k + 1]);
        uint64_t bits;
        memcpy(&bits, &value, sizeof(bits));
        put_le64(point + 10, bits);  /* little-endian on the wire, as PyFloat_Pack8(…, 1) */
        memcpy(out + layout[k], point, 18);
    }
    return chunk;
}

/* ---- counter values ---------------------------------------------------------------------------------- */

static PyObject *sums_of(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "sums_of(values: bytes, positions: bytes, last: bytes)");
        return NULL;
    }
    const double *values, *last;
    const int32_t *positions;
    Py_ssize_t nvalues, count, nlast;
    if (doubles_of(args[0], &values, &nvalues) < 0 || ints_of(args[1], &positions, &count) < 0 ||
        doubles_of(args[2], &last, &nlast) < 0) {
        return NULL;
    }
    if (nlast != count) {
        PyErr_SetString(PyExc_ValueError, "sums_of: one last value per position");
        return NULL;
    }
    PyObject *gathered = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(double));
    PyObject *fell = PyList_New(0);
    if (gathered == NULL || fell == NULL) {
        goto fail;
    }
    char *out = PyBytes_AS_STRING(gathered);
    for (Py_ssize_t k = 0; k < count; k++) {
        if (positions[k] >= nvalues) {
            PyErr_SetString(PyExc_IndexError, "sums_of: a position outside the values");
            goto fail;
        }
        double value = double_at(values, positions[k]);
        memcpy(out + k * (Py_ssize_t)sizeof(double), &value, sizeof(double));
        if (value < double_at(last, k) && append_index(fell, k) < 0) {
            goto fail;
        }
    }
    PyObject *fell_tuple = PyList_AsTuple(fell);
    Py_DECREF(fell);
    if (fell_tuple == NULL) {
        Py_DECREF(gathered);
        return NULL;
    }
    return pair_of(gathered, fell_tuple);
fail:
    Py_XDECREF(gathered);
    Py_XDECREF(fell);
    return NULL;
}

/* ---- record-log lines to rows ----------------------------------------------------------------------- */

#define SHAPE_KEY_BYTES 160
#define MAX_TOKENS 1024

static int is_number_char(char c) {
    return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

/* The key of a line's shape: FNV-1a over its first SHAPE_KEY_BYTES literal bytes, a number token counting
 * as one 0x01 byte. Strings are followed so that digits inside them stay literal. */
static uint64_t shape_key(const char *line, Py_ssize_t size) {
    uint64_t hash = 14695981039346656037ULL;
    int in_string = 0, fed = 0;
    for (Py_ssize_t i = 0; i < size && fed < SHAPE_KEY_BYTES; i++) {
        char c = line[i];
        if (in_string) {
            if (c == '\\' && i + 1 < size) {
                hash = (hash ^ (unsigned char)c) * 1099511628211ULL;
                c = line[++i];
                fed++;
            } else if (c == '"') {
                in_string = 0;
            }
        } else if (c == '"') {
            in_string = 1;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            while (i + 1 < size && is_number_char(line[i + 1])) {
                i++;
            }
            c = 0x01;
        }
        hash = (hash ^ (unsigned char)c) * 1099511628211ULL;
        fed++;
    }
    return hash >> 2; /* a small Python int */
}

static PyObject *line_shape(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 1 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "line_shape(line: bytes)");
        return NULL;
    }
    const char *line = PyBytes_AS_STRING(args[0]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    PyObject *segments = PyList_New(0), *tokens = PyList_New(0), *result = NULL;
    if (segments == NULL || tokens == NULL) {
        goto done;
    }
    Py_ssize_t literal = 0;
    int in_string = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        char c = line[i];
        if (in_string) {
            if (c == '\\') {
                i++;
            } else if (c == '"') {
                in_string = 0;
            }
            continue;
        }
        if (c == '"') {
            in_string = 1;
            continue;
        }
        if (c != '-' && !(c >= '0' && c <= '9')) {
            continue;
        }
        Py_ssize_t end = i + 1;
        while (end < size && is_number_char(line[end])) {
            end++;
        }
        PyObject *segment = PyBytes_FromStringAndSize(line + literal, i - literal);
        PyObject *token = PyBytes_FromStringAndSize(line + i, end - i);
        int failed = segment == NULL || token == NULL || PyList_Append(segments, segment) < 0 ||
                     PyList_Append(tokens, token) < 0;
        Py_XDECREF(segment);
        Py_XDECREF(token);
        if (failed) {
            goto done;
        }
        if (PyList_GET_SIZE(tokens) > MAX_TOKENS) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        literal = end;
        i = end - 1;
    }
    PyObject *last = PyBytes_FromStringAndSize(line + literal, size - literal);
    if (last == NULL || PyList_Append(segments, last) < 0) {
        Py_XDECREF(last);
        goto done;
    }
    Py_DECREF(last);
    PyObject *segment_tuple = PyList_AsTuple(segments), *token_tuple = PyList_AsTuple(tokens);
    if (segment_tuple != NULL && token_tuple != NULL) {
        result = Py_BuildValue("(KOO)", (unsigned long long)shape_key(line, size), segment_tuple, token_tuple);
    }
    Py_XDECREF(segment_tuple);
    Py_XDECREF(token_tuple);
done:
    Py_XDECREF(segments);
    Py_XDECREF(tokens);
    return result;
}

/* A JSON number (RFC 8259: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?); *integer tells whether it has
 * neither fraction nor exponent, *digits how many digits its integer part has. */
static int json_number(const char *p, Py_ssize_t size, int *integer, int *digits) {
    Py_ssize_t i = 0;
    if (i < size && p[i] == '-') {
        i++;
    }
    Py_ssize_t first = i;
    if (i < size && p[i] == '0') {
        i++;
    } else if (i < size && p[i] >= '1' && p[i] <= '9') {
        while (i < size && p[i] >= '0' && p[i] <= '9') {
            i++;
        }
    } else {
        return 0;
    }
    *digits = (int)(i - first);
    *integer = 1;
    if (i < size && p[i] == '.') {
        *integer = 0;
        Py_ssize_t start = ++i;
        while (i < size && p[i] >= '0' && p[i] <= '9') {
            i++;
        }
        if (i == start) {
            return 0;
        }
    }
    if (i < size && (p[i] == 'e' || p[i] == 'E')) {
        *integer = 0;
        i++;
        if (i < size && (p[i] == '+' || p[i] == '-')) {
            i++;
        }
        Py_ssize_t start = i;
        while (i < size && p[i] >= '0' && p[i] <= '9') {
            i++;
        }
        if (i == start) {
            return 0;
        }
    }
    return i == size;
}

/* A value token as the Python reader stores it (orjson's number, packed as float64), or -1. */
static int json_value(const char *p, Py_ssize_t size, double *out) {
    int integer, digits;
    if (!json_number(p, size, &integer, &digits) || (integer && digits > 19)) {
        return -1;
    }
    if (parse_token(p, size, out) < 0 || !isfinite(*out)) {
        return -1;
    }
    return 0;
}

/* A timestamp token: a JSON integer within int64 (what the Python reader's array('q') takes). */
static int json_int64(const char *p, Py_ssize_t size, long long *out) {
    int integer, digits;
    if (!json_number(p, size, &integer, &digits) || !integer || digits > 19) {
        return -1;
    }
    int negative = p[0] == '-';
    unsigned long long value = 0;
    for (Py_ssize_t i = negative; i < size; i++) {
        value = value * 10 + (unsigned long long)(p[i] - '0'); /* 19 digits fit in 64 bits */
    }
    if (value > (negative ? 9223372036854775808ULL : 9223372036854775807ULL)) {
        return -1;
    }
    *out = negative ? (long long)(0ULL - value) : (long long)value;
    return 0;
}

static int bytearray_append(PyObject *array, const void *data, Py_ssize_t size) {
    Py_ssize_t used = PyByteArray_GET_SIZE(array);
    if (PyByteArray_Resize(array, used + size) < 0) {
        return -1;
    }
    memcpy(PyByteArray_AS_STRING(array) + used, data, size);
    return 0;
}

/* 1: the line has the target's shape and its row was appended; 0: not this target; -1: an error. */
static int take_line(PyObject *target, const char *line, Py_ssize_t size, Py_ssize_t *starts, Py_ssize_t *ends,
                     double *row) {
    if (!PyTuple_Check(target) || PyTuple_GET_SIZE(target) != 5) {
        PyErr_SetString(PyExc_TypeError, "a line target is (segments, columns, timestamp slot, rows, times)");
        return -1;
    }
    PyObject *segments = PyTuple_GET_ITEM(target, 0), *columns = PyTuple_GET_ITEM(target, 1);
    PyObject *rows = PyTuple_GET_ITEM(target, 3), *times = PyTuple_GET_ITEM(target, 4);
    if (!PyTuple_Check(segments) || !PyTuple_Check(columns) || !PyByteArray_Check(rows) ||
        !PyByteArray_Check(times)) {
        PyErr_SetString(PyExc_TypeError, "a line target is (tuple, tuple, int, bytearray, bytearray)");
        return -1;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(segments);
    if (count < 1 || count - 1 > MAX_TOKENS) {
        return 0;
    }
    Py_ssize_t position = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *segment = PyTuple_GET_ITEM(segments, k);
        Py_ssize_t length = PyBytes_GET_SIZE(segment);
        if (length > size - position || memcmp(line + position, PyBytes_AS_STRING(segment), length) != 0) {
            return 0;
        }
        position += length;
        if (k == count - 1) {
            break;
        }
        starts[k] = position;
        while (position < size && is_number_char(line[position])) {
            position++;
        }
        if (position == starts[k]) {
            return 0;
        }
        ends[k] = position;
    }
    if (position != size) {
        return 0;
    }
    Py_ssize_t slot = PyLong_AsSsize_t(PyTuple_GET_ITEM(target, 2));
    if (slot < 0 || slot >= count - 1) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "a line target's timestamp slot is not one of its tokens");
        }
        return -1;
    }
    long long t_ns;
    if (json_int64(line + starts[slot], ends[slot] - starts[slot], &t_ns) < 0) {
        return 0;
    }
    Py_ssize_t width = PyTuple_GET_SIZE(columns);
    for (Py_ssize_t c = 0; c < width; c++) {
        Py_ssize_t token = PyLong_AsSsize_t(PyTuple_GET_ITEM(columns, c));
        if (token < 0 || token >= count - 1) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "a line target's column is not one of its tokens");
            }
            return -1;
        }
        if (json_value(line + starts[token], ends[token] - starts[token], &row[c]) < 0) {
            return 0;
        }
    }
    int64_t t64 = (int64_t)t_ns;
    if (bytearray_append(rows, row, width * (Py_ssize_t)sizeof(double)) < 0 ||
        bytearray_append(times, &t64, sizeof(t64)) < 0) {
        return -1;
    }
    return 1;
}

#define SCAN_MAX_LINE ((Py_ssize_t)1 << 20)

static PyObject *scan_lines(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3 || !PyBytes_Check(args[0]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "scan_lines(batch: bytes, position: int, shapes: dict)");
        return NULL;
    }
    const char *batch = PyBytes_AS_STRING(args[0]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t position = PyLong_AsSsize_t(args[1]);
    if (position == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t *starts = PyMem_Malloc(2 * MAX_TOKENS * sizeof(Py_ssize_t));
    double *row = PyMem_Malloc(MAX_TOKENS * sizeof(double));
    if (starts == NULL || row == NULL) {
        PyMem_Free(starts);
        PyMem_Free(row);
        return PyErr_NoMemory();
    }
    Py_ssize_t *ends = starts + MAX_TOKENS;
    Py_ssize_t taken = 0;
    int failed = 0;
    while (position >= 0 && position < size) {
        const char *line = batch + position;
        const char *newline = memchr(line, '\n', size - position);
        Py_ssize_t length = newline ? newline - line : size - position;
        if (length > SCAN_MAX_LINE) {
            break;
        }
        PyObject *key = PyLong_FromUnsignedLongLong(shape_key(line, length));
        if (key == NULL) {
            failed = 1;
            break;
        }
        PyObject *targets = PyDict_GetItemWithError(args[2], key);
        Py_DECREF(key);
        if (targets == NULL) {
            failed = PyErr_Occurred() != NULL;
            break;
        }
        int took = 0;
        if (PyList_Check(targets)) {
            for (Py_ssize_t t = 0; t < PyList_GET_SIZE(targets) && took == 0; t++) {
                took = take_line(PyList_GET_ITEM(targets, t), line, length, starts, ends, row);
            }
        }
        if (took <= 0) {
            failed = took < 0;
            break;
        }
        taken++;
        position += length + (newline != NULL);
    }
    PyMem_Free(starts);
    PyMem_Free(row);
    if (failed) {
        return NULL;
    }
    return Py_BuildValue("(nn)", position, taken);
}

/* ---- absent values ---------------------------------------------------------------------------------- */

static PyObject *blank_at(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !(args[1] == Py_None || PyBytes_Check(args[1])) || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "blank_at(values: bytes, positions: bytes | None, "
                                         "blanks: tuple[float, ...], not_finite: bool)");
        return NULL;
    }
    const double *values;
    Py_ssize_t nvalues;
    if (doubles_of(args[0], &values, &nvalues) < 0) {
        return NULL;
    }
    const int32_t *positions = NULL;
    Py_ssize_t count = nvalues;
    if (args[1] != Py_None && ints_of(args[1], &positions, &count) < 0) {
        return NULL;
    }
    int not_finite = PyObject_IsTrue(args[3]);
    if (not_finite < 0) {
        return NULL;
    }
    double blanks[64];
    Py_ssize_t nblanks = PyTuple_GET_SIZE(args[2]);
    if (nblanks > 64) {
        PyErr_SetString(PyExc_ValueError, "blank_at: at most 64 blank values");
        return NULL;
    }
    double least = INFINITY;  /* the smallest blank in magnitude: a value below it is none of them */
    for (Py_ssize_t k = 0; k < nblanks; k++) {
        if (as_double(PyTuple_GET_ITEM(args[2], k), &blanks[k]) < 0) {
            return NULL;
        }
        least = fmin(least, fabs(blanks[k]));
    }
    PyObject *found = PyList_New(0);
    if (found == NULL) {
        return NULL;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        Py_ssize_t index = positions == NULL ? k : positions[k];
        if (index >= nvalues) {
            Py_DECREF(found);
            PyErr_SetString(PyExc_IndexError, "blank_at: a position outside the values");
            return NULL;
        }
        double value = double_at(values, index);
        int blank = not_finite && !isfinite(value);
        for (Py_ssize_t b = 0; !blank && fabs(value) >= least && b < nblanks; b++) {
            blank = value == blanks[b];
        }
        if (blank && append_index(found, index) < 0) {
            Py_DECREF(found);
            return NULL;
        }
    }
    PyObject *result = PyList_AsTuple(found);
    Py_DECREF(found);
    return result;
}

static PyMethodDef methods[] = {
    {"values_of_bytes", (PyCFunction)(void (*)(void))values_of_bytes, METH_FASTCALL,
     "The values of a page that follows its template's segments, or None (see bridge/parse/template.py)."},
    {"records_of", (PyCFunction)(void (*)(void))records_of, METH_FASTCALL,
     "A page's record lines and live-report rows from its record program (see bridge/normalize.py)."},
    {"points_of", (PyCFunction)(void (*)(void))points_of, METH_FASTCALL,
     "A page's OTLP chunk: its plan's frame with the points written in (see bridge/otlp/plan.py)."},
    {"sums_of", (PyCFunction)(void (*)(void))sums_of, METH_FASTCALL,
     "A plan's counter values gathered, and which of them fell below the last page's (see bridge/otlp/plan.py)."},
    {"blank_at", (PyCFunction)(void (*)(void))blank_at, METH_FASTCALL,
     "The positions holding a DCGM sentinel (or, when asked, NaN/inf) among the values."},
    {"line_shape", (PyCFunction)(void (*)(void))line_shape, METH_FASTCALL,
     "A JSON line's literal segments around its number tokens, the tokens, and the shape's key."},
    {"scan_lines", (PyCFunction)(void (*)(void))scan_lines, METH_FASTCALL,
     "The lines of a batch that have a registered shape, appended as rows (see bridge/report/series.py)."},
    {NULL, NULL, 0, NULL},
};

/* Multi-phase initialisation (PEP 489): the module holds no state of its own (every function works on its
 * arguments only), so there is nothing to set up when it is executed, and each interpreter that imports it gets
 * its own module object. */
static int kernel_exec(PyObject *module) {
    (void)module;
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, kernel_exec},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef kernel = {
    PyModuleDef_HEAD_INIT,
    .m_name = "bridge._kernel",
    .m_doc = "The compiled per-page kernel (bridge/_kernel.c).",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__kernel(void) { return PyModuleDef_Init(&kernel); }
