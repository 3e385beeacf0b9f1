/*
 * eventlane.log._native: the log's hot loops in C.
 *
 * Optional speedups; every function here has a pure-Python reference that the tests prove
 * identical (eventlane/log/partitioner.py for the hash, eventlane/log/embedded/batch.py for the codec,
 * eventlane/log/kafka/records.py for take_messages):
 *
 *   murmur2(data) -> int                      Kafka's Utils.murmur2, a signed 32-bit int
 *   partition_for_key(key, n) -> int          (murmur2(key) & 0x7fffffff) % n
 *   partitions_for_keys(keys, n) -> list[int] the same for a sequence of keys
 *   encode_records(records, base_timestamp, offset_deltas, timestamps) -> bytes
 *   decode_records(buf, start, end, base_offset, base_timestamp, timestamp_type,
 *                  topic, partition, min_offset[, record_cls]) -> list[record_cls]
 *   index_keys(buf, start, end, base_offset, last, key_id) -> int    (the cleaner's pass 1)
 *   keep_flags(buf, start, end, base_offset, last, key_id, horizon) -> (bytes, int | None)
 *                                                               (the cleaner's pass 2)
 *   take_messages(msgs, topic, partition, nxt, stop, size, max_bytes, kinds, out,
 *                 record_cls) -> (int, int, int)    (KafkaLog's read of consumed messages)
 *
 * The record layout (all integers big-endian) is documented in eventlane/log/embedded/batch.py:
 *
 *   int32 length | int32 offset_delta | int64 timestamp_delta | int32 key_length | key |
 *   int32 value_length | value | int32 header_count |
 *   header_count x (int32 name_length | UTF-8 name | int32 value_length | value)
 *
 * Lengths of -1 mean null (key, value, header value). The decoder never reads outside the
 * buffer it is given nor outside the record's declared length: malformed input raises
 * ValueError (UnicodeDecodeError, a ValueError, for a header name that is not UTF-8).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------------------------- */
/* Kafka's murmur2                                                                         */
/* ------------------------------------------------------------------------------------- */

#define MURMUR2_SEED 0x9747b28cu
#define MURMUR2_M 0x5bd1e995u
#define MURMUR2_R 24

/* org.apache.kafka.common.utils.Utils.murmur2, in unsigned 32-bit arithmetic (Java's int
 * multiplication and >>> are the same bit operations). */
static uint32_t
kafka_murmur2(const unsigned char *data, Py_ssize_t length)
{
    uint32_t h = MURMUR2_SEED ^ (uint32_t)length;
    Py_ssize_t length4 = length / 4;
    Py_ssize_t i;
    for (i = 0; i < length4; i++) {
        const unsigned char *b = data + i * 4;
        uint32_t k = (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) |
                     ((uint32_t)b[3] << 24);
        k *= MURMUR2_M;
        k ^= k >> MURMUR2_R;
        k *= MURMUR2_M;
        h *= MURMUR2_M;
        h ^= k;
    }
    {
        const unsigned char *tail = data + (length & ~(Py_ssize_t)3);
        switch (length & 3) {
        case 3:
            h ^= (uint32_t)tail[2] << 16;
            /* fall through */
        case 2:
            h ^= (uint32_t)tail[1] << 8;
            /* fall through */
        case 1:
            h ^= (uint32_t)tail[0];
            h *= MURMUR2_M;
        }
    }
    h ^= h >> 13;
    h *= MURMUR2_M;
    h ^= h >> 15;
    return h;
}

/* Java's int view of a 32-bit pattern, without implementation-defined conversions. */
static long
as_java_int(uint32_t h)
{
    return (h & 0x80000000u) ? -(long)(~h) - 1 : (long)h;
}

/* A read-only view of a bytes-like object: bytes directly, anything else through the
 * buffer protocol (released by view_release). */
typedef struct {
    const char *ptr;
    Py_ssize_t len;
    Py_buffer buffer;
    int has_buffer;
} view_t;

static int
view_get(PyObject *obj, view_t *v)
{
    if (PyBytes_Check(obj)) {
        v->ptr = PyBytes_AS_STRING(obj);
        v->len = PyBytes_GET_SIZE(obj);
        v->has_buffer = 0;
        return 0;
    }
    if (PyObject_GetBuffer(obj, &v->buffer, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    v->ptr = (const char *)v->buffer.buf;
    v->len = v->buffer.len;
    v->has_buffer = 1;
    return 0;
}

static void
view_release(view_t *v)
{
    if (v->has_buffer) {
        PyBuffer_Release(&v->buffer);
        v->has_buffer = 0;
    }
}

static PyObject *
native_murmur2(PyObject *module, PyObject *data)
{
    view_t v;
    uint32_t h;
    (void)module;
    if (view_get(data, &v) < 0) {
        return NULL;
    }
    h = kafka_murmur2((const unsigned char *)v.ptr, v.len);
    view_release(&v);
    return PyLong_FromLong(as_java_int(h));
}

static int
parse_num_partitions(PyObject *obj, Py_ssize_t *out)
{
    Py_ssize_t n = PyNumber_AsSsize_t(obj, PyExc_OverflowError);
    if (n == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (n < 1) {
        PyErr_Format(PyExc_ValueError, "num_partitions must be at least 1, not %zd", n);
        return -1;
    }
    *out = n;
    return 0;
}

static PyObject *
native_partition_for_key(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    view_t v;
    Py_ssize_t n;
    uint32_t h;
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "partition_for_key(key, num_partitions)");
        return NULL;
    }
    if (parse_num_partitions(args[1], &n) < 0) {
        return NULL;
    }
    if (args[0] == Py_None) {
        PyErr_SetString(PyExc_TypeError, "a keyless record has no key partition");
        return NULL;
    }
    if (view_get(args[0], &v) < 0) {
        return NULL;
    }
    h = kafka_murmur2((const unsigned char *)v.ptr, v.len);
    view_release(&v);
    return PyLong_FromSsize_t((Py_ssize_t)((h & 0x7fffffffu) % (uint64_t)n));
}

static PyObject *
native_partitions_for_keys(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *seq, *out;
    Py_ssize_t n, count, i;
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "partitions_for_keys(keys, num_partitions)");
        return NULL;
    }
    if (parse_num_partitions(args[1], &n) < 0) {
        return NULL;
    }
    /* A list or tuple is used in place (nothing below runs Python code, so it cannot
     * change under us); any other iterable is copied into a list first. */
    seq = PySequence_Fast(args[0], "keys must be a sequence of bytes");
    if (seq == NULL) {
        return NULL;
    }
    count = PySequence_Fast_GET_SIZE(seq);
    out = PyList_New(count);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    for (i = 0; i < count; i++) {
        PyObject *key = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *p;
        uint32_t h;
        if (PyBytes_CheckExact(key)) {
            h = kafka_murmur2((const unsigned char *)PyBytes_AS_STRING(key),
                              PyBytes_GET_SIZE(key));
        }
        else {
            view_t v;
            if (key == Py_None) {
                PyErr_Format(PyExc_TypeError,
                             "key %zd is None: a keyless record has no key partition", i);
                goto error;
            }
            if (view_get(key, &v) < 0) {
                PyErr_Format(PyExc_TypeError, "key %zd must be bytes, not %.100s", i,
                             Py_TYPE(key)->tp_name);
                goto error;
            }
            h = kafka_murmur2((const unsigned char *)v.ptr, v.len);
            view_release(&v);
        }
        p = PyLong_FromSsize_t((Py_ssize_t)((h & 0x7fffffffu) % (uint64_t)n));
        if (p == NULL) {
            goto error;
        }
        PyList_SET_ITEM(out, i, p);
    }
    Py_DECREF(seq);
    return out;
error:
    Py_DECREF(seq);
    Py_DECREF(out);
    return NULL;
}

/* ------------------------------------------------------------------------------------- */
/* Big-endian helpers                                                                      */
/* ------------------------------------------------------------------------------------- */

static inline int32_t
rd_i32(const unsigned char *p)
{
    uint32_t u = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
                 (uint32_t)p[3];
    return (u & 0x80000000u) ? (int32_t)(-(int64_t)(~u) - 1) : (int32_t)u;
}

static inline int64_t
rd_i64(const unsigned char *p)
{
    uint64_t u = ((uint64_t)p[0] << 56) | ((uint64_t)p[1] << 48) | ((uint64_t)p[2] << 40) |
                 ((uint64_t)p[3] << 32) | ((uint64_t)p[4] << 24) | ((uint64_t)p[5] << 16) |
                 ((uint64_t)p[6] << 8) | (uint64_t)p[7];
    return (u & 0x8000000000000000ull) ? -(int64_t)(~u) - 1 : (int64_t)u;
}

static inline void
wr_u32(unsigned char *p, uint32_t u)
{
    p[0] = (unsigned char)(u >> 24);
    p[1] = (unsigned char)(u >> 16);
    p[2] = (unsigned char)(u >> 8);
    p[3] = (unsigned char)u;
}

static inline void
wr_u64(unsigned char *p, uint64_t u)
{
    wr_u32(p, (uint32_t)(u >> 32));
    wr_u32(p + 4, (uint32_t)u);
}

static inline int
add_overflows(int64_t a, int64_t b)
{
    return (b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b);
}

/* ------------------------------------------------------------------------------------- */
/* encode_records                                                                          */
/* ------------------------------------------------------------------------------------- */

/* Fetch record i's fields, checking its shape. Borrowed references. */
static int
record_fields(PyObject *rec, Py_ssize_t i, PyObject **key, PyObject **value,
              PyObject **headers, PyObject **timestamp)
{
    PyObject **items;
    if (PyTuple_Check(rec) && PyTuple_GET_SIZE(rec) == 4) {
        items = &PyTuple_GET_ITEM(rec, 0);
    }
    else if (PyList_Check(rec) && PyList_GET_SIZE(rec) == 4) {
        items = &PyList_GET_ITEM(rec, 0);
    }
    else {
        PyErr_Format(PyExc_TypeError,
                     "record %zd must be a (key, value, headers, timestamp) tuple, not %.100s",
                     i, Py_TYPE(rec)->tp_name);
        return -1;
    }
    *key = items[0];
    *value = items[1];
    *headers = items[2];
    *timestamp = items[3];
    return 0;
}

/* Length of an optional bytes field (-1 for None), or -2 with an exception set. */
static Py_ssize_t
nullable_len(PyObject *obj, Py_ssize_t i, const char *what)
{
    view_t v;
    Py_ssize_t len;
    if (obj == Py_None) {
        return -1;
    }
    if (PyBytes_Check(obj)) {
        len = PyBytes_GET_SIZE(obj);
    }
    else if (PyByteArray_Check(obj) || PyMemoryView_Check(obj)) {
        if (view_get(obj, &v) < 0) {
            return -2;
        }
        len = v.len;
        view_release(&v);
    }
    else {
        PyErr_Format(PyExc_TypeError, "record %zd: %s must be bytes or None, not %.100s", i,
                     what, Py_TYPE(obj)->tp_name);
        return -2;
    }
    if (len > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "record %zd: %s of %zd bytes is too large", i, what,
                     len);
        return -2;
    }
    return len;
}

static PyObject *
headers_seq(PyObject *headers, Py_ssize_t i)
{
    if (PyTuple_Check(headers) || PyList_Check(headers)) {
        return headers;
    }
    PyErr_Format(PyExc_TypeError, "record %zd: headers must be a tuple of (str, bytes) pairs, "
                 "not %.100s", i, Py_TYPE(headers)->tp_name);
    return NULL;
}

static int
header_pair(PyObject *pair, Py_ssize_t i, PyObject **name, PyObject **hval)
{
    if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2) {
        *name = PyTuple_GET_ITEM(pair, 0);
        *hval = PyTuple_GET_ITEM(pair, 1);
    }
    else if (PyList_Check(pair) && PyList_GET_SIZE(pair) == 2) {
        *name = PyList_GET_ITEM(pair, 0);
        *hval = PyList_GET_ITEM(pair, 1);
    }
    else {
        PyErr_Format(PyExc_TypeError, "record %zd: a header must be a (str, bytes) pair, "
                     "not %.100s", i, Py_TYPE(pair)->tp_name);
        return -1;
    }
    if (!PyUnicode_Check(*name)) {
        PyErr_Format(PyExc_TypeError, "record %zd: header name must be str, not %.100s", i,
                     Py_TYPE(*name)->tp_name);
        return -1;
    }
    return 0;
}

/* Bounded writer: every write is checked against the allocation, so even a record list
 * changed between the sizing and the filling pass can never write out of bounds. */
typedef struct {
    unsigned char *p;
    unsigned char *end;
} writer_t;

static inline int
w_room(writer_t *w, Py_ssize_t n)
{
    return w->end - w->p >= n;
}

static int
w_bytes_field(writer_t *w, PyObject *obj)
{
    /* int32 length (-1 for None) then the bytes */
    view_t v;
    if (obj == Py_None) {
        if (!w_room(w, 4)) {
            return -1;
        }
        wr_u32(w->p, 0xffffffffu);
        w->p += 4;
        return 0;
    }
    if (view_get(obj, &v) < 0) {
        return -1;
    }
    if (v.len > INT32_MAX || !w_room(w, 4 + v.len)) {
        view_release(&v);
        return -1;
    }
    wr_u32(w->p, (uint32_t)v.len);
    memcpy(w->p + 4, v.ptr, (size_t)v.len);
    w->p += 4 + v.len;
    view_release(&v);
    return 0;
}

/* An int-like object as a Python int (new reference), naming the record on failure. */
static PyObject *
as_int(PyObject *obj, Py_ssize_t i, const char *what)
{
    PyObject *r;
    if (PyLong_Check(obj)) {
        Py_INCREF(obj);
        return obj;
    }
    r = PyNumber_Index(obj);
    if (r == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "record %zd: %s must be an int, not %.100s", i, what,
                     Py_TYPE(obj)->tp_name);
    }
    return r;
}

/* timestamp - base_timestamp as an int64, exactly as Python's arbitrary-precision
 * subtraction followed by a 64-bit pack would have it. */
static int
timestamp_delta(PyObject *ts_obj, PyObject *base_obj, long long base_ts, int base_overflow,
                Py_ssize_t i, int64_t *out)
{
    PyObject *ts = as_int(ts_obj, i, "timestamp");
    int overflow = 0;
    long long t, d;
    if (ts == NULL) {
        return -1;
    }
    t = PyLong_AsLongLongAndOverflow(ts, &overflow);
    if (t == -1 && PyErr_Occurred()) {
        Py_DECREF(ts);
        return -1;
    }
    if (!overflow && !base_overflow &&
        !((base_ts > 0 && t < INT64_MIN + base_ts) || (base_ts < 0 && t > INT64_MAX + base_ts))) {
        Py_DECREF(ts);
        *out = (int64_t)t - (int64_t)base_ts;
        return 0;
    }
    {
        PyObject *diff = PyNumber_Subtract(ts, base_obj);
        Py_DECREF(ts);
        if (diff == NULL) {
            return -1;
        }
        d = PyLong_AsLongLongAndOverflow(diff, &overflow);
        Py_DECREF(diff);
        if (d == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (overflow) {
            PyErr_Format(PyExc_ValueError, "record %zd: timestamp delta does not fit in 64 bits",
                         i);
            return -1;
        }
        *out = (int64_t)d;
        return 0;
    }
}

static int
offset_delta(PyObject *obj, Py_ssize_t i, int32_t *out)
{
    PyObject *od = as_int(obj, i, "offset delta");
    int overflow = 0;
    long long d;
    if (od == NULL) {
        return -1;
    }
    d = PyLong_AsLongLongAndOverflow(od, &overflow);
    Py_DECREF(od);
    if (d == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow || d < INT32_MIN || d > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "record %zd: offset delta does not fit in 32 bits", i);
        return -1;
    }
    *out = (int32_t)d;
    return 0;
}

static PyObject *
native_encode_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *records, *base_obj, *deltas_obj = Py_None, *stamps_obj = Py_None;
    PyObject *recs = NULL, *deltas = NULL, *stamps = NULL, *out = NULL;
    int64_t *ts_deltas = NULL;
    int32_t *off_deltas = NULL;
    int32_t *lengths = NULL;
    long long base_ts = 0;
    int base_overflow = 0;
    Py_ssize_t n, i, total = 0;
    writer_t w;
    (void)module;

    if (nargs < 2 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "encode_records(records, base_timestamp, "
                                         "offset_deltas=None, timestamps=None)");
        return NULL;
    }
    records = args[0];
    base_obj = args[1];
    if (nargs >= 3) {
        deltas_obj = args[2];
    }
    if (nargs == 4) {
        stamps_obj = args[3];
    }
    if (!PyLong_Check(base_obj)) {
        PyErr_Format(PyExc_TypeError, "base_timestamp must be an int, not %.100s",
                     Py_TYPE(base_obj)->tp_name);
        return NULL;
    }
    base_ts = PyLong_AsLongLongAndOverflow(base_obj, &base_overflow);
    if (base_ts == -1 && PyErr_Occurred()) {
        return NULL;
    }

    /* Snapshots: the conversions below may run Python code (__index__, __sub__). */
    recs = PySequence_Tuple(records);
    if (recs == NULL) {
        return NULL;
    }
    n = PyTuple_GET_SIZE(recs);
    if (deltas_obj != Py_None) {
        deltas = PySequence_Tuple(deltas_obj);
        if (deltas == NULL) {
            goto error;
        }
        if (PyTuple_GET_SIZE(deltas) < n) {
            PyErr_Format(PyExc_ValueError, "offset_deltas has %zd entries for %zd records",
                         PyTuple_GET_SIZE(deltas), n);
            goto error;
        }
    }
    if (stamps_obj != Py_None) { /* each record's timestamp, in place of its own field */
        stamps = PySequence_Tuple(stamps_obj);
        if (stamps == NULL) {
            goto error;
        }
        if (PyTuple_GET_SIZE(stamps) < n) {
            PyErr_Format(PyExc_ValueError, "timestamps has %zd entries for %zd records",
                         PyTuple_GET_SIZE(stamps), n);
            goto error;
        }
    }
    ts_deltas = PyMem_Malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    off_deltas = PyMem_Malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    lengths = PyMem_Malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (ts_deltas == NULL || off_deltas == NULL || lengths == NULL) {
        PyErr_NoMemory();
        goto error;
    }

    /* Pass 0: the integers (the only step that may run Python code: __index__, __sub__). */
    for (i = 0; i < n; i++) {
        PyObject *key, *value, *headers, *ts;
        if (record_fields(PyTuple_GET_ITEM(recs, i), i, &key, &value, &headers, &ts) < 0) {
            goto error;
        }
        if (stamps != NULL) {
            ts = PyTuple_GET_ITEM(stamps, i);
        }
        if (timestamp_delta(ts, base_obj, base_ts, base_overflow, i, &ts_deltas[i]) < 0) {
            goto error;
        }
        if (deltas == NULL) {
            if (i > INT32_MAX) {
                PyErr_SetString(PyExc_ValueError, "too many records for one batch");
                goto error;
            }
            off_deltas[i] = (int32_t)i;
        }
        else if (offset_delta(PyTuple_GET_ITEM(deltas, i), i, &off_deltas[i]) < 0) {
            goto error;
        }
    }

    /* Pass 1: sizes and shapes (no Python code runs from here on). */
    for (i = 0; i < n; i++) {
        PyObject *key, *value, *headers, *ts, *hs;
        Py_ssize_t klen, vlen, nh, j;
        int64_t length;
        if (record_fields(PyTuple_GET_ITEM(recs, i), i, &key, &value, &headers, &ts) < 0) {
            goto error;
        }
        if ((klen = nullable_len(key, i, "key")) == -2 ||
            (vlen = nullable_len(value, i, "value")) == -2) {
            goto error;
        }
        if ((hs = headers_seq(headers, i)) == NULL) {
            goto error;
        }
        nh = PySequence_Fast_GET_SIZE(hs);
        if (nh > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "record %zd: too many headers", i);
            goto error;
        }
        length = 4 + 8 + 4 + (klen > 0 ? klen : 0) + 4 + (vlen > 0 ? vlen : 0) + 4;
        for (j = 0; j < nh; j++) {
            PyObject *name, *hval;
            Py_ssize_t nlen, hlen;
            if (header_pair(PySequence_Fast_GET_ITEM(hs, j), i, &name, &hval) < 0) {
                goto error;
            }
            if (PyUnicode_AsUTF8AndSize(name, &nlen) == NULL) {
                goto error;
            }
            if ((hlen = nullable_len(hval, i, "header value")) == -2) {
                goto error;
            }
            length += 4 + nlen + 4 + (hlen > 0 ? hlen : 0);
            if (length > INT32_MAX) {
                break;
            }
        }
        if (length > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "record %zd is too large for one record", i);
            goto error;
        }
        lengths[i] = (int32_t)length;
        if (total > PY_SSIZE_T_MAX - 4 - length) {
            PyErr_SetString(PyExc_OverflowError, "batch too large");
            goto error;
        }
        total += 4 + length;
    }

    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) {
        goto error;
    }
    w.p = (unsigned char *)PyBytes_AS_STRING(out);
    w.end = w.p + total;

    /* Pass 2: fill. */
    for (i = 0; i < n; i++) {
        PyObject *key, *value, *headers, *ts, *hs;
        Py_ssize_t nh, j;
        if (record_fields(PyTuple_GET_ITEM(recs, i), i, &key, &value, &headers, &ts) < 0 ||
            (hs = headers_seq(headers, i)) == NULL) {
            goto changed;
        }
        if (!w_room(&w, 16)) {
            goto changed;
        }
        wr_u32(w.p, (uint32_t)lengths[i]);
        wr_u32(w.p + 4, (uint32_t)off_deltas[i]);
        wr_u64(w.p + 8, (uint64_t)ts_deltas[i]);
        w.p += 16;
        if (w_bytes_field(&w, key) < 0 || w_bytes_field(&w, value) < 0) {
            goto changed;
        }
        nh = PySequence_Fast_GET_SIZE(hs);
        if (!w_room(&w, 4)) {
            goto changed;
        }
        wr_u32(w.p, (uint32_t)nh);
        w.p += 4;
        for (j = 0; j < nh; j++) {
            PyObject *name, *hval;
            const char *utf8;
            Py_ssize_t nlen;
            if (header_pair(PySequence_Fast_GET_ITEM(hs, j), i, &name, &hval) < 0 ||
                (utf8 = PyUnicode_AsUTF8AndSize(name, &nlen)) == NULL) {
                goto changed;
            }
            if (!w_room(&w, 4 + nlen)) {
                goto changed;
            }
            wr_u32(w.p, (uint32_t)nlen);
            memcpy(w.p + 4, utf8, (size_t)nlen);
            w.p += 4 + nlen;
            if (w_bytes_field(&w, hval) < 0) {
                goto changed;
            }
        }
    }
    if (w.p != w.end) {
        goto changed;
    }
    Py_DECREF(recs);
    Py_XDECREF(deltas);
    Py_XDECREF(stamps);
    PyMem_Free(ts_deltas);
    PyMem_Free(off_deltas);
    PyMem_Free(lengths);
    return out;

changed:
    if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_RuntimeError, "records changed while they were being encoded");
    }
error:
    Py_XDECREF(out);
    Py_XDECREF(recs);
    Py_XDECREF(deltas);
    Py_XDECREF(stamps);
    PyMem_Free(ts_deltas);
    PyMem_Free(off_deltas);
    PyMem_Free(lengths);
    return NULL;
}

/* ------------------------------------------------------------------------------------- */
/* decode_records                                                                          */
/* ------------------------------------------------------------------------------------- */

/* Whether instances of record_cls may be built directly as tuples of nfields items: a tuple
 * subclass with the tuple layout (no extra slots, no __dict__) and nfields NamedTuple
 * _fields, as eventlane.log.record.Record (8) and RecordMetadata (4) are. Anything else is called as record_cls(*fields). */
static int
direct_alloc_ok(PyObject *record_cls, Py_ssize_t nfields)
{
#if PY_VERSION_HEX >= 0x030E0000
    /* 3.14 caches tuple hashes in the object: let tuple.__new__ set that up. */
    (void)record_cls;
    (void)nfields;
    return 0;
#else
    PyTypeObject *tp;
    PyObject *fields;
    int ok;
    if (!PyType_Check(record_cls)) {
        return 0;
    }
    tp = (PyTypeObject *)record_cls;
    if (tp == &PyTuple_Type) {
        return 1;
    }
    if (!PyType_IsSubtype(tp, &PyTuple_Type) || tp->tp_basicsize != PyTuple_Type.tp_basicsize ||
        tp->tp_itemsize != PyTuple_Type.tp_itemsize || tp->tp_dictoffset != 0 ||
        tp->tp_alloc == NULL) {
        return 0;
    }
    fields = PyObject_GetAttrString(record_cls, "_fields");
    if (fields == NULL) {
        PyErr_Clear();
        return 0;
    }
    ok = PyTuple_Check(fields) && PyTuple_GET_SIZE(fields) == nfields;
    Py_DECREF(fields);
    return ok;
#endif
}

static PyObject *
bytes_or_none(const unsigned char *p, int32_t len)
{
    if (len < 0) {
        Py_RETURN_NONE;
    }
    return PyBytes_FromStringAndSize((const char *)p, len);
}

#define BAD(...)                                      \
    do {                                              \
        PyErr_Format(PyExc_ValueError, __VA_ARGS__); \
        goto error;                                   \
    } while (0)

/* One record's framing, checked: where its fields lie in the buffer. */
typedef struct {
    Py_ssize_t end;        /* first byte after the record */
    int32_t delta;         /* offset delta */
    int64_t ts_delta;      /* timestamp delta */
    Py_ssize_t key_at;     /* key bytes (klen == -1: null key) */
    int32_t klen;
    Py_ssize_t value_at;   /* value bytes (vlen == -1: null value) */
    int32_t vlen;
    Py_ssize_t headers_at; /* first header; hcount headers, each framed and in bounds */
    int32_t hcount;
} RecordSpan;

/* Parse the record at b[pos:end] into *r, checking every length against the record and the
 * record against end; header names are not decoded. 0 on success; -1 with ValueError set.
 * decode_records and index_keys share it, so both accept exactly the same framing. */
static int
parse_record(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end, RecordSpan *r)
{
    int32_t length, j;
    Py_ssize_t p;
    const char *bad = NULL;
    int badval = 0;

    if (end - pos < 20) {
        PyErr_SetString(PyExc_ValueError, "record header runs past the batch end");
        return -1;
    }
    length = rd_i32(b + pos);
    r->delta = rd_i32(b + pos + 4);
    r->ts_delta = rd_i64(b + pos + 8);
    r->klen = rd_i32(b + pos + 16);
    if (length < 20 || (int64_t)length > (int64_t)(end - pos) - 4) {
        PyErr_Format(PyExc_ValueError, "record length %d runs past the batch end", (int)length);
        return -1;
    }
    r->end = pos + 4 + (Py_ssize_t)length;
    p = pos + 20;
    r->key_at = p;
    if (r->klen >= 0 && r->klen <= r->end - p) {
        p += r->klen;
    }
    else if (r->klen != -1) {
        PyErr_Format(PyExc_ValueError, "bad key length %d", (int)r->klen);
        return -1;
    }
    if (r->end - p < 4) {
        goto mismatch;
    }
    r->vlen = rd_i32(b + p);
    p += 4;
    r->value_at = p;
    if (r->vlen >= 0 && r->vlen <= r->end - p) {
        p += r->vlen;
    }
    else if (r->vlen != -1) {
        PyErr_Format(PyExc_ValueError, "bad value length %d", (int)r->vlen);
        return -1;
    }
    if (r->end - p < 4) {
        goto mismatch;
    }
    r->hcount = rd_i32(b + p);
    p += 4;
    r->headers_at = p;
    /* Each header takes at least 8 bytes: a larger count cannot fit (checked before the
     * decoder allocates, so a corrupt count cannot make it allocate more than the record). */
    if (r->hcount < 0 || r->hcount > length || (Py_ssize_t)r->hcount > (r->end - p) / 8) {
        PyErr_Format(PyExc_ValueError, "bad header count %d", (int)r->hcount);
        return -1;
    }
    for (j = 0; j < r->hcount; j++) {
        int32_t nlen, hlen;
        if (r->end - p < 4) {
            bad = "header runs past the record end";
            break;
        }
        nlen = rd_i32(b + p);
        p += 4;
        if (nlen < 0 || nlen > r->end - p) {
            bad = "bad header name length %d";
            badval = nlen;
            break;
        }
        p += nlen;
        if (r->end - p < 4) {
            bad = "header runs past the record end";
            break;
        }
        hlen = rd_i32(b + p);
        p += 4;
        if (hlen != -1 && (hlen < 0 || hlen > r->end - p)) {
            bad = "bad header value length %d";
            badval = hlen;
            break;
        }
        if (hlen > 0) {
            p += hlen;
        }
    }
    if (bad != NULL) {
        PyErr_Format(PyExc_ValueError, bad, badval);
        return -1;
    }
    if (p != r->end) {
        goto mismatch;
    }
    return 0;

mismatch:
    PyErr_SetString(PyExc_ValueError, "record length does not match its fields");
    return -1;
}

static PyObject *
native_decode_records(PyObject *module, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start, end, pos;
    long long base_offset, base_timestamp, min_offset;
    PyObject *timestamp_type, *topic, *partition, *record_cls = NULL;
    PyObject *out = NULL, *key = NULL, *value = NULL, *headers = NULL, *rec = NULL;
    PyObject *default_cls = NULL;
    const unsigned char *b;
    int direct;
    int untrack;
    (void)module;

    if (!PyArg_ParseTuple(args, "y*nnLLOOOL|O:decode_records", &view, &start, &end,
                          &base_offset, &base_timestamp, &timestamp_type, &topic, &partition,
                          &min_offset, &record_cls)) {
        return NULL;
    }
    if (record_cls == NULL) {
        PyObject *mod = PyImport_ImportModule("eventlane.log.record");
        if (mod == NULL) {
            PyBuffer_Release(&view);
            return NULL;
        }
        default_cls = PyObject_GetAttrString(mod, "Record");
        Py_DECREF(mod);
        if (default_cls == NULL) {
            PyBuffer_Release(&view);
            return NULL;
        }
        record_cls = default_cls;
    }
    direct = direct_alloc_ok(record_cls, 8);
    /* Records hold only atoms (str, int, bytes, None) and tuples of atoms, so they can never
     * be part of a reference cycle: untrack them from the cyclic GC, which would otherwise
     * walk every decoded record again and again while a batch is alive (CPython untracks
     * such tuples itself, but only lazily, during a collection). */
    untrack = PyUnicode_CheckExact(topic) && PyLong_CheckExact(partition) &&
              PyLong_CheckExact(timestamp_type);
    out = PyList_New(0);
    if (out == NULL) {
        goto error;
    }
    if (start < 0 || end > view.len) {
        BAD("records span [%zd, %zd) lies outside the buffer of %zd bytes", start, end,
            view.len);
    }
    b = (const unsigned char *)view.buf;
    pos = start;
    while (pos < end) {
        RecordSpan r;
        int32_t j;
        int64_t offset;
        Py_ssize_t p;

        if (parse_record(b, pos, end, &r) < 0) {
            goto error;
        }
        if (r.klen == -1) {
            key = Py_None;
            Py_INCREF(key);
        }
        else if ((key = PyBytes_FromStringAndSize((const char *)b + r.key_at, r.klen)) == NULL) {
            goto error;
        }
        if (r.vlen == -1) {
            value = Py_None;
            Py_INCREF(value);
        }
        else if ((value = PyBytes_FromStringAndSize((const char *)b + r.value_at, r.vlen)) ==
                 NULL) {
            goto error;
        }
        headers = PyTuple_New(r.hcount);
        if (headers == NULL) {
            goto error;
        }
        p = r.headers_at;
        for (j = 0; j < r.hcount; j++) { /* framing checked by parse_record */
            int32_t nlen, hlen;
            PyObject *name, *hval, *pair;
            nlen = rd_i32(b + p);
            p += 4;
            name = PyUnicode_DecodeUTF8((const char *)b + p, nlen, NULL);
            if (name == NULL) {
                goto error;
            }
            p += nlen;
            hlen = rd_i32(b + p);
            p += 4;
            hval = bytes_or_none(b + p, hlen);
            if (hval == NULL) {
                Py_DECREF(name);
                goto error;
            }
            if (hlen > 0) {
                p += hlen;
            }
            pair = PyTuple_New(2);
            if (pair == NULL) {
                Py_DECREF(name);
                Py_DECREF(hval);
                goto error;
            }
            PyTuple_SET_ITEM(pair, 0, name);
            PyTuple_SET_ITEM(pair, 1, hval);
            PyObject_GC_UnTrack(pair);
            PyTuple_SET_ITEM(headers, j, pair);
        }

        if (add_overflows(base_offset, r.delta)) {
            /* Only a corrupt or absurd base offset gets here; the Python reference would
             * produce an offset beyond int64, which no log can hold. */
            BAD("record offset %lld%+d does not fit in 64 bits", base_offset, (int)r.delta);
        }
        offset = (int64_t)base_offset + r.delta;
        if (offset >= min_offset) {
            PyObject *off_obj, *ts_obj;
            if (add_overflows(base_timestamp, r.ts_delta)) {
                BAD("record timestamp %lld%+lld does not fit in 64 bits", base_timestamp,
                    (long long)r.ts_delta);
            }
            off_obj = PyLong_FromLongLong(offset);
            if (off_obj == NULL) {
                goto error;
            }
            ts_obj = PyLong_FromLongLong((long long)(base_timestamp + r.ts_delta));
            if (ts_obj == NULL) {
                Py_DECREF(off_obj);
                goto error;
            }
            if (direct) {
                PyTypeObject *tp = (PyTypeObject *)record_cls;
                rec = tp == &PyTuple_Type ? PyTuple_New(8) : tp->tp_alloc(tp, 8);
                if (rec == NULL) {
                    Py_DECREF(off_obj);
                    Py_DECREF(ts_obj);
                    goto error;
                }
                Py_INCREF(topic);
                Py_INCREF(partition);
                Py_INCREF(timestamp_type);
                PyTuple_SET_ITEM(rec, 0, topic);
                PyTuple_SET_ITEM(rec, 1, partition);
                PyTuple_SET_ITEM(rec, 2, off_obj);
                PyTuple_SET_ITEM(rec, 3, ts_obj);
                PyTuple_SET_ITEM(rec, 4, timestamp_type);
                PyTuple_SET_ITEM(rec, 5, key);
                PyTuple_SET_ITEM(rec, 6, value);
                PyTuple_SET_ITEM(rec, 7, headers);
                if (untrack) {
                    if (PyObject_GC_IsTracked(headers)) {
                        PyObject_GC_UnTrack(headers);
                    }
                    PyObject_GC_UnTrack(rec);
                }
            }
            else {
                PyObject *argv[8];
                argv[0] = topic;
                argv[1] = partition;
                argv[2] = off_obj;
                argv[3] = ts_obj;
                argv[4] = timestamp_type;
                argv[5] = key;
                argv[6] = value;
                argv[7] = headers;
                rec = PyObject_Vectorcall(record_cls, argv, 8, NULL);
                Py_DECREF(off_obj);
                Py_DECREF(ts_obj);
                Py_DECREF(key);
                Py_DECREF(value);
                Py_DECREF(headers);
                if (rec == NULL) {
                    key = value = headers = NULL;
                    goto error;
                }
            }
            key = value = headers = NULL;
            if (PyList_Append(out, rec) < 0) {
                goto error;
            }
            Py_CLEAR(rec);
        }
        else {
            Py_CLEAR(key);
            Py_CLEAR(value);
            Py_CLEAR(headers);
        }
        pos = r.end;
    }
    PyBuffer_Release(&view);
    Py_XDECREF(default_cls);
    return out;

error:
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(headers);
    Py_XDECREF(rec);
    Py_XDECREF(out);
    Py_XDECREF(default_cls);
    PyBuffer_Release(&view);
    return NULL;
}

#undef BAD

/* ------------------------------------------------------------------------------------- */
/* index_keys: the cleaner's key-only scan                                                */
/* ------------------------------------------------------------------------------------- */

#define BAD(...)                                      \
    do {                                              \
        PyErr_Format(PyExc_ValueError, __VA_ARGS__); \
        goto error;                                   \
    } while (0)

/* index_keys(buf, start, end, base_offset, last, key_id) -> int
 *
 * For every record of buf[start:end], in order: last[key] = offset, with the key as bytes
 * when it is at most 16 bytes long and key_id(key) otherwise; keyless records are skipped.
 * Returns the number of records. Values and headers are skipped without being copied; the
 * framing is checked exactly as decode_records checks it (header names are not UTF-8
 * decoded). */
static PyObject *
native_index_keys(PyObject *module, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start, end, pos, count = 0;
    long long base_offset;
    PyObject *last, *key_id, *key = NULL, *off_obj = NULL;
    const unsigned char *b;
    (void)module;

    if (!PyArg_ParseTuple(args, "y*nnLO!O:index_keys", &view, &start, &end, &base_offset,
                          &PyDict_Type, &last, &key_id)) {
        return NULL;
    }
    if (start < 0 || end > view.len) {
        BAD("records span [%zd, %zd) lies outside the buffer of %zd bytes", start, end,
            view.len);
    }
    b = (const unsigned char *)view.buf;
    pos = start;
    while (pos < end) {
        RecordSpan r;
        if (parse_record(b, pos, end, &r) < 0) {
            goto error;
        }
        if (add_overflows(base_offset, r.delta)) {
            BAD("record offset %lld%+d does not fit in 64 bits", base_offset, (int)r.delta);
        }
        if (r.klen >= 0) {
            key = PyBytes_FromStringAndSize((const char *)b + r.key_at, r.klen);
            if (key == NULL) {
                goto error;
            }
            if (r.klen > 16) {
                Py_SETREF(key, PyObject_CallOneArg(key_id, key));
                if (key == NULL) {
                    goto error;
                }
            }
            off_obj = PyLong_FromLongLong((long long)base_offset + r.delta);
            if (off_obj == NULL || PyDict_SetItem(last, key, off_obj) < 0) {
                goto error;
            }
            Py_CLEAR(key);
            Py_CLEAR(off_obj);
        }
        count++;
        pos = r.end;
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(count);

error:
    Py_XDECREF(key);
    Py_XDECREF(off_obj);
    PyBuffer_Release(&view);
    return NULL;
}

#undef BAD

/* ------------------------------------------------------------------------------------- */
/* keep_flags: the cleaner's pass 2 decision, without decoding                            */
/* ------------------------------------------------------------------------------------- */

#define BAD(...)                                      \
    do {                                              \
        PyErr_Format(PyExc_ValueError, __VA_ARGS__); \
        goto error;                                   \
    } while (0)

/* keep_flags(buf, start, end, base_offset, last, key_id, horizon) -> (bytes, int | None)
 *
 * One byte per record of buf[start:end], in order: 1 if compaction keeps it, else 0. A
 * record is kept iff it has a key, last.get(key) (key_id(key) for keys over 16 bytes) equals
 * its offset, and it is not a tombstone (null value) at an offset below horizon. The int is
 * the largest timestamp delta of a kept record (None if none is kept). Values and headers
 * are neither copied nor decoded; the framing is checked exactly as decode_records checks it. */
static PyObject *
native_keep_flags(PyObject *module, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start, end, pos, count = 0, cap;
    long long base_offset, horizon;
    PyObject *last, *key_id, *key = NULL, *flags = NULL, *out;
    const unsigned char *b;
    int64_t max_delta = 0;
    int any_kept = 0;
    (void)module;

    if (!PyArg_ParseTuple(args, "y*nnLO!OL:keep_flags", &view, &start, &end, &base_offset,
                          &PyDict_Type, &last, &key_id, &horizon)) {
        return NULL;
    }
    if (start < 0 || end > view.len) {
        BAD("records span [%zd, %zd) lies outside the buffer of %zd bytes", start, end,
            view.len);
    }
    /* every record takes at least 20 bytes: an upper bound on the flag count */
    cap = end > start ? (end - start) / 20 + 1 : 0;
    flags = PyBytes_FromStringAndSize(NULL, cap);
    if (flags == NULL) {
        goto error;
    }
    b = (const unsigned char *)view.buf;
    pos = start;
    while (pos < end) {
        RecordSpan r;
        char keep = 0;
        long long offset;
        if (parse_record(b, pos, end, &r) < 0) {
            goto error;
        }
        if (add_overflows(base_offset, r.delta)) {
            BAD("record offset %lld%+d does not fit in 64 bits", base_offset, (int)r.delta);
        }
        offset = (long long)base_offset + r.delta;
        if (r.klen >= 0 && !(r.vlen == -1 && offset < horizon)) {
            PyObject *seen;
            key = PyBytes_FromStringAndSize((const char *)b + r.key_at, r.klen);
            if (key == NULL) {
                goto error;
            }
            if (r.klen > 16) {
                Py_SETREF(key, PyObject_CallOneArg(key_id, key));
                if (key == NULL) {
                    goto error;
                }
            }
            seen = PyDict_GetItemWithError(last, key); /* borrowed */
            if (seen == NULL && PyErr_Occurred()) {
                goto error;
            }
            Py_CLEAR(key);
            if (seen != NULL && PyLong_CheckExact(seen)) {
                int overflow = 0;
                long long at = PyLong_AsLongLongAndOverflow(seen, &overflow);
                if (at == -1 && PyErr_Occurred()) {
                    goto error;
                }
                keep = !overflow && at == offset;
            }
            else if (seen != NULL) { /* not an exact int: compare as Python does */
                PyObject *off_obj = PyLong_FromLongLong(offset);
                int eq;
                if (off_obj == NULL) {
                    goto error;
                }
                eq = PyObject_RichCompareBool(seen, off_obj, Py_EQ);
                Py_DECREF(off_obj);
                if (eq < 0) {
                    goto error;
                }
                keep = (char)eq;
            }
        }
        if (keep) {
            if (!any_kept || r.ts_delta > max_delta) {
                max_delta = r.ts_delta;
            }
            any_kept = 1;
        }
        PyBytes_AS_STRING(flags)[count++] = keep;
        pos = r.end;
    }
    PyBuffer_Release(&view);
    if (_PyBytes_Resize(&flags, count) < 0) {
        return NULL;
    }
    if (any_kept) {
        out = Py_BuildValue("(NL)", flags, (long long)max_delta);
    }
    else {
        out = Py_BuildValue("(NO)", flags, Py_None);
    }
    return out;

error:
    Py_XDECREF(key);
    Py_XDECREF(flags);
    PyBuffer_Release(&view);
    return NULL;
}

#undef BAD

/* ------------------------------------------------------------------------------------- */
/* take_messages: KafkaLog's read of what a Kafka consumer handed back                     */
/* ------------------------------------------------------------------------------------- */

/* Call a method descriptor of the messages' type on message m (a new reference). */
static inline PyObject *
call_on(PyObject *descr, PyObject *m)
{
    return PyObject_Vectorcall(descr, &m, 1, NULL);
}

/* take_messages(msgs, topic, partition, nxt, stop, size, max_bytes, kinds, out, record_cls, /)
 *     -> (i, size, nxt)
 *
 * eventlane.log.kafka.records._py_take_messages in one pass over a list of confluent-kafka
 * messages: from the first, skip those below offset nxt (fetched for an earlier assignment),
 * append a record_cls(topic, partition, offset, timestamp, kinds[tstype], key, value,
 * tuple(headers) or ()) to out for each while its offset is below stop (stop < 0: none) and
 * size (the value bytes out holds) is below max_bytes (the first of an empty out always), and
 * stop at the first message with an error (an event). Returns the index of the first message
 * not used, the new size and the offset after the last record taken. The messages' methods
 * are called through their type's descriptors (no attribute lookup per message); records
 * without headers are untracked from the cyclic GC, as decode_records' are. */
static PyObject *
native_take_messages(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *msgs, *topic, *partition, *kinds, *out, *record_cls;
    PyObject *d_error = NULL, *d_offset = NULL, *d_timestamp = NULL, *d_key = NULL;
    PyObject *d_value = NULL, *d_headers = NULL, *empty = NULL;
    PyObject *off_obj = NULL, *value = NULL, *stamp = NULL, *key = NULL, *headers = NULL;
    PyTypeObject *msg_type;
    long long nxt, stop, size, max_bytes;
    Py_ssize_t i = 0, n, nkinds;
    int direct, untrack_ok;
    (void)module;

    if (nargs != 10) {
        PyErr_Format(PyExc_TypeError, "take_messages takes 10 arguments, got %zd", nargs);
        return NULL;
    }
    msgs = args[0];
    topic = args[1];
    partition = args[2];
    kinds = args[7];
    out = args[8];
    record_cls = args[9];
    if (!PyList_Check(msgs) || !PyList_Check(out) || !PyTuple_Check(kinds)) {
        PyErr_SetString(PyExc_TypeError, "take_messages wants msgs and out lists, kinds a tuple");
        return NULL;
    }
    nxt = PyLong_AsLongLong(args[3]);
    stop = PyLong_AsLongLong(args[4]);
    size = PyLong_AsLongLong(args[5]);
    max_bytes = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    n = PyList_GET_SIZE(msgs);
    if (n == 0) {
        return Py_BuildValue("(nLL)", (Py_ssize_t)0, size, nxt);
    }
    nkinds = PyTuple_GET_SIZE(kinds);
    direct = direct_alloc_ok(record_cls, 8);
    untrack_ok = PyUnicode_CheckExact(topic) && PyLong_CheckExact(partition);
    msg_type = Py_TYPE(PyList_GET_ITEM(msgs, 0));
    if ((d_error = PyObject_GetAttrString((PyObject *)msg_type, "error")) == NULL ||
        (d_offset = PyObject_GetAttrString((PyObject *)msg_type, "offset")) == NULL ||
        (d_timestamp = PyObject_GetAttrString((PyObject *)msg_type, "timestamp")) == NULL ||
        (d_key = PyObject_GetAttrString((PyObject *)msg_type, "key")) == NULL ||
        (d_value = PyObject_GetAttrString((PyObject *)msg_type, "value")) == NULL ||
        (d_headers = PyObject_GetAttrString((PyObject *)msg_type, "headers")) == NULL ||
        (empty = PyTuple_New(0)) == NULL) {
        goto error;
    }
    for (i = 0; i < n && i < PyList_GET_SIZE(msgs); i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i), *err, *h, *kind, *rec;
        long long off;
        Py_ssize_t vlen;
        int is_event;

        if (Py_TYPE(m) != msg_type) {
            PyErr_Format(PyExc_TypeError, "take_messages: message %zd is a %s, not a %s", i,
                         Py_TYPE(m)->tp_name, msg_type->tp_name);
            goto error;
        }
        Py_INCREF(m); /* held across the calls below */
        if ((err = call_on(d_error, m)) == NULL) {
            Py_DECREF(m);
            goto error;
        }
        is_event = err != Py_None;
        Py_DECREF(err);
        if (is_event) {
            Py_DECREF(m);
            break;
        }
        if ((off_obj = call_on(d_offset, m)) == NULL) {
            Py_DECREF(m);
            goto error;
        }
        if (off_obj == Py_None) { /* as m.offset() or 0 */
            Py_SETREF(off_obj, PyLong_FromLong(0));
            if (off_obj == NULL) {
                Py_DECREF(m);
                goto error;
            }
        }
        off = PyLong_AsLongLong(off_obj);
        if (off == -1 && PyErr_Occurred()) {
            Py_DECREF(m);
            goto error;
        }
        if (off < nxt) { /* fetched for an earlier assignment of the partition: dropped */
            Py_CLEAR(off_obj);
            Py_DECREF(m);
            continue;
        }
        if ((stop >= 0 && off >= stop) || (size >= max_bytes && PyList_GET_SIZE(out) > 0)) {
            Py_CLEAR(off_obj);
            Py_DECREF(m);
            break;
        }
        if ((value = call_on(d_value, m)) == NULL || (stamp = call_on(d_timestamp, m)) == NULL ||
            (key = call_on(d_key, m)) == NULL || (h = call_on(d_headers, m)) == NULL) {
            Py_DECREF(m);
            goto error;
        }
        Py_DECREF(m);
        if (h == Py_None || (PyList_Check(h) && PyList_GET_SIZE(h) == 0)) {
            Py_DECREF(h);
            headers = empty;
            Py_INCREF(headers);
        }
        else {
            headers = PySequence_Tuple(h);
            Py_DECREF(h);
            if (headers == NULL) {
                goto error;
            }
        }
        if (value == Py_None) {
            vlen = 0;
        }
        else if ((vlen = PyObject_Length(value)) < 0) {
            goto error;
        }
        if (!PyTuple_Check(stamp) || PyTuple_GET_SIZE(stamp) != 2 ||
            !PyLong_Check(PyTuple_GET_ITEM(stamp, 0))) {
            PyErr_SetString(PyExc_TypeError, "take_messages: a timestamp is not (type, ms)");
            goto error;
        }
        {
            Py_ssize_t t = PyLong_AsSsize_t(PyTuple_GET_ITEM(stamp, 0));
            if (t < 0 || t >= nkinds) {
                if (!PyErr_Occurred()) {
                    PyErr_Format(PyExc_ValueError, "take_messages: timestamp type %zd", t);
                }
                goto error;
            }
            kind = PyTuple_GET_ITEM(kinds, t);
        }
        if (direct) {
            PyTypeObject *tp = (PyTypeObject *)record_cls;
            rec = tp == &PyTuple_Type ? PyTuple_New(8) : tp->tp_alloc(tp, 8);
            if (rec == NULL) {
                goto error;
            }
            Py_INCREF(topic);
            Py_INCREF(partition);
            Py_INCREF(kind);
            PyTuple_SET_ITEM(rec, 0, topic);
            PyTuple_SET_ITEM(rec, 1, partition);
            PyTuple_SET_ITEM(rec, 2, off_obj);
            PyTuple_SET_ITEM(rec, 3, Py_NewRef(PyTuple_GET_ITEM(stamp, 1)));
            PyTuple_SET_ITEM(rec, 4, kind);
            PyTuple_SET_ITEM(rec, 5, key);
            PyTuple_SET_ITEM(rec, 6, value);
            PyTuple_SET_ITEM(rec, 7, headers);
            /* atoms only (str, int, bytes, None; kinds' items: ints or int enum members,
             * which no record can be reachable from): never part of a cycle */
            if (untrack_ok && headers == empty &&
                PyLong_CheckExact(PyTuple_GET_ITEM(rec, 3)) &&
                (key == Py_None || PyBytes_CheckExact(key)) &&
                (value == Py_None || PyBytes_CheckExact(value))) {
                PyObject_GC_UnTrack(rec);
            }
            off_obj = key = value = headers = NULL;
        }
        else {
            PyObject *argv[8];
            argv[0] = topic;
            argv[1] = partition;
            argv[2] = off_obj;
            argv[3] = PyTuple_GET_ITEM(stamp, 1);
            argv[4] = kind;
            argv[5] = key;
            argv[6] = value;
            argv[7] = headers;
            rec = PyObject_Vectorcall(record_cls, argv, 8, NULL);
            Py_CLEAR(off_obj);
            Py_CLEAR(key);
            Py_CLEAR(value);
            Py_CLEAR(headers);
            if (rec == NULL) {
                goto error;
            }
        }
        Py_CLEAR(stamp);
        if (PyList_Append(out, rec) < 0) {
            Py_DECREF(rec);
            goto error;
        }
        Py_DECREF(rec);
        size += vlen;
        nxt = off + 1;
    }
    Py_DECREF(d_error);
    Py_DECREF(d_offset);
    Py_DECREF(d_timestamp);
    Py_DECREF(d_key);
    Py_DECREF(d_value);
    Py_DECREF(d_headers);
    Py_DECREF(empty);
    return Py_BuildValue("(nLL)", i, size, nxt);

error:
    Py_XDECREF(off_obj);
    Py_XDECREF(value);
    Py_XDECREF(stamp);
    Py_XDECREF(key);
    Py_XDECREF(headers);
    Py_XDECREF(d_error);
    Py_XDECREF(d_offset);
    Py_XDECREF(d_timestamp);
    Py_XDECREF(d_key);
    Py_XDECREF(d_value);
    Py_XDECREF(d_headers);
    Py_XDECREF(empty);
    return NULL;
}

/* ------------------------------------------------------------------------------------- */
/* Module                                                                                  */
/* ------------------------------------------------------------------------------------- */

static PyMethodDef native_methods[] = {
    {"murmur2", (PyCFunction)native_murmur2, METH_O,
     "murmur2(data, /)\n--\n\n"
     "Kafka's Utils.murmur2(byte[]): 32-bit MurmurHash2, seed 0x9747b28c, as a signed\n"
     "32-bit int (Java's int)."},
    {"partition_for_key", (PyCFunction)(void (*)(void))native_partition_for_key,
     METH_FASTCALL,
     "partition_for_key(key, num_partitions, /)\n--\n\n"
     "(murmur2(key) & 0x7fffffff) % num_partitions, as Kafka's BuiltInPartitioner."},
    {"partitions_for_keys", (PyCFunction)(void (*)(void))native_partitions_for_keys,
     METH_FASTCALL,
     "partitions_for_keys(keys, num_partitions, /)\n--\n\n"
     "partition_for_key for every key of a sequence, as a list."},
    {"encode_records", (PyCFunction)(void (*)(void))native_encode_records, METH_FASTCALL,
     "encode_records(records, base_timestamp, offset_deltas=None, timestamps=None, /)\n"
     "--\n\n"
     "Encode (key, value, headers, timestamp) records into a batch body (bytes);\n"
     "timestamps, when given, replaces each record's own timestamp field."},
    {"decode_records", (PyCFunction)native_decode_records, METH_VARARGS,
     "decode_records(buf, start, end, base_offset, base_timestamp, timestamp_type, topic,\n"
     "               partition, min_offset, record_cls=Record, /)\n--\n\n"
     "Decode the records in buf[start:end], skipping offsets below min_offset."},
    {"index_keys", (PyCFunction)native_index_keys, METH_VARARGS,
     "index_keys(buf, start, end, base_offset, last, key_id, /)\n--\n\n"
     "last[key] = offset for every keyed record of buf[start:end] (key_id(key) for keys\n"
     "longer than 16 bytes); returns the number of records."},
    {"keep_flags", (PyCFunction)native_keep_flags, METH_VARARGS,
     "keep_flags(buf, start, end, base_offset, last, key_id, horizon, /)\n--\n\n"
     "One byte per record of buf[start:end]: 1 if compaction keeps it (keyed, last offset\n"
     "of its key, not a tombstone below horizon); and the largest kept timestamp delta."},
    {"take_messages", (PyCFunction)(void (*)(void))native_take_messages, METH_FASTCALL,
     "take_messages(msgs, topic, partition, nxt, stop, size, max_bytes, kinds, out,\n"
     "              record_cls, /)\n--\n\n"
     "KafkaLog's read of consumed messages into records appended to out: offsets below\n"
     "nxt skipped, below stop (< 0: none), while size < max_bytes, up to the first event;\n"
     "returns (index of the first message not used, size, next offset)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    "eventlane.log._native",
    "C speedups of the log: Kafka's murmur2 partitioner and the record batch codec.\n\n"
    "Optional: eventlane.log.partitioner and eventlane.log.embedded.batch fall back to their\n"
    "pure-Python references when this module is missing.",
    0,
    native_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    return PyModuleDef_Init(&native_module);
}
