/* fuzz_pt.c: libFuzzer target for the .pt reader: zip records, CRC-32, the restricted
 * pickle interpreter and storage lookup, down to the bytes each tensor would map. */
#include "fuzz_common.h"
#include "ptzip.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fi_loaded_tensor *ts;
    size_t n;
    if (fi_ptzip_describe(FUZZ_PATH, data, size, &ts, &n) < 0) {
        PyErr_Clear();
        return 0;
    }
    check_descriptions(data, size, ts, n);
    fi_loaded_tensors_free(ts, n);
    return 0;
}
