/* fuzz_safetensors.c: libFuzzer target for the safetensors reader: header length, JSON
 * header, __metadata__ strides, down to the bytes each tensor would map or scatter. */
#include "fuzz_common.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fi_loaded_tensor *ts;
    size_t n;
    if (fi_safetensors_describe(FUZZ_PATH, data, size, &ts, &n) < 0) {
        PyErr_Clear();
        return 0;
    }
    check_descriptions(data, size, ts, n);
    fi_loaded_tensors_free(ts, n);
    return 0;
}
