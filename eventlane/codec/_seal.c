/*
 * eventlane.codec._seal: opening an event's enc4 cipher object in one C call.
 *
 * An optional speedup of eventlane/codec/privacy.py's FieldCipher.open, which stays the
 * reference: open4 either opens the object exactly as that Python path would, or changes
 * nothing and returns False, and the caller then runs the Python path, which produces the
 * result or raises the error. So every error, every forgotten key and every unusual value
 * (a type other than exactly str/int/list, a key not opened yet, a non-hex text, a failed tag,
 * a plain text that is not a JSON object) is the Python path's by construction, and only
 * success is decided here (tests/codec/test_seal_native.py: the two paths agree over
 * generated keys, nonces, associated data and plain texts, tampered texts included).
 *
 *   SODIUM                     True when built with libsodium (HAVE_SODIUM, setup.py) and
 *                              this CPU has its AES-256-GCM (AES-NI and PCLMULQDQ)
 *   Opener(engine=None)        the keys opened so far, for one FieldCipher; ``engine``:
 *                              "sodium", "openssl", or None (sodium when SODIUM)
 *     .engine                      the engine chosen
 *     .add(subject, version, key)  AES-GCM with a 128, 192 or 256-bit key, its key schedule
 *                                  set once and reused for every decryption (`cryptography`
 *                                  builds a context per call): a 256-bit key under "sodium"
 *                                  is libsodium's precomputed state
 *                                  (crypto_aead_aes256gcm_beforenm, then _decrypt_afternm:
 *                                  one call, no EVP layer), any other an OpenSSL EVP context
 *     .clear()                     forget every key (the store's keys changed)
 *     .fresh_until                 monotonic time (time.monotonic's clock) until which the
 *                                  keys added need no check against the store; 0 at first
 *     .open4(data, event_id, aggregate_id, topics) -> bool
 *   unhex(text) -> bytes | None  open4's hex decoding alone (tests hold it to unhexlify)
 *
 * open4 reads data["$eventlane"] = ["enc4", subject, version, fields, topic, hex text]
 * (privacy.py documents the format) and, while the clock is before fresh_until, finds the
 * subject's key among those added (the last one used first), checks the bound topic against
 * ``topics`` (an empty frozenset: any), builds the associated data
 * "enc4\0topic\0aggregate id\0subject\0event id\0fields" (UTF-8), decodes the hex text
 * (12-byte nonce, cipher text, 16-byte tag), decrypts and authenticates it, parses the plain
 * text and, when that is a dict, deletes data["$eventlane"] and updates data with it. The
 * plain text is parsed here when it is exactly what FieldCipher.seal writes with orjson.dumps
 * for the names in ``fields``: the names in their stored order, no whitespace, each value a
 * string without escapes or control characters, an integer of at most 18 digits, true,
 * false or null (the values go into data directly, without an intermediate dict: the
 * usual personal fields); any other text, valid or not, goes to orjson.loads as before.
 * Those forms read the same in orjson.loads by construction (its own output, nothing to
 * choose), and tests/codec/test_seal_native.py holds the two equal over hand-written texts.
 * The last bound topic found in the reader's topics and the last field-name text's names are
 * remembered (``.simple`` counts the objects parsed here). The GIL is held throughout: a
 * context is never used by two threads at once.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include <openssl/err.h>
#include <openssl/evp.h>
#ifdef HAVE_SODIUM
#include <sodium.h>
#endif

#define NONCE 12
#define TAG 16
#define STACK_BYTES 1024

static PyObject *mark;  /* "$eventlane" */
static PyObject *loads; /* orjson.loads */
static int sodium_ok;   /* libsodium's AES-256-GCM is built and this CPU runs it */

/* ------------------------------------------------------------------------------------- */
/* Key                                                                                     */
/* ------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    EVP_CIPHER_CTX *ctx; /* OpenSSL's context, or NULL when state is set */
    void *state;         /* libsodium's crypto_aead_aes256gcm_state (16-byte aligned), or NULL */
} Key;

static void
key_dealloc(Key *self)
{
    EVP_CIPHER_CTX_free(self->ctx);
#ifdef HAVE_SODIUM
    if (self->state != NULL) {
        sodium_memzero(self->state, sizeof(crypto_aead_aes256gcm_state));
    }
#endif
    free(self->state);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject KeyType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "eventlane.codec._seal.Key",
    .tp_basicsize = sizeof(Key),
    .tp_dealloc = (destructor)key_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An AES-GCM key whose OpenSSL context or libsodium state is reused.",
};

/* A new Key for ``raw`` (16, 24 or 32 bytes): libsodium's state when ``sodium`` and the key
 * is 32 bytes, else an OpenSSL context. NULL with an exception on failure. */
static Key *
key_create(const unsigned char *raw, Py_ssize_t len, int sodium)
{
    const EVP_CIPHER *cipher;
    Key *self;
    switch (len) {
    case 16: cipher = EVP_aes_128_gcm(); break;
    case 24: cipher = EVP_aes_192_gcm(); break;
    case 32: cipher = EVP_aes_256_gcm(); break;
    default:
        PyErr_SetString(PyExc_ValueError, "AES-GCM key must be 128, 192, or 256 bits.");
        return NULL;
    }
    self = PyObject_New(Key, &KeyType);
    if (self == NULL) {
        return NULL;
    }
    self->ctx = NULL;
    self->state = NULL;
#ifdef HAVE_SODIUM
    if (sodium && len == 32) {
        if (posix_memalign(&self->state, 16, sizeof(crypto_aead_aes256gcm_state)) != 0) {
            self->state = NULL;
            Py_DECREF(self);
            return (Key *)PyErr_NoMemory();
        }
        crypto_aead_aes256gcm_beforenm((crypto_aead_aes256gcm_state *)self->state, raw);
        return self;
    }
#else
    (void)sodium;
#endif
    self->ctx = EVP_CIPHER_CTX_new();
    if (self->ctx == NULL || EVP_DecryptInit_ex(self->ctx, cipher, NULL, raw, NULL) != 1) {
        Py_DECREF(self);
        ERR_clear_error();
        PyErr_SetString(PyExc_MemoryError, "cannot set up an OpenSSL AES-GCM context");
        return NULL;
    }
    return self;
}

/* Decrypt and authenticate ``blob`` (nonce, cipher text, tag; at least NONCE + TAG bytes)
 * under ``aad`` into ``out`` (room for the cipher text): 0, or -1 when the tag fails (no
 * exception set). */
static int
key_open(Key *key, const unsigned char *blob, Py_ssize_t blob_length, const unsigned char *aad,
         Py_ssize_t aad_length, unsigned char *out)
{
    int n = 0, tail = 0;
    Py_ssize_t text_length = blob_length - NONCE - TAG;
#ifdef HAVE_SODIUM
    if (key->state != NULL) {
        unsigned long long m = 0;
        return crypto_aead_aes256gcm_decrypt_afternm(
                   out, &m, NULL, blob + NONCE, (unsigned long long)(blob_length - NONCE), aad,
                   (unsigned long long)aad_length, blob,
                   (const crypto_aead_aes256gcm_state *)key->state) == 0
                   ? 0
                   : -1;
    }
#endif
    if (EVP_DecryptInit_ex(key->ctx, NULL, NULL, NULL, blob) != 1 ||
        EVP_DecryptUpdate(key->ctx, NULL, &n, aad, (int)aad_length) != 1 ||
        EVP_DecryptUpdate(key->ctx, out, &n, blob + NONCE, (int)text_length) != 1 ||
        EVP_CIPHER_CTX_ctrl(key->ctx, EVP_CTRL_GCM_SET_TAG, TAG,
                            (void *)(blob + blob_length - TAG)) != 1 ||
        EVP_DecryptFinal_ex(key->ctx, out + n, &tail) != 1) {
        ERR_clear_error(); /* a tag that fails: the Python path says so */
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------- */
/* open4                                                                                   */
/* ------------------------------------------------------------------------------------- */

/* Each byte's value as a hex digit, or 0xff: binascii.unhexlify's alphabet. */
static unsigned char hex_digit[256];

/* binascii.unhexlify's result for an ASCII text of 2 * n characters into n bytes: 0, or -1
 * for what it refuses (a character other than 0-9, a-f, A-F). Sixteen characters at a time
 * with SSE2 (every x86-64 CPU has it), the rest through the table. */
static int
unhex(const unsigned char *text, Py_ssize_t n, unsigned char *out)
{
    Py_ssize_t i = 0;
    unsigned char bad = 0;
#ifdef __SSE2__
    const __m128i zero = _mm_set1_epi8('0'), nine = _mm_set1_epi8(9), a = _mm_set1_epi8('a'),
                  five = _mm_set1_epi8(5), ten = _mm_set1_epi8(10), lower = _mm_set1_epi8(0x20),
                  even = _mm_set1_epi16(0x00ff);
    __m128i ok = _mm_cmpeq_epi8(zero, zero); /* all ones */
    for (; i + 8 <= n; i += 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)(text + 2 * i));
        __m128i digit = _mm_sub_epi8(v, zero);                       /* '0'..'9' -> 0..9 */
        __m128i letter = _mm_sub_epi8(_mm_or_si128(v, lower), a);    /* a-f, A-F -> 0..5 */
        __m128i is_digit = _mm_cmpeq_epi8(_mm_min_epu8(digit, nine), digit); /* <= 9 */
        __m128i is_letter = _mm_cmpeq_epi8(_mm_min_epu8(letter, five), letter); /* <= 5 */
        __m128i value = _mm_or_si128(_mm_and_si128(is_digit, digit),
                                     _mm_andnot_si128(is_digit, _mm_add_epi8(letter, ten)));
        /* 16-bit lanes hold (first digit, second digit): first << 4 | second */
        __m128i pair = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(value, even), 4),
                                    _mm_srli_epi16(value, 8));
        ok = _mm_and_si128(ok, _mm_or_si128(is_digit, is_letter));
        _mm_storel_epi64((__m128i *)(out + i), _mm_packus_epi16(pair, pair));
    }
    if (_mm_movemask_epi8(ok) != 0xffff) {
        return -1;
    }
#endif
    for (; i < n; i++) {
        unsigned char hi = hex_digit[text[2 * i]], lo = hex_digit[text[2 * i + 1]];
        bad |= hi | lo;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return (bad & 0xf0) ? -1 : 0;
}

/* A str's UTF-8 text without a call when it is compact ASCII (its data is the text), else
 * PyUnicode_AsUTF8AndSize's; NULL with an exception (lone surrogates). */
static inline const char *
utf8_of(PyObject *s, Py_ssize_t *size)
{
    if (PyUnicode_IS_COMPACT_ASCII(s)) {
        *size = PyUnicode_GET_LENGTH(s);
        return (const char *)PyUnicode_DATA(s);
    }
    return PyUnicode_AsUTF8AndSize(s, size);
}

typedef struct {
    PyObject_HEAD
    PyObject *keys;         /* dict: (subject, version) -> Key */
    PyObject *last_subject; /* the last key used, or NULL */
    PyObject *last_version;
    long long last_version_value; /* its value, when last_version_fits in a long long */
    int last_version_fits;
    Key *last_key;
    PyObject *last_topics; /* the reader's topics and a bound topic found in them, or NULL */
    PyObject *last_bound;
    PyObject *last_fields; /* the last field-name text and its names, or NULL */
    PyObject *last_names;  /* tuple of str, or None when a name is not plain JSON text */
    double fresh_until;
    Py_ssize_t simple;  /* objects whose values were parsed here, not by orjson.loads */
    int sodium; /* new 256-bit keys get libsodium's state */
} Opener;

static void
opener_forget_last(Opener *self)
{
    Py_CLEAR(self->last_subject);
    Py_CLEAR(self->last_version);
    Py_CLEAR(self->last_key);
}

static void
opener_forget_all(Opener *self)
{
    opener_forget_last(self);
    Py_CLEAR(self->last_topics);
    Py_CLEAR(self->last_bound);
    Py_CLEAR(self->last_fields);
    Py_CLEAR(self->last_names);
}

static void
opener_dealloc(Opener *self)
{
    opener_forget_all(self);
    Py_XDECREF(self->keys);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
opener_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    Opener *self;
    const char *engine = NULL;
    int sodium;
    static char *names[] = {"engine", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|z:Opener", names, &engine)) {
        return NULL;
    }
    if (engine == NULL) {
        sodium = sodium_ok;
    } else if (strcmp(engine, "openssl") == 0) {
        sodium = 0;
    } else if (strcmp(engine, "sodium") == 0 && sodium_ok) {
        sodium = 1;
    } else {
        PyErr_Format(PyExc_ValueError, "engine %s is not available here", engine);
        return NULL;
    }
    self = (Opener *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->sodium = sodium;
    self->keys = PyDict_New();
    if (self->keys == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *
opener_engine(Opener *self, void *unused)
{
    return PyUnicode_FromString(self->sodium ? "sodium" : "openssl");
}

static PyObject *
opener_add(Opener *self, PyObject *args)
{
    PyObject *subject, *version, *pair;
    Py_buffer raw;
    Key *key;
    int failed;
    if (!PyArg_ParseTuple(args, "O!O!y*:add", &PyUnicode_Type, &subject, &PyLong_Type, &version,
                          &raw)) {
        return NULL;
    }
    key = key_create((const unsigned char *)raw.buf, raw.len, self->sodium);
    PyBuffer_Release(&raw);
    if (key == NULL) {
        return NULL;
    }
    pair = PyTuple_Pack(2, subject, version);
    if (pair == NULL) {
        Py_DECREF(key);
        return NULL;
    }
    failed = PyDict_SetItem(self->keys, pair, (PyObject *)key);
    Py_DECREF(pair);
    Py_DECREF(key);
    if (failed) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
opener_clear(Opener *self, PyObject *unused)
{
    opener_forget_all(self);
    PyDict_Clear(self->keys);
    Py_RETURN_NONE;
}

/* Whether str objects ``a`` and ``b`` (exact str) hold the same text. */
static int
same_text(PyObject *a, PyObject *b)
{
    if (a == b) {
        return 1;
    }
    return PyUnicode_GET_LENGTH(a) == PyUnicode_GET_LENGTH(b) &&
           PyUnicode_KIND(a) == PyUnicode_KIND(b) &&
           memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b),
                  (size_t)(PyUnicode_GET_LENGTH(a) * PyUnicode_KIND(a))) == 0;
}

/* The Key of (subject, version), borrowed: the last one used when it names them, else the
 * one added for them (then remembered as the last); NULL when none was (no exception). */
static Key *
find_key(Opener *self, PyObject *subject, PyObject *version)
{
    PyObject *found, *pair;
    if (self->last_key != NULL && same_text(self->last_subject, subject)) {
        int overflow = 0;
        if (self->last_version == version ||
            (PyLong_AsLongLongAndOverflow(version, &overflow) == self->last_version_value &&
             !overflow && self->last_version_fits)) {
            return self->last_key; /* the same int value (a JSON parse makes a new object) */
        }
        PyErr_Clear(); /* not reached for an exact int */
    }
    pair = PyTuple_Pack(2, subject, version);
    if (pair == NULL) {
        PyErr_Clear();
        return NULL;
    }
    found = PyDict_GetItemWithError(self->keys, pair);
    Py_DECREF(pair);
    if (found == NULL) {
        PyErr_Clear();
        return NULL;
    }
    Py_INCREF(subject);
    Py_INCREF(version);
    Py_INCREF(found);
    opener_forget_last(self);
    {
        int overflow = 0;
        self->last_version_value = PyLong_AsLongLongAndOverflow(version, &overflow);
        self->last_version_fits = !overflow;
        PyErr_Clear(); /* not reached for an exact int */
    }
    self->last_subject = subject;
    self->last_version = version;
    self->last_key = (Key *)found;
    return (Key *)found;
}

/* Whether ``bound`` is in the frozenset ``topics``: the last pair found is remembered (a
 * frozenset never changes). 1, or 0 (no exception). */
static int
topic_in(Opener *self, PyObject *topics, PyObject *bound)
{
    int in;
    if (self->last_topics == topics && same_text(self->last_bound, bound)) {
        return 1;
    }
    in = PySet_Contains(topics, bound);
    if (in != 1) {
        PyErr_Clear();
        return 0;
    }
    Py_INCREF(topics);
    Py_INCREF(bound);
    Py_XSETREF(self->last_topics, topics);
    Py_XSETREF(self->last_bound, bound);
    return 1;
}

/* The names in the field-name text ``fields`` (joined by NUL), as a tuple, borrowed; None
 * when a name is not JSON text as written (a '"', '\\' or control character: orjson escapes
 * it) or there are more than MAX_NAMES; NULL with an exception on failure. The last text's
 * names are remembered. */
#define MAX_NAMES 32
static PyObject *
names_of(Opener *self, PyObject *fields)
{
    PyObject *nul, *list, *names;
    Py_ssize_t i, j, n;
    if (self->last_fields != NULL && same_text(self->last_fields, fields)) {
        return self->last_names;
    }
    nul = PyUnicode_FromStringAndSize("\0", 1);
    if (nul == NULL) {
        return NULL;
    }
    list = PyUnicode_Split(fields, nul, -1);
    Py_DECREF(nul);
    if (list == NULL) {
        return NULL;
    }
    n = PyList_GET_SIZE(list);
    names = PyList_AsTuple(list);
    Py_DECREF(list);
    if (names == NULL) {
        return NULL;
    }
    for (i = 0; i < n && n <= MAX_NAMES; i++) {
        Py_ssize_t size;
        const char *utf8 = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(names, i), &size);
        if (utf8 == NULL) {
            PyErr_Clear();
            break;
        }
        for (j = 0; j < size; j++) {
            unsigned char c = (unsigned char)utf8[j];
            if (c < 0x20 || c == '"' || c == '\\') {
                break;
            }
        }
        if (j < size) {
            break;
        }
    }
    if (i < n || n > MAX_NAMES) {
        Py_DECREF(names);
        names = Py_None;
        Py_INCREF(names);
    }
    Py_INCREF(fields);
    Py_XSETREF(self->last_fields, fields);
    Py_XSETREF(self->last_names, names);
    return names;
}

/* One JSON value at p[*at] of the forms orjson.dumps writes and orjson.loads reads back
 * unchanged without any choice: a string without escapes or control characters, an integer
 * of at most 18 digits (not -0), true, false, null. A new reference, advancing *at; NULL
 * without an exception for anything else (orjson.loads decides it). */
static PyObject *
simple_value(const unsigned char *p, Py_ssize_t n, Py_ssize_t *at)
{
    Py_ssize_t i = *at, start;
    unsigned char c;
    if (i >= n) {
        return NULL;
    }
    c = p[i];
    if (c == '"') {
        PyObject *s;
        unsigned char any = 0;
        start = ++i;
        while (i < n && p[i] != '"') {
            if (p[i] < 0x20 || p[i] == '\\') {
                return NULL;
            }
            any |= p[i];
            i++;
        }
        if (i >= n) {
            return NULL;
        }
        if (any < 0x80) { /* ASCII: the text as it is */
            s = PyUnicode_New(i - start, 127);
            if (s == NULL) {
                return NULL;
            }
            memcpy(PyUnicode_1BYTE_DATA(s), p + start, (size_t)(i - start));
            *at = i + 1;
            return s;
        }
        s = PyUnicode_DecodeUTF8((const char *)p + start, i - start, NULL);
        if (s == NULL) {
            PyErr_Clear(); /* not UTF-8: orjson.loads says so */
            return NULL;
        }
        *at = i + 1;
        return s;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        long long v = 0;
        int negative = c == '-';
        if (negative) {
            i++;
        }
        start = i;
        while (i < n && p[i] >= '0' && p[i] <= '9' && i - start < 18) {
            v = v * 10 + (p[i] - '0');
            i++;
        }
        if (i == start || (p[start] == '0' && (i - start > 1 || negative)) ||
            (i < n && (p[i] == '.' || p[i] == 'e' || p[i] == 'E' || (p[i] >= '0' && p[i] <= '9')))) {
            return NULL; /* a float, a leading zero, -0, or too long: orjson.loads decides */
        }
        *at = i;
        return PyLong_FromLongLong(negative ? -v : v);
    }
    if (n - i >= 4 && memcmp(p + i, "true", 4) == 0) {
        *at = i + 4;
        Py_RETURN_TRUE;
    }
    if (n - i >= 5 && memcmp(p + i, "false", 5) == 0) {
        *at = i + 5;
        Py_RETURN_FALSE;
    }
    if (n - i >= 4 && memcmp(p + i, "null", 4) == 0) {
        *at = i + 4;
        Py_RETURN_NONE;
    }
    return NULL;
}

/* The values of plain text ``p`` into ``values`` (one per name, new references) when it is
 * exactly what FieldCipher.seal writes for these names: orjson's compact object of the
 * names in their stored order, each value of simple_value's forms. 1 when parsed; 0 (no
 * exception, nothing kept) for any other text, which orjson.loads then decides; -1 with an
 * exception (no memory). */
static int
simple_values(const unsigned char *p, Py_ssize_t n, PyObject *names, PyObject **values)
{
    Py_ssize_t at = 0, i, count = PyTuple_GET_SIZE(names);
    for (i = 0; i < count; i++) {
        Py_ssize_t size;
        const char *name = utf8_of(PyTuple_GET_ITEM(names, i), &size);
        if (name == NULL) {
            PyErr_Clear(); /* names_of checked it: not reached */
            break;
        }
        if (at + size + 3 > n || p[at] != (i == 0 ? '{' : ',') ||
            p[at + 1] != '"' || memcmp(p + at + 2, name, (size_t)size) != 0 ||
            p[at + 2 + size] != '"' || at + size + 4 > n || p[at + 3 + size] != ':') {
            break;
        }
        at += size + 4;
        values[i] = simple_value(p, n, &at);
        if (values[i] == NULL) {
            if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                while (i-- > 0) {
                    Py_DECREF(values[i]);
                }
                return -1;
            }
            PyErr_Clear();
            break;
        }
    }
    if (i == count && count > 0 && at == n - 1 && p[at] == '}') {
        return 1;
    }
    while (i-- > 0) {
        Py_DECREF(values[i]);
    }
    return 0;
}

static PyObject *
open4(Opener *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *data, *event_id, *aggregate_id, *topics;
    PyObject *sealed, *subject, *version, *fields, *bound, *text, *names;
    PyObject *plain = NULL, *values = NULL, *parsed[MAX_NAMES];
    PyObject *result = Py_False;
    PyObject **item;
    Key *key;
    unsigned char stack[STACK_BYTES], *buf = stack, *aad, *blob, *out;
    const char *part[5];
    Py_ssize_t part_length[5];
    Py_ssize_t text_length, blob_length, plain_length, aad_length, need, i;
    int simple;

    struct timespec now;

    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "open4 takes 4 arguments");
        return NULL;
    }
    data = args[0], event_id = args[1], aggregate_id = args[2], topics = args[3];
    if (clock_gettime(CLOCK_MONOTONIC, &now) != 0 ||
        (double)now.tv_sec + (double)now.tv_nsec * 1e-9 >= self->fresh_until) {
        Py_RETURN_FALSE; /* the store may have changed: FieldCipher.open checks it */
    }
    if (!PyDict_CheckExact(data) || !PyUnicode_CheckExact(event_id) ||
        !PyUnicode_CheckExact(aggregate_id) || !PyFrozenSet_CheckExact(topics)) {
        Py_RETURN_FALSE;
    }
    sealed = PyDict_GetItemWithError(data, mark);
    if (sealed == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_FALSE;
    }
    if (!PyList_CheckExact(sealed) || PyList_GET_SIZE(sealed) != 6) {
        Py_RETURN_FALSE;
    }
    item = ((PyListObject *)sealed)->ob_item;
    if (!PyUnicode_CheckExact(item[0]) || !PyUnicode_IS_COMPACT_ASCII(item[0]) ||
        PyUnicode_GET_LENGTH(item[0]) != 4 || memcmp(PyUnicode_DATA(item[0]), "enc4", 4) != 0) {
        /* "enc4" as any other str (not compact ASCII): the Python path reads it the same */
        Py_RETURN_FALSE;
    }
    subject = item[1], version = item[2], fields = item[3], bound = item[4], text = item[5];
    if (!PyUnicode_CheckExact(subject) || !PyLong_CheckExact(version) ||
        !PyUnicode_CheckExact(fields) || !PyUnicode_CheckExact(bound) ||
        !PyUnicode_CheckExact(text) || !PyUnicode_IS_ASCII(text)) {
        Py_RETURN_FALSE;
    }
    if (PySet_GET_SIZE(topics) > 0 && !topic_in(self, topics, bound)) {
        Py_RETURN_FALSE;
    }
    key = find_key(self, subject, version);
    if (key == NULL) {
        Py_RETURN_FALSE;
    }
    text_length = PyUnicode_GET_LENGTH(text);
    blob_length = text_length / 2;
    if (text_length % 2 != 0 || blob_length < NONCE + TAG || blob_length - NONCE > INT_MAX) {
        Py_RETURN_FALSE; /* refused by unhexlify, or a tag that cannot authenticate */
    }
    plain_length = blob_length - NONCE - TAG;

    /* one buffer: the associated data, the decoded blob, the plain text */
    {
        PyObject *parts[5] = {bound, aggregate_id, subject, event_id, fields};
        aad_length = 5 + 4; /* "enc4" and five NULs but the last */
        for (i = 0; i < 5; i++) {
            part[i] = utf8_of(parts[i], &part_length[i]);
            if (part[i] == NULL) {
                PyErr_Clear(); /* lone surrogates: the Python path says so */
                Py_RETURN_FALSE;
            }
            aad_length += part_length[i];
        }
    }
    if (aad_length > INT_MAX) {
        Py_RETURN_FALSE; /* more than EVP_DecryptUpdate takes at once */
    }
    need = aad_length + blob_length + plain_length;
    if (need > STACK_BYTES) {
        buf = PyMem_Malloc((size_t)need);
        if (buf == NULL) {
            return PyErr_NoMemory();
        }
    }
    aad = buf;
    memcpy(aad, "enc4", 5); /* with its NUL */
    {
        unsigned char *at = aad + 5;
        for (i = 0; i < 5; i++) {
            memcpy(at, part[i], (size_t)part_length[i]);
            at += part_length[i];
            if (i < 4) {
                *at++ = 0;
            }
        }
    }
    blob = buf + aad_length;
    out = blob + blob_length;
    if (unhex(PyUnicode_1BYTE_DATA(text), blob_length, blob) < 0) {
        goto done;
    }
    if (key_open(key, blob, blob_length, aad, aad_length, out) < 0) {
        goto done; /* a tag that fails: the Python path says so */
    }

    /* the values: parsed here when the plain text is what seal writes, else orjson.loads */
    names = names_of(self, fields);
    if (names == NULL) {
        result = NULL;
        goto done;
    }
    Py_INCREF(names); /* kept while a dict's keys may run code */
    simple = names == Py_None ? 0 : simple_values(out, plain_length, names, parsed);
    if (simple < 0) {
        Py_DECREF(names);
        result = NULL;
        goto done;
    }
    if (simple) {
        Py_ssize_t count = PyTuple_GET_SIZE(names);
        if (PyDict_DelItem(data, mark) < 0) {
            result = NULL;
        }
        for (i = 0; i < count; i++) {
            if (result != NULL && PyDict_SetItem(data, PyTuple_GET_ITEM(names, i), parsed[i]) < 0) {
                result = NULL;
            }
            Py_DECREF(parsed[i]);
        }
        if (result != NULL) {
            self->simple++;
            result = Py_True;
        }
        Py_DECREF(names);
        goto done;
    }
    Py_DECREF(names);
    plain = PyBytes_FromStringAndSize((const char *)out, plain_length);
    if (plain == NULL) {
        result = NULL;
        goto done;
    }
    values = PyObject_CallOneArg(loads, plain);
    if (values == NULL) {
        PyErr_Clear(); /* not JSON: the Python path says so */
        goto done;
    }
    if (!PyDict_CheckExact(values)) {
        goto done;
    }
    if (PyDict_DelItem(data, mark) < 0 || PyDict_Update(data, values) < 0) {
        result = NULL;
        goto done;
    }
    result = Py_True;

done:
    if (buf != stack) {
        PyMem_Free(buf);
    }
    Py_XDECREF(plain);
    Py_XDECREF(values);
    Py_XINCREF(result);
    return result;
}

static PyMethodDef opener_methods[] = {
    {"open4", (PyCFunction)(void (*)(void))open4, METH_FASTCALL,
     "open4(data, event_id, aggregate_id, topics) -> bool: open data's enc4 cipher object in "
     "place as FieldCipher.open would, or change nothing (False)."},
    {"add", (PyCFunction)opener_add, METH_VARARGS,
     "add(subject, version, key): the AES-GCM key of (subject, version), for open4."},
    {"clear", (PyCFunction)opener_clear, METH_NOARGS, "clear(): forget every key added."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef opener_members[] = {
    {"fresh_until", T_DOUBLE, offsetof(Opener, fresh_until), 0,
     "monotonic time until which the keys added need no check against the store"},
    {"simple", T_PYSSIZET, offsetof(Opener, simple), READONLY,
     "objects opened whose values were parsed here (the rest by orjson.loads)"},
    {"keys", T_OBJECT, offsetof(Opener, keys), READONLY,
     "the keys added: (subject, version) -> Key"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef opener_getset[] = {
    {"engine", (getter)opener_engine, NULL, "the engine new keys get: sodium or openssl", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject OpenerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "eventlane.codec._seal.Opener",
    .tp_basicsize = sizeof(Opener),
    .tp_dealloc = (destructor)opener_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Opener(engine=None): the AES-GCM keys one FieldCipher has opened, and open4.",
    .tp_new = opener_new,
    .tp_methods = opener_methods,
    .tp_members = opener_members,
    .tp_getset = opener_getset,
};

/* unhex(text) -> bytes | None: open4's hex decoding alone, for tests against unhexlify. */
static PyObject *
seal_unhex(PyObject *module, PyObject *text)
{
    PyObject *out;
    Py_ssize_t n;
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "unhex takes a str");
        return NULL;
    }
    n = PyUnicode_GET_LENGTH(text);
    if (!PyUnicode_IS_COMPACT_ASCII(text) || n % 2 != 0) {
        Py_RETURN_NONE; /* open4 declines these before decoding */
    }
    out = PyBytes_FromStringAndSize(NULL, n / 2);
    if (out == NULL) {
        return NULL;
    }
    if (unhex(PyUnicode_1BYTE_DATA(text), n / 2, (unsigned char *)PyBytes_AS_STRING(out)) < 0) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
}

static PyMethodDef seal_methods[] = {
    {"unhex", (PyCFunction)seal_unhex, METH_O,
     "unhex(text) -> bytes | None: open4's hex decoding of an ASCII text (None where "
     "open4 declines it: odd length, not ASCII, not hex), for tests."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef seal_module = {
    PyModuleDef_HEAD_INIT, "eventlane.codec._seal",
    "Opening enc4 cipher objects in one C call (optional speedup of "
    "eventlane.codec.privacy).",
    -1, seal_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__seal(void)
{
    PyObject *module, *orjson;
    int c;
    for (c = 0; c < 256; c++) {
        hex_digit[c] = 0xff;
    }
    for (c = 0; c < 10; c++) {
        hex_digit['0' + c] = (unsigned char)c;
    }
    for (c = 0; c < 6; c++) {
        hex_digit['a' + c] = hex_digit['A' + c] = (unsigned char)(10 + c);
    }
#ifdef HAVE_SODIUM
    sodium_ok = sodium_init() >= 0 && crypto_aead_aes256gcm_is_available();
#endif
    if (PyType_Ready(&KeyType) < 0 || PyType_Ready(&OpenerType) < 0) {
        return NULL;
    }
    orjson = PyImport_ImportModule("orjson");
    if (orjson == NULL) {
        return NULL;
    }
    loads = PyObject_GetAttrString(orjson, "loads");
    Py_DECREF(orjson);
    mark = PyUnicode_InternFromString("$eventlane");
    if (loads == NULL || mark == NULL) {
        return NULL;
    }
    module = PyModule_Create(&seal_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObject(module, "SODIUM", PyBool_FromLong(sodium_ok)) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&OpenerType);
    if (PyModule_AddObject(module, "Opener", (PyObject *)&OpenerType) < 0) {
        Py_DECREF(&OpenerType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
