/* Kafka record framing for the listener's Fetch path (optional C speedup).
 *
 * records_payload(records, base_offset, base_timestamp) -> (bytes, max_timestamp)
 *
 * `records` is a sequence of eventlane.log.Record tuples (topic, partition, offset,
 * timestamp, timestamp_type, key, value, headers). The result is the records section of a
 * Kafka record batch v2 (what follows the 61-byte header), each record as
 *
 *   length varint | attributes int8 (0) | timestampDelta varlong | offsetDelta varint
 *   | keyLength varint (-1: null) | key | valueLength varint (-1: null) | value
 *   | headerCount varint | (keyLength varint | key utf-8 | valueLength varint | value)*
 *
 * with zig-zag varints; eventlane/kafka/records.py builds the header and the CRC around it
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
            PyErr_Format(PyExc_TypeError, "record %zd is not a eventlane.log.Record", i);
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

/* The records range [start, stop) of raw, holding count records: a cursor at its start, or -1
 * if the range is outside the buffer. */
static int
scan_range(Py_buffer *raw, Py_ssize_t start, Py_ssize_t stop, Py_ssize_t count, Cursor *c)
{
    if (start < 0 || stop > raw->len || start > stop || count < 0 || count > stop - start)
        return -1;
    c->p = (const unsigned char *)raw->buf + start;
    c->end = (const unsigned char *)raw->buf + stop;
    c->record = 0;
    return 0;
}

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
    Cursor c;
    if (scan_range(&raw, start, stop, count, &c) < 0) {
        PyErr_SetString(PyExc_ValueError, "records range outside the buffer");
        goto done;
    }
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

/* ---- Fetch from stored batches: the embedded format to Kafka's, no Python object per record.
 *
 * The embedded batch (eventlane/log/embedded/batch.py, docs/file-format.md), big-endian:
 * header 43 bytes (base_offset int64 @0, attributes int16 @17 (bit 3: LogAppendTime),
 * base_timestamp int64 @23, record_count int32 @39), then records of
 * length int32 | offset_delta int32 | timestamp_delta int64 | key_length int32 | key
 * | value_length int32 | value | header_count int32 | (name_length int32 | name
 * | value_length int32 | value)*  (-1: null). */

#define STORED_HEADER 43
#define KAFKA_HEADER 61

static inline int64_t
be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return (int64_t)v;
}

static inline int32_t
be32(const unsigned char *p)
{
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
                     (uint32_t)p[3]);
}

static inline void
put_be64(char *p, int64_t n)
{
    uint64_t v = (uint64_t)n;
    for (int i = 7; i >= 0; i--) {
        p[i] = (char)(v & 0xFF);
        v >>= 8;
    }
}

static inline void
put_be32(char *p, int32_t n)
{
    uint32_t v = (uint32_t)n;
    p[0] = (char)(v >> 24);
    p[1] = (char)(v >> 16);
    p[2] = (char)(v >> 8);
    p[3] = (char)v;
}

static inline int
varint_size(int64_t n)
{
    uint64_t v = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    int size = 1;
    while (v > 0x7F) {
        v >>= 7;
        size++;
    }
    return size;
}

/* Writes a zig-zag varint at b->data + b->len; the caller reserved the room. */
static inline void
put_varint_unchecked(Buf *b, int64_t n)
{
    uint64_t v = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    while (v > 0x7F) {
        b->data[b->len++] = (char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    b->data[b->len++] = (char)v;
}

/* The Kafka batch being written: its header is at `at` and filled in when it is closed. */
typedef struct {
    Py_ssize_t at; /* -1: none open */
    int64_t base_offset, base_ts, max_ts, last_offset;
    int32_t count;
    int ts_type;
} Open;

static void
close_batch(Buf *out, Open *o)
{
    char *h = out->data + o->at;
    put_be64(h, o->base_offset);
    put_be32(h + 8, (int32_t)(out->len - o->at - 12));
    put_be32(h + 12, 0);    /* partition leader epoch: one broker, never re-elected */
    h[16] = 2;              /* magic */
    put_be32(h + 17, 0);    /* the CRC: the caller computes it (records.py) */
    h[21] = 0;              /* attributes int16: timestamp type in bit 3 */
    h[22] = o->ts_type ? 0x08 : 0;
    put_be32(h + 23, (int32_t)(o->last_offset - o->base_offset));
    put_be64(h + 27, o->base_ts);
    put_be64(h + 35, o->max_ts);
    put_be64(h + 43, -1); /* producer id */
    h[51] = (char)0xFF;   /* producer epoch -1 */
    h[52] = (char)0xFF;
    put_be32(h + 53, -1); /* base sequence */
    put_be32(h + 57, o->count);
    o->at = -1;
}

/* The bounds of one length-prefixed (int32, -1: null) field at *p, within [*p, end). */
static int
stored_field(const unsigned char **p, const unsigned char *end, int32_t *len, int nullable)
{
    if (end - *p < 4)
        return -1;
    *len = be32(*p);
    *p += 4;
    if (*len == -1 && nullable)
        return 0;
    if (*len < 0 || *len > end - *p)
        return -1;
    *p += *len;
    return 0;
}

/* buf_reserve for a Buf whose bytes are those of the bytearray `ba` (the result is built in
 * place: no copy at the end). */
static int
ba_reserve(Buf *b, PyObject *ba, Py_ssize_t extra)
{
    if (b->len + extra <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap * 2 > b->len + extra ? b->cap * 2 : b->len + extra;
    if (PyByteArray_Resize(ba, cap) < 0)
        return -1;
    b->data = PyByteArray_AS_STRING(ba);
    b->cap = cap;
    return 0;
}

static PyObject *
kafka_batches(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *batches;
    long long start, stop;
    if (!PyArg_ParseTuple(args, "OLL", &batches, &start, &stop))
        return NULL;
    PyObject *fast = PySequence_Fast(batches, "batches must be a sequence");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n_batches = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    Buf out = {NULL, 0, 0};
    Open o = {-1, 0, 0, 0, 0, 0, 0};
    PyObject *heads = PyList_New(0), *result = NULL, *blob = NULL;
    long long records = 0;
    if (heads == NULL)
        goto done;
    /* Kafka's framing is mostly smaller than the stored one: start with the stored size */
    Py_ssize_t estimate = 64;
    for (Py_ssize_t i = 0; i < n_batches; i++) {
        PyObject *item = items[i];
        if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 3) {
            Py_ssize_t a = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 1));
            Py_ssize_t z = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 2));
            if (PyErr_Occurred())
                goto done;
            if (z > a)
                estimate += z - a;
        }
    }
    if ((blob = PyByteArray_FromStringAndSize(NULL, estimate)) == NULL)
        goto done;
    out.data = PyByteArray_AS_STRING(blob);
    out.cap = estimate;
    for (Py_ssize_t i = 0; i < n_batches; i++) {
        PyObject *item = items[i];
        Py_buffer view;
        Py_ssize_t bstart, bend;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_Format(PyExc_TypeError, "batch %zd is not a (buf, start, end) StoredBatch", i);
            goto done;
        }
        bstart = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 1));
        bend = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 2));
        if (PyErr_Occurred())
            goto done;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(item, 0), &view, PyBUF_SIMPLE) < 0)
            goto done;
        if (bstart < 0 || bend > view.len || bend - bstart < STORED_HEADER) {
            PyBuffer_Release(&view);
            PyErr_Format(PyExc_ValueError, "batch %zd: [%zd, %zd) is not a batch in its buffer", i,
                         bstart, bend);
            goto done;
        }
        const unsigned char *b = (const unsigned char *)view.buf + bstart;
        const unsigned char *end = (const unsigned char *)view.buf + bend;
        int64_t base_offset = be64(b), base_ts = be64(b + 23);
        int ts_type = (b[18] & 0x08) ? 1 : 0;
        const unsigned char *p = b + STORED_HEADER;
        const char *bad = NULL;
        while (p < end) {
            if (end - p < 24) {
                bad = "record header runs past the batch end";
                break;
            }
            int32_t length = be32(p);
            if (length < 24 || length > end - p - 4) {
                bad = "record length runs past the batch end or is too small";
                break;
            }
            const unsigned char *rec_end = p + 4 + length;
            int64_t offset = base_offset + be32(p + 4);
            int64_t ts = base_ts + be64(p + 8);
            const unsigned char *q = p + 16, *key, *value;
            int32_t klen, vlen, hcount;
            key = q + 4;
            if (stored_field(&q, rec_end, &klen, 1) < 0) {
                bad = "bad key length";
                break;
            }
            value = q + 4;
            if (stored_field(&q, rec_end, &vlen, 1) < 0) {
                bad = "bad value length";
                break;
            }
            if (rec_end - q < 4 || (hcount = be32(q)) < 0 || hcount > length) {
                bad = "bad header count";
                break;
            }
            q += 4;
            const unsigned char *headers = q;
            /* Kafka's record size: every field but the length varint in front */
            int64_t size = 1 + varint_size(klen) + (klen > 0 ? klen : 0) + varint_size(vlen) +
                           (vlen > 0 ? vlen : 0) + varint_size(hcount);
            for (int32_t h = 0; h < hcount; h++) {
                int32_t nlen, hlen;
                if (stored_field(&q, rec_end, &nlen, 0) < 0 ||
                    stored_field(&q, rec_end, &hlen, 1) < 0) {
                    bad = "bad header";
                    break;
                }
                size += varint_size(nlen) + nlen + varint_size(hlen) + (hlen > 0 ? hlen : 0);
            }
            if (bad == NULL && q != rec_end)
                bad = "record length does not match its fields";
            if (bad != NULL)
                break;
            p = rec_end;
            if (offset < start || offset >= stop)
                continue;
            if (o.at >= 0 && (ts_type != o.ts_type || (ts_type == 1 && ts != o.base_ts)))
                close_batch(&out, &o); /* LogAppendTime: one timestamp a batch */
            if (o.at < 0) {
                if (ba_reserve(&out, blob, KAFKA_HEADER) < 0)
                    break;
                o.at = out.len;
                out.len += KAFKA_HEADER;
                o.base_offset = offset;
                o.base_ts = o.max_ts = ts;
                o.count = 0;
                o.ts_type = ts_type;
                PyObject *at = PyLong_FromSsize_t(o.at);
                int failed = at == NULL || PyList_Append(heads, at) < 0;
                Py_XDECREF(at);
                if (failed)
                    break;
            }
            size += varint_size(ts - o.base_ts) + varint_size(offset - o.base_offset);
            if (ba_reserve(&out, blob, size + 10) < 0)
                break;
            put_varint_unchecked(&out, size);
            out.data[out.len++] = 0; /* record attributes */
            put_varint_unchecked(&out, ts - o.base_ts);
            put_varint_unchecked(&out, offset - o.base_offset);
            put_varint_unchecked(&out, klen);
            if (klen > 0) {
                memcpy(out.data + out.len, key, (size_t)klen);
                out.len += klen;
            }
            put_varint_unchecked(&out, vlen);
            if (vlen > 0) {
                memcpy(out.data + out.len, value, (size_t)vlen);
                out.len += vlen;
            }
            put_varint_unchecked(&out, hcount);
            for (const unsigned char *r = headers; r < rec_end;) {
                int32_t len = be32(r); /* name, then value (-1: null) */
                r += 4;
                put_varint_unchecked(&out, len);
                if (len > 0) {
                    memcpy(out.data + out.len, r, (size_t)len);
                    out.len += len;
                    r += len;
                }
            }
            if (ts > o.max_ts)
                o.max_ts = ts;
            o.last_offset = offset;
            o.count++;
            records++;
        }
        PyBuffer_Release(&view);
        if (PyErr_Occurred())
            goto done;
        if (bad != NULL) {
            PyErr_Format(PyExc_ValueError, "malformed record in the batch at offset %lld: %s",
                         (long long)base_offset, bad);
            goto done;
        }
    }
    if (o.at >= 0)
        close_batch(&out, &o);
    if (PyByteArray_Resize(blob, out.len) == 0)
        result = Py_BuildValue("(OOL)", blob, heads, records);
done:
    Py_XDECREF(blob);
    Py_XDECREF(heads);
    Py_DECREF(fast);
    return result;
}

/* ---- Produce into stored batches: Kafka's records to the embedded format, no Python object
 * per record.
 *
 * records_scan(raw, start, stop, count, base_timestamp) -> bool
 *     Whether the `count` records in raw[start:stop] are ones records_stored can transcode:
 *     framed exactly as records_parse accepts them, header names ASCII (records_parse's
 *     UTF-8 decoding then cannot fail and a name's length in characters is its length in
 *     bytes), no timestamp past int64. False for anything else: the caller parses them
 *     with records_parse, which accepts them or names what is wrong.
 * records_cut(raw, start, stop, count, base_timestamp, overhead, max_batch, max_record,
 *             keyed) -> list of (start, stop, count) | None
 *     The records cut into pieces as Partition._split cuts them (a record's estimated size
 *     is overhead + key + value + 8 + 4 x name + value a header; greedy pieces of at most
 *     max_batch estimated bytes, at least one record each), or None where Partition._split
 *     would refuse one (estimated over max_record, a null key when `keyed`) or the records
 *     are not records_scan's.
 * records_stored(raw, start, stop, count, base_timestamp, base_offset, log_append_time, now)
 *     -> (bytearray, timestamps)
 *     One stored batch (docs/file-format.md) of the records, its CRC left 0 for the caller,
 *     the bytes eventlane.log.embedded.batch.encode_batch gives for records_parse's tuples
 *     with the log's timestamps: `now` where the topic is LogAppendTime or the record's
 *     timestamp is negative, else the record's own; `timestamps` is that list (one int
 *     object shared by equal neighbours). */

typedef struct {
    int64_t ts;                 /* base_timestamp + delta (checked) */
    const unsigned char *key;   /* NULL: null key */
    int64_t klen;
    const unsigned char *value; /* NULL: null value */
    int64_t vlen;
    int64_t nheaders;
    const unsigned char *headers; /* the first header's name length varint */
    int64_t header_bytes;         /* the headers in the stored format */
    int64_t header_estimate;      /* Partition._headers_size */
} Scanned;

/* A length-prefixed field: *at (NULL for length -1) and *n. */
static int
scan_field(Cursor *c, const unsigned char **at, int64_t *n)
{
    if (get_varint(c, n) < 0)
        return -1;
    if (*n == -1) {
        *at = NULL;
        return 0;
    }
    if (*n < 0 || *n > c->end - c->p) {
        PyErr_Format(PyExc_ValueError, "record %zd has a field past its batch", c->record);
        return -1;
    }
    *at = c->p;
    c->p += *n;
    return 0;
}

/* One record as parse_one reads it: 0, -1 (ValueError: malformed) or 1 (not for the stored
 * path: a non-ASCII header name or a timestamp past int64). */
static int
scan_one(Cursor *c, long long base_ts, Scanned *s)
{
    int64_t length, ts_delta, offset_delta;
    if (get_varint(c, &length) < 0)
        return -1;
    if (length < 1 || length > c->end - c->p) {
        PyErr_Format(PyExc_ValueError, "record %zd has length %lld past its batch", c->record,
                     (long long)length);
        return -1;
    }
    const unsigned char *stop = c->p + length;
    const unsigned char *batch_end = c->end;
    int rc = -1;
    c->end = stop;
    c->p++;
    if (get_varint(c, &ts_delta) < 0 || get_varint(c, &offset_delta) < 0)
        goto done;
    if (scan_field(c, &s->key, &s->klen) < 0 || scan_field(c, &s->value, &s->vlen) < 0)
        goto done;
    if (get_varint(c, &s->nheaders) < 0)
        goto done;
    if (s->nheaders < 0 || s->nheaders > length) {
        PyErr_Format(PyExc_ValueError, "record %zd claims %lld headers", c->record,
                     (long long)s->nheaders);
        goto done;
    }
    s->headers = c->p;
    s->header_bytes = s->header_estimate = 0;
    int simple = 1;
    for (int64_t h = 0; h < s->nheaders; h++) {
        const unsigned char *name, *hvalue;
        int64_t nlen, hvlen;
        if (scan_field(c, &name, &nlen) < 0)
            goto done;
        if (name == NULL) {
            PyErr_Format(PyExc_ValueError, "record %zd has a header without a name", c->record);
            goto done;
        }
        for (int64_t i = 0; i < nlen; i++)
            if (name[i] & 0x80)
                simple = 0;
        if (scan_field(c, &hvalue, &hvlen) < 0)
            goto done;
        int64_t vbytes = hvalue == NULL ? 0 : hvlen;
        s->header_bytes += 8 + nlen + vbytes;
        s->header_estimate += 8 + nlen * 4 + vbytes;
    }
    if (c->p != stop) {
        PyErr_Format(PyExc_ValueError, "record %zd: its length disagrees with its fields",
                     c->record);
        goto done;
    }
    long long ts;
    if (__builtin_add_overflow(base_ts, (long long)ts_delta, &ts))
        simple = 0;
    s->ts = ts;
    rc = simple ? 0 : 1;
done:
    c->end = batch_end;
    return rc;
}

static PyObject *
records_scan(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer raw;
    Py_ssize_t start, stop, count;
    long long base_ts;
    if (!PyArg_ParseTuple(args, "y*nnnL", &raw, &start, &stop, &count, &base_ts))
        return NULL;
    Cursor c;
    int ok = scan_range(&raw, start, stop, count, &c) == 0;
    Scanned s;
    for (; ok && c.record < count; c.record++) {
        int rc = scan_one(&c, base_ts, &s);
        if (rc < 0)
            PyErr_Clear(); /* malformed: records_parse says how */
        ok = rc == 0;
    }
    ok = ok && c.p == c.end;
    PyBuffer_Release(&raw);
    return PyBool_FromLong(ok);
}

static PyObject *
records_cut(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer raw;
    Py_ssize_t start, stop, count, overhead, max_batch, max_record;
    long long base_ts;
    int keyed;
    if (!PyArg_ParseTuple(args, "y*nnnLnnnp", &raw, &start, &stop, &count, &base_ts, &overhead,
                          &max_batch, &max_record, &keyed))
        return NULL;
    PyObject *pieces = NULL;
    Cursor c;
    if (scan_range(&raw, start, stop, count, &c) < 0)
        goto refuse;
    if ((pieces = PyList_New(0)) == NULL)
        goto done;
    const unsigned char *base = (const unsigned char *)raw.buf;
    const unsigned char *piece_at = c.p;
    Py_ssize_t piece_n = 0;
    int64_t acc = 0;
    Scanned s;
    for (; c.record < count; c.record++) {
        const unsigned char *at = c.p;
        int rc = scan_one(&c, base_ts, &s);
        if (rc < 0)
            PyErr_Clear();
        if (rc != 0)
            goto refuse;
        int64_t size = overhead + (s.key ? s.klen : 0) + (s.value ? s.vlen : 0) +
                       (s.nheaders ? s.header_estimate : 0);
        if (size > max_record || (keyed && s.key == NULL))
            goto refuse;
        if (piece_n > 0 && acc + size > max_batch) {
            PyObject *piece = Py_BuildValue("(nnn)", (Py_ssize_t)(piece_at - base),
                                            (Py_ssize_t)(at - base), piece_n);
            if (piece == NULL || PyList_Append(pieces, piece) < 0) {
                Py_XDECREF(piece);
                Py_CLEAR(pieces);
                goto done;
            }
            Py_DECREF(piece);
            piece_at = at;
            piece_n = 0;
            acc = 0;
        }
        acc += size;
        piece_n++;
    }
    if (c.p != c.end)
        goto refuse;
    if (piece_n > 0) {
        PyObject *piece = Py_BuildValue("(nnn)", (Py_ssize_t)(piece_at - base),
                                        (Py_ssize_t)(c.p - base), piece_n);
        if (piece == NULL || PyList_Append(pieces, piece) < 0) {
            Py_XDECREF(piece);
            Py_CLEAR(pieces);
            goto done;
        }
        Py_DECREF(piece);
    }
    goto done;
refuse:
    Py_XDECREF(pieces);
    pieces = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&raw);
    return pieces;
}

static PyObject *
records_stored(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer raw;
    Py_ssize_t start, stop, count;
    long long base_ts, base_offset, now;
    int log_append_time;
    if (!PyArg_ParseTuple(args, "y*nnnLLpL", &raw, &start, &stop, &count, &base_ts,
                          &base_offset, &log_append_time, &now))
        return NULL;
    PyObject *blob = NULL, *stamps = NULL, *result = NULL, *last = NULL;
    Cursor c;
    if (scan_range(&raw, start, stop, count, &c) < 0 || count < 1 || count > INT32_MAX ||
        now < 0) {
        PyErr_SetString(PyExc_ValueError, "records range outside the buffer");
        goto done;
    }
    /* first pass: the batch's size (records_cut checked the records; checked again here) */
    Scanned s;
    int64_t size = STORED_HEADER;
    for (; c.record < count; c.record++) {
        int rc = scan_one(&c, base_ts, &s);
        if (rc > 0)
            PyErr_Format(PyExc_ValueError, "record %zd is not for the stored path", c.record);
        if (rc != 0)
            goto done;
        size += 4 + 4 + 8 + 4 + (s.key ? s.klen : 0) + 4 + (s.value ? s.vlen : 0) + 4 +
                s.header_bytes;
    }
    if (c.p != c.end || size - 12 > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "records disagree with the batch length");
        goto done;
    }
    if ((blob = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)size)) == NULL ||
        (stamps = PyList_New(count)) == NULL)
        goto done;
    char *out = PyByteArray_AS_STRING(blob);
    char *w = out + STORED_HEADER;
    scan_range(&raw, start, stop, count, &c);
    long long first = 0, max_ts = 0, previous = 0;
    for (c.record = 0; c.record < count; c.record++) {
        int rc = scan_one(&c, base_ts, &s); /* the first pass accepted it: 0 */
        if (rc > 0)
            PyErr_Format(PyExc_ValueError, "record %zd is not for the stored path", c.record);
        if (rc != 0)
            goto done;
        long long ts = (log_append_time || s.ts < 0) ? now : s.ts;
        if (c.record == 0)
            first = max_ts = ts;
        if (ts > max_ts)
            max_ts = ts;
        if (last == NULL || ts != previous) {
            Py_XDECREF(last);
            if ((last = PyLong_FromLongLong(ts)) == NULL)
                goto done;
            previous = ts;
        }
        PyList_SET_ITEM(stamps, c.record, Py_NewRef(last));
        int64_t klen = s.key ? s.klen : 0, vlen = s.value ? s.vlen : 0;
        put_be32(w, (int32_t)(4 + 8 + 4 + klen + 4 + vlen + 4 + s.header_bytes));
        put_be32(w + 4, (int32_t)c.record);
        put_be64(w + 8, ts - first);
        put_be32(w + 16, s.key ? (int32_t)klen : -1);
        w += 20;
        if (klen)
            memcpy(w, s.key, (size_t)klen);
        w += klen;
        put_be32(w, s.value ? (int32_t)vlen : -1);
        if (vlen)
            memcpy(w + 4, s.value, (size_t)vlen);
        w += 4 + vlen;
        put_be32(w, (int32_t)s.nheaders);
        w += 4;
        Cursor hc = {s.headers, c.p, c.record};
        for (int64_t h = 0; h < s.nheaders; h++) {
            const unsigned char *at;
            int64_t n;
            for (int part = 0; part < 2; part++) {
                if (scan_field(&hc, &at, &n) < 0)
                    goto done;
                put_be32(w, at ? (int32_t)n : -1);
                if (at && n)
                    memcpy(w + 4, at, (size_t)n);
                w += 4 + (at ? n : 0);
            }
        }
    }
    if (w != out + size) {
        PyErr_SetString(PyExc_SystemError, "records_stored: size mismatch");
        goto done;
    }
    put_be64(out, base_offset);
    put_be32(out + 8, (int32_t)(size - 12));
    out[12] = 2;
    memset(out + 13, 0, 4);
    out[17] = 0;
    out[18] = log_append_time ? 0x08 : 0;
    put_be32(out + 19, (int32_t)(count - 1));
    put_be64(out + 23, first);
    put_be64(out + 31, max_ts);
    put_be32(out + 39, (int32_t)count);
    result = PyTuple_Pack(2, blob, stamps);
done:
    Py_XDECREF(last);
    Py_XDECREF(blob);
    Py_XDECREF(stamps);
    PyBuffer_Release(&raw);
    return result;
}

static PyMethodDef wire_methods[] = {
    {"kafka_batches", kafka_batches, METH_VARARGS,
     "kafka_batches(batches, start, stop) -> (bytearray, header_positions, records): the "
     "records of stored batches (StoredBatch: buf, start, end) in [start, stop) as Kafka record "
     "batches v2, their CRCs left 0 for the caller."},
    {"records_payload", records_payload, METH_VARARGS,
     "records_payload(records, base_offset, base_timestamp) -> (bytes, max_timestamp): the "
     "records section of a Kafka record batch v2."},
    {"records_parse", records_parse, METH_VARARGS,
     "records_parse(raw, start, stop, count, base_timestamp) -> list of (key, value, headers, "
     "timestamp): the records section of a Kafka record batch v2, as the log appends them."},
    {"records_scan", records_scan, METH_VARARGS,
     "records_scan(raw, start, stop, count, base_timestamp) -> bool: whether records_stored "
     "can transcode the records (else records_parse them)."},
    {"records_cut", records_cut, METH_VARARGS,
     "records_cut(raw, start, stop, count, base_timestamp, overhead, max_batch, max_record, "
     "keyed) -> list of (start, stop, count) | None: the records cut as the log cuts a batch."},
    {"records_stored", records_stored, METH_VARARGS,
     "records_stored(raw, start, stop, count, base_timestamp, base_offset, log_append_time, "
     "now) -> (bytearray, timestamps): one stored batch of the records, its CRC left 0."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef wire_module = {
    PyModuleDef_HEAD_INIT, "eventlane.kafka._wire",
    "Kafka record framing for the listener (optional C speedup).", -1, wire_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__wire(void)
{
    return PyModule_Create(&wire_module);
}
