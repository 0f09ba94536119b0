/* fuzz_pickle.c: libFuzzer target for the restricted pickle interpreter on its own (in a
 * .pt file the CRC-32 of data.pkl stops most mutations before the interpreter). */
#include <string.h>

#include "fuzz_common.h"
#include "pickle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fi_loaded_tensor *ts;
    size_t n;
    if (fi_pickle_read_tensors(data, size, FUZZ_PATH, &ts, &n) < 0) {
        PyErr_Clear();
        return 0;
    }
    for (size_t k = 0; k < n; k++) {
        const uint8_t *key = (const uint8_t *)ts[k].storage_key;
        if (key < data || ts[k].storage_key_len > size || key > data + size - ts[k].storage_key_len)
            fuzz_fail("storage key lies outside the input", k);
    }
    fi_loaded_tensors_free(ts, n);
    return 0;
}
