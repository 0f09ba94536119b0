/* fuzz_safetensors.c: libFuzzer target for the safetensors reader: header length, JSON
 * header, __metadata__ strides, down to the bytes each tensor would map or scatter. */
#include "fuzz_common.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_describe(data, size, fi_safetensors_describe);
}
