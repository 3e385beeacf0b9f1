/* Kafka record framing for the listener's Fetch path (optional C speedup).
 *
 * records_payload(records, base_offset, base_timestamp) -> (bytes, max_timestamp)
 *
 * `records` is a sequence of framework.log.Record tuples (topic, partition, offset,
 * timestamp, timestamp_type, key, value, headers). The result is the records section of a
 * Kafka record batch v2 (what follows the 61-byte header), each record as
 *
 *   length varint | attributes int8 (0) | timestampDelta varlong | offsetDelta varint
 *   | keyLength varint (-1: null) | key | valueLength varint (-1: null) | value
 *   | headerCount varint | (keyLength varint | key utf-8 | valueLength varint | value)*
 *
 * with zig-zag varints; framework/kafka/records.py builds the header and the CRC around it
 * and holds the pure-Python version of the same loop (used when this is not built).
 *
 * records_parse(raw, start, stop, count, base_timestamp) -> list
 *
 * The inverse for the Produce path: the `count` records in raw[start:stop] as the log
 * appends them, (key, value, headers, timestamp) with a negative timestamp as None;
 * ValueError when they are malformed or do not fill [start, stop) exactly.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
} Buf;

static int
buf_reserve(Buf *b, Py_ssize_t extra)
{
    if (b->len + extra <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra)
        cap *= 2;
    char *data = PyMem_Realloc(b->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static int
put_varint(Buf *b, int64_t n)
{
    uint64_t v = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    if (buf_reserve(b, 10) < 0)
        return -1;
    while (v > 0x7F) {
        b->data[b->len++] = (char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    b->data[b->len++] = (char)v;
    return 0;
}

static int
put_raw(Buf *b, const char *data, Py_ssize_t n)
{
    if (buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, data, (size_t)n);
    b->len += n;
    return 0;
}

/* A length-prefixed bytes field; None is length -1 and no bytes. */
static int
put_field(Buf *b, PyObject *value, const char *what, Py_ssize_t index)
{
    if (value == Py_None)
        return put_varint(b, -1);
    if (!PyBytes_Check(value)) {
        PyErr_Format(PyExc_TypeError, "record %zd: %s must be bytes or None, not %.100s", index,
                     what, Py_TYPE(value)->tp_name);
        return -1;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(value);
    if (put_varint(b, n) < 0)
        return -1;
    return put_raw(b, PyBytes_AS_STRING(value), n);
}

static int
put_headers(Buf *b, PyObject *headers, Py_ssize_t index)
{
    PyObject *fast = PySequence_Fast(headers, "headers must be a sequence");
    if (fast == NULL)
        return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    int rc = put_varint(b, count);
    for (Py_ssize_t h = 0; rc == 0 && h < count; h++) {
        PyObject *pair = items[h];
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_Format(PyExc_TypeError, "record %zd: header %zd is not a (name, value) pair",
                         index, h);
            rc = -1;
            break;
        }
        Py_ssize_t n;
        const char *name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &n);
        if (name == NULL || put_varint(b, n) < 0 || put_raw(b, name, n) < 0 ||
            put_field(b, PyTuple_GET_ITEM(pair, 1), "a header value", index) < 0)
            rc = -1;
    }
    Py_DECREF(fast);
    return rc;
}

static PyObject *
records_payload(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *records;
    long long base_offset, base_ts;
    if (!PyArg_ParseTuple(args, "OLL", &records, &base_offset, &base_ts))
        return NULL;
    PyObject *fast = PySequence_Fast(records, "records must be a sequence");
    if (fast == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    Buf out = {NULL, 0, 0}, rec = {NULL, 0, 0};
    long long max_ts = base_ts;
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *r = items[i];
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 8) {
            PyErr_Format(PyExc_TypeError, "record %zd is not a framework.log.Record", i);
            goto done;
        }
        long long offset = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 2));
        long long ts = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 3));
        if (PyErr_Occurred())
            goto done;
        if (ts > max_ts)
            max_ts = ts;
        rec.len = 0;
        if (buf_reserve(&rec, 1) < 0)
            goto done;
        rec.data[rec.len++] = 0; /* record attributes */
        if (put_varint(&rec, ts - base_ts) < 0 || put_varint(&rec, offset - base_offset) < 0 ||
            put_field(&rec, PyTuple_GET_ITEM(r, 5), "the key", i) < 0 ||
            put_field(&rec, PyTuple_GET_ITEM(r, 6), "the value", i) < 0 ||
            put_headers(&rec, PyTuple_GET_ITEM(r, 7), i) < 0)
            goto done;
        if (put_varint(&out, rec.len) < 0 || put_raw(&out, rec.data, rec.len) < 0)
            goto done;
    }
    result = Py_BuildValue("(y#L)", out.data ? out.data : "", out.len, max_ts);
done:
    PyMem_Free(out.data);
    PyMem_Free(rec.data);
    Py_DECREF(fast);
    return result;
}

/* Reading: a cursor over [p, end) that fails (returns -1 with ValueError) past the end. */
typedef struct {
    const unsigned char *p;
    const unsigned char *end;
    Py_ssize_t record;
} Cursor;

static int
get_varint(Cursor *c, int64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (c->p >= c->end) {
            PyErr_Format(PyExc_ValueError, "record %zd runs past its batch", c->record);
            return -1;
        }
        unsigned char b = *c->p++;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *out = (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError, "record %zd has a varint longer than 10 bytes", c->record);
    return -1;
}

/* A length-prefixed field as bytes, or None for length -1. New reference. */
static PyObject *
get_field(Cursor *c)
{
    int64_t n;
    if (get_varint(c, &n) < 0)
        return NULL;
    if (n == -1)
        Py_RETURN_NONE;
    if (n < 0 || n > c->end - c->p) {
        PyErr_Format(PyExc_ValueError, "record %zd has a field of %lld bytes past its batch",
                     c->record, (long long)n);
        return NULL;
    }
    PyObject *field = PyBytes_FromStringAndSize((const char *)c->p, (Py_ssize_t)n);
    c->p += n;
    return field;
}

static PyObject *
parse_one(Cursor *c, long long base_ts)
{
    int64_t length, ts_delta, offset_delta, headers;
    if (get_varint(c, &length) < 0)
        return NULL;
    if (length < 1 || length > c->end - c->p) {
        PyErr_Format(PyExc_ValueError, "record %zd has length %lld past its batch", c->record,
                     (long long)length);
        return NULL;
    }
    const unsigned char *stop = c->p + length;
    const unsigned char *batch_end = c->end;
    c->end = stop; /* fields may not run into the next record */
    c->p++;        /* record attributes: unused in v2 */
    PyObject *key = NULL, *value = NULL, *list = NULL, *result = NULL;
    if (get_varint(c, &ts_delta) < 0 || get_varint(c, &offset_delta) < 0)
        goto done;
    if ((key = get_field(c)) == NULL || (value = get_field(c)) == NULL)
        goto done;
    if (get_varint(c, &headers) < 0)
        goto done;
    if (headers < 0 || headers > length) {
        PyErr_Format(PyExc_ValueError, "record %zd claims %lld headers", c->record,
                     (long long)headers);
        goto done;
    }
    if ((list = PyTuple_New((Py_ssize_t)headers)) == NULL)
        goto done;
    for (int64_t h = 0; h < headers; h++) {
        PyObject *name_raw = get_field(c), *hvalue = NULL, *name = NULL, *pair = NULL;
        if (name_raw == NULL)
            goto done;
        if (name_raw == Py_None) {
            Py_DECREF(name_raw);
            PyErr_Format(PyExc_ValueError, "record %zd has a header without a name", c->record);
            goto done;
        }
        name = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(name_raw), PyBytes_GET_SIZE(name_raw),
                                    "strict");
        Py_DECREF(name_raw);
        if (name == NULL || (hvalue = get_field(c)) == NULL) {
            Py_XDECREF(name);
            goto done;
        }
        pair = PyTuple_Pack(2, name, hvalue);
        Py_DECREF(name);
        Py_DECREF(hvalue);
        if (pair == NULL)
            goto done;
        PyTuple_SET_ITEM(list, (Py_ssize_t)h, pair);
    }
    if (c->p != stop) {
        PyErr_Format(PyExc_ValueError, "record %zd: its length disagrees with its fields",
                     c->record);
        goto done;
    }
    long long ts = base_ts + ts_delta;
    if (ts >= 0)
        result = Py_BuildValue("(OOOL)", key, value, list, ts);
    else
        result = Py_BuildValue("(OOOO)", key, value, list, Py_None);
done:
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(list);
    c->end = batch_end;
    return result;
}

static PyObject *
records_parse(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer raw;
    Py_ssize_t start, stop, count;
    long long base_ts;
    if (!PyArg_ParseTuple(args, "y*nnnL", &raw, &start, &stop, &count, &base_ts))
        return NULL;
    PyObject *out = NULL;
    if (start < 0 || stop > raw.len || start > stop || count < 0 || count > stop - start) {
        PyErr_SetString(PyExc_ValueError, "records range outside the buffer");
        goto done;
    }
    Cursor c = {(const unsigned char *)raw.buf + start, (const unsigned char *)raw.buf + stop, 0};
    if ((out = PyList_New(count)) == NULL)
        goto done;
    for (c.record = 0; c.record < count; c.record++) {
        PyObject *rec = parse_one(&c, base_ts);
        if (rec == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, c.record, rec);
    }
    if (c.p != c.end) {
        PyErr_SetString(PyExc_ValueError, "records disagree with the batch length");
        Py_CLEAR(out);
    }
done:
    PyBuffer_Release(&raw);
    return out;
}

static PyMethodDef wire_methods[] = {
    {"records_payload", records_payload, METH_VARARGS,
     "records_payload(records, base_offset, base_timestamp) -> (bytes, max_timestamp): the "
     "records section of a Kafka record batch v2."},
    {"records_parse", records_parse, METH_VARARGS,
     "records_parse(raw, start, stop, count, base_timestamp) -> list of (key, value, headers, "
     "timestamp): the records section of a Kafka record batch v2, as the log appends them."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef wire_module = {
    PyModuleDef_HEAD_INIT, "framework.kafka._wire",
    "Kafka record framing for the listener (optional C speedup).", -1, wire_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__wire(void)
{
    return PyModule_Create(&wire_module);
}
