/* fp4_layout.c: the NVFP4/MXFP4 helpers that move or decode bytes rather than quantize:
 * dequantization to float32, block-scale interleaving into the 128x4 layout, and the row
 * shuffle of TRT-LLM's weight layout. */
#include "flashinfer_kernels.h"

#include <string.h>

#include "fi_numeric.h"

int fi_fp4_dequantize_cpu(const fi_fp4_dequantize_params *p)
{
    int64_t m = p->m, k = p->k, blocks = k / p->sf_vec_size;
    float gs = p->global_scale ? *p->global_scale : 1.0f;
    for (int64_t r = 0; r < m; r++) {
        const uint8_t *row = p->x_q + r * (k / 2);
        float *out = p->out + r * k;
        for (int64_t c = 0; c < blocks; c++) {
            uint8_t code = p->sf[fi_sf_offset(r, c, blocks, p->sf_layout)];
            float sf = p->sf_ue8m0 ? fi_e8m0fnu_to_f32(code) : fi_e4m3fn_to_f32(code);
            for (int64_t e = c * p->sf_vec_size; e < (c + 1) * p->sf_vec_size; e += 2) {
                out[e] = fi_e2m1_to_f32(row[e / 2] & 15) * sf * gs;
                out[e + 1] = fi_e2m1_to_f32(row[e / 2] >> 4) * sf * gs;
            }
        }
    }
    return 0;
}

void fi_sf_interleave_cpu(const void *src, int64_t batches, int64_t rows, int64_t cols,
                          size_t esize, void *dst)
{
    int64_t per_batch = fi_sf_bytes(rows, cols, FI_SF_LAYOUT_128X4);
    memset(dst, 0, (size_t)(batches * per_batch) * esize);
    for (int64_t b = 0; b < batches; b++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                int64_t to = b * per_batch + fi_sf_offset(r, c, cols, FI_SF_LAYOUT_128X4);
                memcpy((char *)dst + to * (int64_t)esize,
                       (const char *)src + ((b * rows + r) * cols + c) * (int64_t)esize, esize);
            }
}

/* Within each block of `block` rows, row i goes to (i % (block / 8)) * 8 + i / (block / 8):
 * TRT-LLM's srcToDstBlk16RowMap (block 16) and srcToDstBlk32RowMap (block 32). */
void fi_shuffle_rows_cpu(const uint8_t *src, int64_t rows, int64_t row_bytes, int block,
                         uint8_t *dst)
{
    int64_t per8 = block / 8;
    for (int64_t old = 0; old < rows; old++) {
        int64_t i = old % block;
        int64_t to = old - i + (i % per8) * 8 + i / per8;
        memcpy(dst + to * row_bytes, src + old * row_bytes, (size_t)row_bytes);
    }
}
