/* fuzz_pt.c: libFuzzer target for the .pt reader: zip records, CRC-32, the restricted
 * pickle interpreter and storage lookup, down to the bytes each tensor would map. */
#include "fuzz_common.h"
#include "ptzip.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_describe(data, size, fi_ptzip_describe);
}
