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
 *
 * records_of(program, values, start_ns, end_ns) -> tuple[bytes, bytes]
 *
 * A page's record lines (gpu_telemetry_export.jsonl) and the live report's rows, from its values and the
 * record program the normaliser compiled for its template (bridge/normalize.py `RecordProgram`): per record,
 * the JSON text around the values, the sample position and scale of each value. The lines are the bytes
 * `orjson.dumps(record_to_dict(record)) + b"\n"` gives for each record (bridge/record_log.py, the reference;
 * tests/test_kernel.py compares them byte for byte); the rows are each record's values as native float64,
 * record after record. A float is written as orjson 3 writes it: the shortest digits that read back to the
 * same double (Ryu, vendored in bridge/ryu/ from github.com/ulfjack/ryu), fixed notation for decimal
 * exponents -5..15 ("0.00001", "1000000000000000.0"), otherwise "1e-6" / "1e+16"; not finite: null.
 *
 * points_of(pieces, value_at, values, ts_ns) -> bytes
 *
 * An OTLP page chunk from its plan (bridge/otlp/plan.py `PagePlan`): pieces[3k] is the constant before
 * point k, each point then `0x19 ts_ns 0x21 value` (fixed64 little-endian, double little-endian), and the
 * last piece closes the chunk: the bytes `b"".join` of the plan's pieces gives after filling them with
 * struct.pack (the reference, kept in plan.py).
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
 * a value beyond float64, a timestamp that is not an int64) stops it there too.
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

/* Ryu (Boost Software License 1.0, bridge/ryu/LICENSE-Boost): its shortest double to decimal (only the static
 * decoder `d2d` and `d2d_small_int` are used; its own printing is not) and its decimal to double `s2d_n`,
 * correctly rounded for up to 17 significant digits (the tokens Clinger's fast path cannot take). */
#include "ryu/d2s.c"
#include "ryu/s2d.c"

#define SHORT_TOKEN 128

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
    if (nargs < 2 || nargs > 3 || !PyTuple_Check(args[0]) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "values_of_bytes(segments: tuple[bytes, ...], body: bytes, "
                                         "previous: tuple[float, ...] = ())");
        return NULL;
    }
    PyObject *segments = args[0];
    /* The previous page's values: a value with the same bits is that float object again, not a new one (most
     * of a page's values repeat from one scrape to the next: clocks, totals, zero error counters). */
    PyObject *previous = nargs == 3 && PyTuple_Check(args[2]) &&
                         PyTuple_GET_SIZE(args[2]) == PyTuple_GET_SIZE(segments) - 1 ? args[2] : NULL;
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
        PyObject *number = NULL;
        if (previous != NULL) {
            PyObject *old = PyTuple_GET_ITEM(previous, index);
            if (PyFloat_CheckExact(old)) {
                double was = PyFloat_AS_DOUBLE(old);
                if (memcmp(&was, &value, sizeof(double)) == 0) {
                    Py_INCREF(old);
                    number = old;
                }
            }
        }
        if (number == NULL) {
            number = PyFloat_FromDouble(value);
        }
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


/* ---- record lines ---------------------------------------------------------------------------------- */

typedef struct {
    char *data;
    Py_ssize_t size;
    Py_ssize_t capacity;
} Buffer;

static int buffer_reserve(Buffer *buffer, Py_ssize_t more) {
    if (buffer->size + more <= buffer->capacity) {
        return 0;
    }
    Py_ssize_t capacity = buffer->capacity ? buffer->capacity : 4096;
    while (capacity < buffer->size + more) {
        capacity *= 2;
    }
    char *grown = PyMem_Realloc(buffer->data, capacity);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    buffer->data = grown;
    buffer->capacity = capacity;
    return 0;
}

static int buffer_add(Buffer *buffer, const char *bytes, Py_ssize_t size) {
    if (buffer_reserve(buffer, size) < 0) {
        return -1;
    }
    memcpy(buffer->data + buffer->size, bytes, size);
    buffer->size += size;
    return 0;
}

static int buffer_add_bytes(Buffer *buffer, PyObject *bytes) {
    if (!PyBytes_Check(bytes)) {
        PyErr_SetString(PyExc_TypeError, "a record program's text must be bytes");
        return -1;
    }
    return buffer_add(buffer, PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes));
}

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

static int value_at(PyObject *values, PyObject *position, double *out) {
    Py_ssize_t index = PyLong_AsSsize_t(position);
    if (index == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (index < 0 || index >= PyTuple_GET_SIZE(values)) {
        PyErr_SetString(PyExc_IndexError, "a program's sample position is outside the page's values");
        return -1;
    }
    return as_double(PyTuple_GET_ITEM(values, index), out);
}

/* One record: (head, middle, keys, positions, scales, tail, end). */
static int write_record(Buffer *lines, Buffer *rows, PyObject *entry, PyObject *values, long long start_ns,
                        int has_end, long long end_ns) {
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 7) {
        PyErr_SetString(PyExc_TypeError, "a record program entry is (head, middle, keys, positions, scales, tail, end)");
        return -1;
    }
    PyObject *keys = PyTuple_GET_ITEM(entry, 2);
    PyObject *positions = PyTuple_GET_ITEM(entry, 3);
    PyObject *scales = PyTuple_GET_ITEM(entry, 4);
    if (!PyTuple_Check(keys) || !PyTuple_Check(positions) || !PyTuple_Check(scales) ||
        PyTuple_GET_SIZE(positions) != PyTuple_GET_SIZE(keys) || PyTuple_GET_SIZE(scales) != PyTuple_GET_SIZE(keys)) {
        PyErr_SetString(PyExc_TypeError, "a record program's keys, positions and scales are tuples of one length");
        return -1;
    }
    char number[32];
    if (buffer_add_bytes(lines, PyTuple_GET_ITEM(entry, 0)) < 0 ||
        buffer_add(lines, number, write_int64(number, start_ns)) < 0 ||
        buffer_add_bytes(lines, PyTuple_GET_ITEM(entry, 1)) < 0) {
        return -1;
    }
    Py_ssize_t width = PyTuple_GET_SIZE(keys);
    if (buffer_reserve(rows, width * (Py_ssize_t)sizeof(double)) < 0) {
        return -1;
    }
    for (Py_ssize_t k = 0; k < width; k++) {
        double value;
        if (value_at(values, PyTuple_GET_ITEM(positions, k), &value) < 0) {
            return -1;
        }
        double factor;
        if (as_double(PyTuple_GET_ITEM(scales, k), &factor) < 0) {
            return -1;
        }
        if (factor != 1.0) {
            value *= factor;
        }
        memcpy(rows->data + rows->size, &value, sizeof(double));
        rows->size += sizeof(double);
        if (buffer_add_bytes(lines, PyTuple_GET_ITEM(keys, k)) < 0 ||
            buffer_add(lines, number, write_double(number, value)) < 0) {
            return -1;
        }
    }
    if (buffer_add_bytes(lines, PyTuple_GET_ITEM(entry, 5)) < 0 ||
        buffer_add(lines, number, write_int64(number, start_ns)) < 0) {
        return -1;
    }
    if (has_end) {
        if (buffer_add_bytes(lines, PyTuple_GET_ITEM(entry, 6)) < 0 ||
            buffer_add(lines, number, write_int64(number, end_ns)) < 0) {
            return -1;
        }
    }
    return buffer_add(lines, "}\n", 2);
}

static PyObject *records_of(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "records_of(program: tuple, values: tuple[float, ...], start_ns: int, "
                                         "end_ns: int | None)");
        return NULL;
    }
    long long start_ns = PyLong_AsLongLong(args[2]);
    if (start_ns == -1 && PyErr_Occurred()) {
        return NULL;
    }
    int has_end = args[3] != Py_None;
    long long end_ns = has_end ? PyLong_AsLongLong(args[3]) : 0;
    if (end_ns == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Buffer lines = {NULL, 0, 0};
    Buffer rows = {NULL, 0, 0};
    PyObject *result = NULL;
    for (Py_ssize_t index = 0; index < PyTuple_GET_SIZE(args[0]); index++) {
        if (write_record(&lines, &rows, PyTuple_GET_ITEM(args[0], index), args[1], start_ns, has_end, end_ns) < 0) {
            goto done;
        }
    }
    result = Py_BuildValue("(y#y#)", lines.data ? lines.data : "", lines.size, rows.data ? rows.data : "",
                           rows.size);
done:
    PyMem_Free(lines.data);
    PyMem_Free(rows.data);
    return result;
}

/* ---- OTLP points ------------------------------------------------------------------------------------ */

static void put_le64(char *out, uint64_t value) {
    for (int k = 0; k < 8; k++) {
        out[k] = (char)(value >> (8 * k));
    }
}

static PyObject *points_of(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_Check(args[0]) || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "points_of(pieces: list[bytes], value_at: tuple[int, ...], "
                                         "values: tuple[float, ...], ts_ns: int)");
        return NULL;
    }
    PyObject *pieces = args[0];
    PyObject *positions = args[1];
    Py_ssize_t points = PyTuple_GET_SIZE(positions);
    if (PyList_GET_SIZE(pieces) != 3 * points + 1) {
        PyErr_SetString(PyExc_ValueError, "points_of: a plan has 3 pieces per point and a closing one");
        return NULL;
    }
    unsigned long long ts_ns = PyLong_AsUnsignedLongLong(args[3]);
    if (ts_ns == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t size = 18 * points;
    for (Py_ssize_t k = 0; k <= points; k++) {
        PyObject *piece = PyList_GET_ITEM(pieces, 3 * k);
        if (!PyBytes_Check(piece)) {
            PyErr_SetString(PyExc_TypeError, "points_of: a plan's constants are bytes");
            return NULL;
        }
        size += PyBytes_GET_SIZE(piece);
    }
    PyObject *chunk = PyBytes_FromStringAndSize(NULL, size);
    if (chunk == NULL) {
        return NULL;
    }
    char *out = PyBytes_AS_STRING(chunk);
    char point[18];
    point[0] = 0x19;
    put_le64(point + 1, ts_ns);
    point[9] = 0x21;
    for (Py_ssize_t k = 0; k <= points; k++) {
        PyObject *piece = PyList_GET_ITEM(pieces, 3 * k);
        memcpy(out, PyBytes_AS_STRING(piece), PyBytes_GET_SIZE(piece));
        out += PyBytes_GET_SIZE(piece);
        if (k == points) {
            break;
        }
        double value;
        if (value_at(args[2], PyTuple_GET_ITEM(positions, k), &value) < 0) {
            Py_DECREF(chunk);
            return NULL;
        }
        if (PyFloat_Pack8(value, point + 10, 1) < 0) {
            Py_DECREF(chunk);
            return NULL;
        }
        memcpy(out, point, 18);
        out += 18;
    }
    return chunk;
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
    if (nargs != 4 || !PyTuple_Check(args[0]) || !(args[1] == Py_None || PyTuple_Check(args[1])) ||
        !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "blank_at(values: tuple[float, ...], positions: tuple[int, ...] | None, "
                                         "blanks: tuple[float, ...], not_finite: bool)");
        return NULL;
    }
    PyObject *values = args[0];
    PyObject *positions = args[1];
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
    Py_ssize_t count = positions == Py_None ? PyTuple_GET_SIZE(values) : PyTuple_GET_SIZE(positions);
    PyObject *found = PyList_New(0);
    if (found == NULL) {
        return NULL;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *position = positions == Py_None ? NULL : PyTuple_GET_ITEM(positions, k);
        Py_ssize_t index = k;
        double value;
        if (position != NULL) {
            if (value_at(values, position, &value) < 0) {
                Py_DECREF(found);
                return NULL;
            }
            index = PyLong_AsSsize_t(position);
        } else {
            if (as_double(PyTuple_GET_ITEM(values, k), &value) < 0) {
                Py_DECREF(found);
                return NULL;
            }
        }
        int blank = not_finite && !isfinite(value);
        for (Py_ssize_t b = 0; !blank && fabs(value) >= least && b < nblanks; b++) {
            blank = value == blanks[b];
        }
        if (blank) {
            PyObject *at = PyLong_FromSsize_t(index);
            if (at == NULL || PyList_Append(found, at) < 0) {
                Py_XDECREF(at);
                Py_DECREF(found);
                return NULL;
            }
            Py_DECREF(at);
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
     "A page's OTLP chunk from its plan's pieces and the values (see bridge/otlp/plan.py)."},
    {"blank_at", (PyCFunction)(void (*)(void))blank_at, METH_FASTCALL,
     "The positions holding a DCGM sentinel (or, when asked, NaN/inf) among the values."},
    {"line_shape", (PyCFunction)(void (*)(void))line_shape, METH_FASTCALL,
     "A JSON line's literal segments around its number tokens, the tokens, and the shape's key."},
    {"scan_lines", (PyCFunction)(void (*)(void))scan_lines, METH_FASTCALL,
     "The lines of a batch that have a registered shape, appended as rows (see bridge/report/series.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kernel = {
    PyModuleDef_HEAD_INIT, "bridge._kernel", "The compiled per-page kernel (bridge/_kernel.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__kernel(void) { return PyModule_Create(&kernel); }
