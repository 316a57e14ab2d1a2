/* Block-scaled FP8 (fp8_e4m3_block128): the quantizer and the FP8 format. */
#if defined(__GNUC__) && !defined(__clang__)
/* The element loops are written branch-free to be vectorized; -O2 in this
 * compiler does not vectorize. On x86-64 they are built for AVX-512 and
 * AVX2 too, picked at load time by the CPU (the division is the cost:
 * wider vectors divide more at once). */
#pragma GCC optimize("tree-vectorize")
#if defined(__x86_64__)
#define FP8_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef FP8_CLONES
#define FP8_CLONES
#endif
#include "proto/fp8.h"

#include <errno.h>
#include <math.h>
#include <string.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "BF16 and FP32 are read in place");

static inline uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static inline float bits_f32(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/*
 * |f| below 2^-6 (FP8's smallest normal) is a multiple of 2^-9 in FP8: f *
 * 2^9 is exact in FP32 and rounds to an integer n in 0..8 (adding and
 * taking away 1.5 * 2^23 rounds to nearest even), and n is the FP8 code
 * (8 is the smallest normal, 0x08). Above, the FP32 exponent and the top 3
 * mantissa bits round to nearest even as one field (a carry moves into the
 * exponent), rebased from FP32's bias 127 to FP8's 7. From 448 up (and for
 * what rounds past it) the code saturates to 0x7e.
 */
static inline uint8_t e4m3_code(float a)
{
	uint32_t u = f32_bits(a);
	uint32_t small = -(uint32_t)(a < 0.015625f); /* all ones below 2^-6 */
	/* a itself only where it is small: the conversion below stays in range */
	float s = (bits_f32(u & small) * 512.0f + 12582912.0f) - 12582912.0f;
	uint32_t sub = (uint32_t)s;
	uint32_t nor = ((u + 0x7ffffu + ((u >> 20) & 1u)) >> 20) - (120u << 3);
	uint32_t c = (sub & small) | (nor & ~small);
	uint32_t sat = -(uint32_t)(a >= PROTO_FP8_MAX) | -(uint32_t)(c > 0x7eu);
	return (uint8_t)((c & ~sat) | (0x7eu & sat));
}

uint8_t proto_fp8_from_f32(float f)
{
	if (isnan(f))
		return 0x7f;
	return (uint8_t)((f32_bits(f) >> 24 & 0x80u) | e4m3_code(fabsf(f)));
}

float proto_fp8_to_f32(uint8_t b)
{
	uint32_t e = (b >> 3) & 0xfu, m = b & 7u;
	float v;

	if ((b & 0x7fu) == 0x7fu)
		return NAN;
	v = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(m | 8u), (int)e - 10);
	return (b & 0x80u) ? -v : v;
}

const char *proto_fp8_nonfinite_name(const uint8_t *bf16)
{
	uint16_t b = (uint16_t)(bf16[0] | bf16[1] << 8);

	if ((b & 0x7f80u) != 0x7f80u)
		return "finite";
	if (b & 0x7fu)
		return "NaN";
	return b & 0x8000u ? "-inf" : "+inf";
}

/* The largest |x| bits of n BF16 values (as 15-bit magnitudes, which order
 * as the values do; 0x7f80 and up is an infinity or a NaN). */
static inline uint16_t amax_bits(const uint16_t *x, uint64_t n)
{
	uint16_t m = 0;

	for (uint64_t k = 0; k < n; k++) {
		uint16_t v = x[k] & 0x7fffu;
		m = v > m ? v : m;
	}
	return m;
}

/* n values of one block row's block: x / s to FP8, signs kept. */
static inline void quantize_run(const uint16_t *x, uint64_t n, float s, uint8_t *q)
{
	for (uint64_t k = 0; k < n; k++) {
		float a = bits_f32((uint32_t)(x[k] & 0x7fffu) << 16) / s;
		q[k] = (uint8_t)((x[k] >> 8 & 0x80u) | e4m3_code(a));
	}
}

/* The scales of block row [r0, r1) and its values (proto_fp8_quantize_rows,
 * once the rows are known finite): one function per instruction set, the
 * loops inlined into each. */
FP8_CLONES static void block_row(const uint16_t *x, uint64_t r0, uint64_t r1, uint64_t cols,
				 uint8_t *q, float *srow)
{
	uint64_t nbc = proto_fp8_blocks(cols);

	for (uint64_t r = r0; r < r1; r++)
		for (uint64_t b = 0; b < nbc; b++) {
			uint64_t c0 = b * PROTO_FP8_BLOCK;
			uint64_t n = cols - c0 < PROTO_FP8_BLOCK ? cols - c0 : PROTO_FP8_BLOCK;
			quantize_run(x + r * cols + c0, n, srow[b], q + r * cols + c0);
		}
}

/* The largest magnitude of each block of block row [r0, r1), 64 blocks
 * from block g on, into m. */
FP8_CLONES static void block_amax(const uint16_t *x, uint64_t r0, uint64_t r1, uint64_t cols,
				  uint64_t g, uint64_t ng, uint16_t *m)
{
	for (uint64_t r = r0; r < r1; r++) {
		const uint16_t *row = x + r * cols;
		for (uint64_t b = 0; b < ng; b++) {
			uint64_t c0 = (g + b) * PROTO_FP8_BLOCK;
			uint64_t n = cols - c0 < PROTO_FP8_BLOCK ? cols - c0 : PROTO_FP8_BLOCK;
			uint16_t v = amax_bits(row + c0, n);
			m[b] = v > m[b] ? v : m[b];
		}
	}
}

int proto_fp8_quantize_rows(const uint8_t *src, uint64_t rows, uint64_t cols, uint64_t br,
			    uint8_t *q, float *scale, uint64_t *bad)
{
	const uint16_t *x = (const uint16_t *)(const void *)src;
	uint64_t r0 = br * PROTO_FP8_BLOCK, r1 = r0 + PROTO_FP8_BLOCK;
	uint64_t nbc = proto_fp8_blocks(cols);
	uint16_t m[64];
	float *srow = scale + br * nbc;

	if (r1 > rows)
		r1 = rows;
	/* Block columns in groups of 64, so the maxima live on the stack. */
	for (uint64_t g = 0; g < nbc; g += 64) {
		uint64_t ng = nbc - g < 64 ? nbc - g : 64;
		memset(m, 0, sizeof(m));
		block_amax(x, r0, r1, cols, g, ng, m);
		for (uint64_t b = 0; b < ng; b++) {
			if (m[b] >= 0x7f80u) {
				uint64_t c0 = (g + b) * PROTO_FP8_BLOCK;
				for (uint64_t r = r0; r < r1; r++)
					for (uint64_t c = c0; c < cols && c < c0 + PROTO_FP8_BLOCK; c++)
						if ((x[r * cols + c] & 0x7fffu) >= 0x7f80u) {
							*bad = r * cols + c;
							return -EDOM;
						}
			}
			srow[g + b] = m[b] == 0 ? 1.0f
						: bits_f32((uint32_t)m[b] << 16) / PROTO_FP8_MAX;
		}
	}
	block_row(x, r0, r1, cols, q, srow);
	return 0;
}
