/* device_chunks.c: the compact capture's device path (docs/flight-recorder.md, "Chunk dedup
 * on the device"). The CUDA one runs kernels/cuda/chunk_hash.cu on the side stream the ring
 * already copies on (flashinfer_native/staging.py), ordered after the stream that produced
 * the tensor; the test one takes CPU tensors through the same steps, so that the dedup
 * logic of compact.c is tested where no GPU is. */
#include "device_chunks.h"

#include <string.h>

#include "record_mode.h"
#include "tensor.h"

/* The test device: 0 off, 1 on, 2 on and failing its first hash as a device would (then
 * it takes nothing, as the CUDA one after a failure). */
static int test_on, test_broken;

static int test_takes(const fi_chunk_device *d, int device_type)
{
    (void)d;
    return device_type == FI_DEVICE_CPU && !test_broken;
}

static int test_hash(fi_chunk_device *d, const fi_tensor *t, const int64_t *offset,
                     const int64_t *length, int64_t n, const uint32_t *key, fi_chunk_hash *out)
{
    if (test_on == 2) {
        test_broken = 1;
        d->failures++;
        PyErr_SetString(PyExc_RuntimeError,
                        "hashing chunks on the test device failed (as asked); the flight "
                        "recorder copies tensors to the host from now on");
        return -1;
    }
    for (int64_t i = 0; i < n; i++)
        fi_chunk_hash_cpu((const char *)t->data + offset[i], (size_t)length[i], key, &out[i]);
    return 0;
}

static int test_copy(fi_chunk_device *d, const fi_tensor *t, const int64_t *offset,
                     const int64_t *length, int64_t n, void *dst)
{
    (void)d;
    char *out = dst;
    for (int64_t i = 0; i < n; i++) {
        memcpy(out, (const char *)t->data + offset[i], (size_t)length[i]);
        out += length[i];
    }
    return 0;
}

static fi_chunk_device test_device = {test_takes, test_hash, test_copy, 0, 0, 0};

#ifdef FI_WITH_CUDA
static int cuda_broken;

static int cuda_takes(const fi_chunk_device *d, int device_type)
{
    (void)d;
    return device_type == FI_DEVICE_CUDA && !cuda_broken;
}

/* The producing (current) stream of device and the ring's side stream, as pointers. */
static int streams(int device, void **producer, void **side)
{
    PyObject *staging = PyImport_ImportModule("flashinfer_native.staging");
    PyObject *pair = staging ? PyObject_CallMethod(staging, "streams", "i", device) : NULL;
    Py_XDECREF(staging);
    if (!pair)
        return -1;
    int ok = PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2;
    if (ok) {
        *producer = PyLong_AsVoidPtr(PyTuple_GET_ITEM(pair, 0));
        *side = PyLong_AsVoidPtr(PyTuple_GET_ITEM(pair, 1));
        ok = !PyErr_Occurred();
    } else {
        PyErr_SetString(PyExc_TypeError, "staging.streams() did not return two stream handles");
    }
    Py_DECREF(pair);
    return ok ? 0 : -1;
}

static fi_chunk_device cuda_device;

/* A failed device call: the host path from now on (the capture is taken again there). */
static int device_failed(const fi_tensor *t, const char *what)
{
    cuda_broken = 1;
    cuda_device.failures++;
    PyErr_Format(PyExc_RuntimeError,
                 "%s on cuda:%d failed (%s); the flight recorder copies CUDA tensors to the host "
                 "from now on",
                 what, t->device_index, fi_cuda_last_error());
    return -1;
}

/* One device call for t on its streams, without the GIL: the hashes into out, or (out NULL)
 * the chunks' bytes into dst. */
static int on_device(const fi_tensor *t, const int64_t *offset, const int64_t *length, int64_t n,
                     const uint32_t *key, fi_chunk_hash *out, void *dst)
{
    void *producer, *side;
    if (streams(t->device_index, &producer, &side) < 0)
        return -1;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = out ? fi_chunk_hash_device(t->data, offset, length, n, key, out, t->device_index, producer,
                                    side)
             : fi_chunk_copy_device(dst, t->data, offset, length, n, t->device_index, side);
    Py_END_ALLOW_THREADS
    return rc == 0 ? 0 : device_failed(t, out ? "hashing chunks" : "copying chunks to the host");
}

static int cuda_hash(fi_chunk_device *d, const fi_tensor *t, const int64_t *offset,
                     const int64_t *length, int64_t n, const uint32_t *key, fi_chunk_hash *out)
{
    (void)d;
    return on_device(t, offset, length, n, key, out, NULL);
}

static int cuda_copy(fi_chunk_device *d, const fi_tensor *t, const int64_t *offset,
                     const int64_t *length, int64_t n, void *dst)
{
    (void)d;
    return on_device(t, offset, length, n, NULL, NULL, dst);
}

static fi_chunk_device cuda_device = {cuda_takes, cuda_hash, cuda_copy, 0, 0, 0};
#endif

int fi_device_chunks_gave_up(fi_recorder *rec, const fi_chunk_device *dev, unsigned before)
{
    if (!dev || dev->failures == before || !PyErr_Occurred())
        return 0;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *text = value ? PyObject_Str(value) : NULL;
    const char *why = text ? PyUnicode_AsUTF8(text) : NULL;
    PyErr_Clear();
    fi_dump_log(rec, "[flashinfer] WARNING: %s", why ? why : "a device call failed");
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return 1;
}

fi_chunk_device *fi_device_chunks(void)
{
    if (test_on)
        return &test_device;
#ifdef FI_WITH_CUDA
    return &cuda_device;
#else
    return NULL;
#endif
}

PyDoc_STRVAR(device_chunks_doc,
             "_device_chunks(test=None) -> dict\n\n"
             "The compact capture's device path: which one a recorded call uses ('cuda', 'test' "
             "or None), the bytes it hashed where they live and copied to the host so far, and "
             "its failed device calls (each sends the capture to the host for good). "
             "test=True routes CPU tensors through the same steps (for tests), 'fail' does so "
             "with a first hash that fails as a device's would, False ends that.");

static PyObject *device_chunks_py(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *kwlist[] = {"test", NULL};
    PyObject *test = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:_device_chunks", kwlist, &test))
        return NULL;
    if (test != Py_None) {
        int on = PyUnicode_Check(test) && PyUnicode_CompareWithASCIIString(test, "fail") == 0
                     ? 2
                     : PyObject_IsTrue(test);
        if (on < 0)
            return NULL;
        test_on = on;
        test_broken = 0;
    }
    fi_chunk_device *d = fi_device_chunks();
    const char *name = d == &test_device ? "test" : d ? "cuda" : NULL;
    return Py_BuildValue("{s:s,s:K,s:K,s:I}", "device", name, "hashed",
                         (unsigned long long)(d ? d->hashed : 0), "copied",
                         (unsigned long long)(d ? d->copied : 0), "failures", d ? d->failures : 0u);
}

PyDoc_STRVAR(chunk_hash_device_doc,
             "_chunk_hash_device(tensor, key, chunk) -> list of bytes\n\n"
             "The 32-byte chunk hashes of a contiguous CUDA tensor's bytes cut into pieces of "
             "chunk bytes, under key (the bytes of FI_CHUNK_KEY_WORDS words), computed by the "
             "device path's kernel: for tests against _chunk_hash.");

static PyObject *chunk_hash_device_py(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *tensor;
    Py_buffer key;
    Py_ssize_t chunk;
    if (!PyArg_ParseTuple(args, "Oy*n:_chunk_hash_device", &tensor, &key, &chunk))
        return NULL;
    PyObject *result = NULL;
    fi_tensor t;
    if ((size_t)key.len != FI_CHUNK_KEY_WORDS * sizeof(uint32_t) || chunk < 1 ||
        (size_t)chunk > FI_CHUNK_MAX) {
        PyErr_Format(PyExc_ValueError,
                     "_chunk_hash_device: a key of %zu bytes and chunks of 1 to %zu bytes",
                     FI_CHUNK_KEY_WORDS * sizeof(uint32_t), FI_CHUNK_MAX);
    } else if (fi_tensor_from_py(tensor, &t) == 0) {
#ifdef FI_WITH_CUDA
        int64_t bytes = fi_tensor_numel(&t) * (int64_t)fi_dtype_size(t.dtype);
        int64_t n = (bytes + chunk - 1) / chunk;
        int64_t *ol = PyMem_Malloc((size_t)(n ? 2 * n : 1) * sizeof(int64_t));
        fi_chunk_hash *h = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(*h));
        void *producer, *side;
        if (t.device_type != FI_DEVICE_CUDA || !fi_tensor_is_contiguous(&t)) {
            PyErr_SetString(PyExc_ValueError,
                            "_chunk_hash_device: the tensor is not a contiguous CUDA tensor");
        } else if (!ol || !h) {
            PyErr_NoMemory();
        } else if (streams(t.device_index, &producer, &side) == 0) {
            for (int64_t i = 0; i < n; i++) {
                ol[i] = i * chunk;
                ol[n + i] = bytes - i * chunk < chunk ? bytes - i * chunk : chunk;
            }
            int rc;
            Py_BEGIN_ALLOW_THREADS
            rc = fi_chunk_hash_device(t.data, ol, ol + n, n, key.buf, h, t.device_index, producer,
                                      side);
            Py_END_ALLOW_THREADS
            if (rc != 0)
                PyErr_Format(PyExc_RuntimeError, "%s", fi_cuda_last_error());
            else if ((result = PyList_New(n)))
                for (int64_t i = 0; i < n; i++) {
                    uint8_t le[32]; /* _chunk_hash's bytes: each word little-endian */
                    for (int w = 0; w < 4; w++)
                        for (int b = 0; b < 8; b++)
                            le[8 * w + b] = (uint8_t)(h[i].h[w] >> (8 * b));
                    PyList_SET_ITEM(result, i, PyBytes_FromStringAndSize((const char *)le, 32));
                }
        }
        PyMem_Free(ol);
        PyMem_Free(h);
#else
        PyErr_SetString(PyExc_RuntimeError,
                        "_chunk_hash_device: this build has no CUDA kernels (built without nvcc)");
#endif
    }
    PyBuffer_Release(&key);
    return result;
}

static PyMethodDef device_chunks_methods[] = {
    {"_chunk_hash_device", chunk_hash_device_py, METH_VARARGS, chunk_hash_device_doc},
    {"_device_chunks", (PyCFunction)(void (*)(void))device_chunks_py, METH_VARARGS | METH_KEYWORDS,
     device_chunks_doc},
    {NULL, NULL, 0, NULL},
};

int fi_device_chunks_exec(PyObject *module)
{
    return PyModule_AddFunctions(module, device_chunks_methods);
}
