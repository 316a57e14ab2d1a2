/*
 * Block-scaled FP8: the serving transform fp8_e4m3_block128 (DeepSeek-V3's
 * checkpoint format), applied by the publisher to a layout's quantized
 * tensors, once per version, from the exported BF16 bytes.
 *
 * A 2-D BF16 tensor of rows x cols is cut into blocks of 128 x 128 (the last
 * ones partial). Per block b, with amax the largest |x| in it (as FP32):
 *
 *   scale_inv[b] = amax / 448 in FP32 (IEEE division, round to nearest
 *                  even); 1 for a block of zeros;
 *   q[i]         = x[i] / scale_inv[b] in FP32 (round to nearest even),
 *                  then to float8_e4m3fn rounding to nearest even (ties to
 *                  the even mantissa), saturated to +-448; signs kept
 *                  (-0 stays -0).
 *
 * The engine dequantizes q * scale_inv. The scales are a row-major FP32
 * tensor of ceil(rows/128) x ceil(cols/128), served as "<name>_scale_inv".
 * Subnormal FP32 arithmetic is IEEE (no flush to zero): this file must not
 * be built with -ffast-math. A reference written apart from this one (the
 * tests' numpy quantizer) agrees bit for bit.
 */
#ifndef PROTO_FP8_H
#define PROTO_FP8_H

#include <stddef.h>
#include <stdint.h>

#define PROTO_FP8_BLOCK 128u
#define PROTO_FP8_MAX 448.0f
#define PROTO_FP8_TRANSFORM "fp8_e4m3_block128"

/* ceil(n / 128). */
static inline uint64_t proto_fp8_blocks(uint64_t n)
{
	return (n + PROTO_FP8_BLOCK - 1) / PROTO_FP8_BLOCK;
}

/* FP32 to float8_e4m3fn, round to nearest even, saturated to +-448 (a NaN
 * gives 0x7f). */
uint8_t proto_fp8_from_f32(float f);
/* float8_e4m3fn to FP32 (exact; 0x7f and 0xff are NaN). */
float proto_fp8_to_f32(uint8_t b);

/* "NaN", "+inf" or "-inf" for a non-finite BF16 value (2 bytes), else
 * "finite". */
const char *proto_fp8_nonfinite_name(const uint8_t *bf16);

/*
 * Quantizes block row br (rows [128 br, 128 br + 128) clipped to rows) of a
 * rows x cols BF16 tensor: src points at the tensor's first element
 * (little-endian BF16, row-major), q at the tensor's FP8 output (rows x
 * cols bytes), scale at its scale tensor (ceil(rows/128) x ceil(cols/128)
 * FP32). Block rows are independent: threads may take different ones.
 * Returns 0, or -EDOM when the block row holds a NaN or an infinity (*bad
 * then gets the element's row-major index; q and scale are left partly
 * written).
 */
int proto_fp8_quantize_rows(const uint8_t *src, uint64_t rows, uint64_t cols, uint64_t br,
			    uint8_t *q, float *scale, uint64_t *bad);

#endif
