/* fuzz_common.h: what the libFuzzer targets over the tensor-file readers share: an
 * embedded interpreter without torch, and the oracle for accepted tensor descriptions. */
#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdio.h>
#include <stdlib.h>

#include "crc32.h"
#include "tensorbytes.h"

#define FUZZ_PATH "fuzz-input"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The readers report errors as Python exceptions and keep keys as str objects, so an
 * interpreter runs underneath (torch is never imported: the readers do not need it).
 * Python's objects come from malloc so LeakSanitizer can follow pointers through them
 * (it cannot through pymalloc's arenas, and would report the interpreter as leaked). */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("PYTHONMALLOC", "malloc", 1);
    Py_InitializeEx(0);
    fi_crc32_init();
    return 0;
}

static void fuzz_fail(const char *what, size_t k)
{
    fprintf(stderr, "fuzz oracle: tensor %zu: %s\n", k, what);
    abort();
}

/* A description the reader accepted may read only bytes of the input: its extent must
 * lie inside it (every byte is read, so ASan checks the whole range too), and restoring
 * strides must write only inside the buffer of the size the reader computed. */
static void check_descriptions(const uint8_t *data, size_t size, const fi_loaded_tensor *ts,
                               size_t n)
{
    volatile uint8_t sum = 0;
    for (size_t k = 0; k < n; k++) {
        fi_extent e;
        if (fi_tensor_extent(FUZZ_PATH, &ts[k], &e) < 0) {
            PyErr_Clear();
            continue;
        }
        if (e.offset > size || e.nbytes > size - e.offset)
            fuzz_fail("extent lies outside the input", k);
        for (uint64_t i = 0; i < e.nbytes; i++)
            sum += data[e.offset + i];
        if (e.restore_bytes) {
            char *dst = malloc(e.restore_bytes);
            if (!dst)
                fuzz_fail("restore buffer too large to allocate", k);
            fi_scatter_to_strides(dst, (const char *)data + e.offset, &ts[k]);
            free(dst);
        }
    }
}

/* The body of a target over a reader's describe half (fi_ptzip_describe, ...). */
typedef int describe_fn(const char *path, const uint8_t *data, size_t size, fi_loaded_tensor **out,
                        size_t *count);

static int fuzz_describe(const uint8_t *data, size_t size, describe_fn *describe)
{
    fi_loaded_tensor *ts;
    size_t n;
    if (describe(FUZZ_PATH, data, size, &ts, &n) < 0) {
        PyErr_Clear();
        return 0;
    }
    check_descriptions(data, size, ts, n);
    fi_loaded_tensors_free(ts, n);
    return 0;
}

#endif
