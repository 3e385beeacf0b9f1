/*
 * framework.codec._seal: opening an event's enc4 cipher object in one C call.
 *
 * An optional speedup of framework/codec/privacy.py's FieldCipher.open, which stays the
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
 *
 * open4 reads data["$eventlane"] = ["enc4", subject, version, fields, topic, hex text]
 * (privacy.py documents the format) and, while the clock is before fresh_until, finds the
 * subject's key among those added (the last one used first), checks the bound topic against
 * ``topics`` (an empty frozenset: any), builds the associated data
 * "enc4\0topic\0aggregate id\0subject\0event id\0fields" (UTF-8), decodes the hex text
 * (12-byte nonce, cipher text, 16-byte tag), decrypts and authenticates it, parses the plain
 * text with orjson.loads and, when that is a dict, deletes data["$eventlane"] and updates data
 * with it. The GIL is held throughout: a context is never used by two threads at once.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    .tp_name = "framework.codec._seal.Key",
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

/* binascii.unhexlify's result for an ASCII text: 0, or -1 for what it refuses. */
static int
unhex(const unsigned char *text, Py_ssize_t n, unsigned char *out)
{
    Py_ssize_t i;
    unsigned char bad = 0;
    for (i = 0; i < n; i++) {
        unsigned char hi = hex_digit[text[2 * i]], lo = hex_digit[text[2 * i + 1]];
        bad |= hi | lo;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return (bad & 0xf0) ? -1 : 0;
}

/* Append the UTF-8 of str ``s`` to the associated data being built: 0, or -1 when s has no
 * UTF-8 form (lone surrogates) or the buffer is too small. */
static int
put(unsigned char *aad, Py_ssize_t *at, Py_ssize_t room, PyObject *s)
{
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(s, &n);
    if (utf8 == NULL) {
        PyErr_Clear();
        return -1;
    }
    if (*at + n + 1 > room) {
        return -1;
    }
    memcpy(aad + *at, utf8, (size_t)n);
    *at += n;
    aad[(*at)++] = 0;
    return 0;
}

typedef struct {
    PyObject_HEAD
    PyObject *keys;         /* dict: (subject, version) -> Key */
    PyObject *last_subject; /* the last key used, or NULL */
    PyObject *last_version;
    Key *last_key;
    double fresh_until;
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
opener_dealloc(Opener *self)
{
    opener_forget_last(self);
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
    opener_forget_last(self);
    PyDict_Clear(self->keys);
    Py_RETURN_NONE;
}

/* The Key of (subject, version), borrowed: the last one used when it names them, else the
 * one added for them (then remembered as the last); NULL when none was (no exception). */
static Key *
find_key(Opener *self, PyObject *subject, PyObject *version)
{
    PyObject *found, *pair;
    if (self->last_key != NULL && PyUnicode_Compare(self->last_subject, subject) == 0) {
        int same = PyObject_RichCompareBool(self->last_version, version, Py_EQ);
        if (same < 0) {
            PyErr_Clear();
        } else if (same) {
            return self->last_key;
        }
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
    self->last_subject = subject;
    self->last_version = version;
    self->last_key = (Key *)found;
    return (Key *)found;
}

static PyObject *
open4(Opener *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *data, *event_id, *aggregate_id, *topics;
    PyObject *sealed, *subject, *version, *fields, *bound, *text, *plain = NULL, *values = NULL;
    PyObject *result = Py_False;
    PyObject **item;
    Key *key;
    unsigned char stack[STACK_BYTES], *buf = stack, *aad, *blob;
    Py_ssize_t text_length, blob_length, aad_length = 0, aad_room, need;

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
    if (!PyUnicode_CheckExact(item[0]) || PyUnicode_CompareWithASCIIString(item[0], "enc4") != 0) {
        Py_RETURN_FALSE;
    }
    subject = item[1], version = item[2], fields = item[3], bound = item[4], text = item[5];
    if (!PyUnicode_CheckExact(subject) || !PyLong_CheckExact(version) ||
        !PyUnicode_CheckExact(fields) || !PyUnicode_CheckExact(bound) ||
        !PyUnicode_CheckExact(text) || !PyUnicode_IS_ASCII(text)) {
        Py_RETURN_FALSE;
    }
    if (PySet_GET_SIZE(topics) > 0) {
        int in = PySet_Contains(topics, bound);
        if (in != 1) {
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
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

    /* one buffer: the associated data, then the decoded blob */
    aad_room = 5 + 1;
    {
        PyObject *parts[5] = {bound, aggregate_id, subject, event_id, fields};
        int i;
        for (i = 0; i < 5; i++) {
            Py_ssize_t size;
            if (PyUnicode_AsUTF8AndSize(parts[i], &size) == NULL) {
                PyErr_Clear();
                Py_RETURN_FALSE;
            }
            aad_room += size + 1;
        }
    }
    if (aad_room > INT_MAX) {
        Py_RETURN_FALSE; /* more than EVP_DecryptUpdate takes at once */
    }
    need = aad_room + blob_length;
    if (need > STACK_BYTES) {
        buf = PyMem_Malloc((size_t)need);
        if (buf == NULL) {
            return PyErr_NoMemory();
        }
    }
    aad = buf;
    memcpy(aad, "enc4", 5); /* with its NUL */
    aad_length = 5;
    if (put(aad, &aad_length, aad_room, bound) < 0 ||
        put(aad, &aad_length, aad_room, aggregate_id) < 0 ||
        put(aad, &aad_length, aad_room, subject) < 0 ||
        put(aad, &aad_length, aad_room, event_id) < 0 ||
        put(aad, &aad_length, aad_room, fields) < 0) {
        goto done;
    }
    aad_length -= 1; /* no NUL after the field names */
    blob = buf + aad_room;
    if (unhex(PyUnicode_1BYTE_DATA(text), blob_length, blob) < 0) {
        goto done;
    }

    plain = PyBytes_FromStringAndSize(NULL, blob_length - NONCE - TAG);
    if (plain == NULL) {
        result = NULL;
        goto done;
    }
    if (key_open(key, blob, blob_length, aad, aad_length,
                 (unsigned char *)PyBytes_AS_STRING(plain)) < 0) {
        goto done; /* a tag that fails: the Python path says so */
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
    .tp_name = "framework.codec._seal.Opener",
    .tp_basicsize = sizeof(Opener),
    .tp_dealloc = (destructor)opener_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Opener(engine=None): the AES-GCM keys one FieldCipher has opened, and open4.",
    .tp_new = opener_new,
    .tp_methods = opener_methods,
    .tp_members = opener_members,
    .tp_getset = opener_getset,
};

static PyMethodDef seal_methods[] = {
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef seal_module = {
    PyModuleDef_HEAD_INIT, "framework.codec._seal",
    "Opening enc4 cipher objects in one C call (optional speedup of "
    "framework.codec.privacy).",
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
