/* The host's fold of a buffer, the reference for node_cuda_fold. */
#include "node/store/store_cuda.h"

#include <string.h>

uint64_t node_host_fold(const void *buf, size_t len)
{
	const uint8_t *p = buf;
	uint64_t acc = 0;

	for (size_t i = 0; i * 8 < len; i++) {
		uint64_t w = 0;
		memcpy(&w, p + i * 8, len - i * 8 < 8 ? len - i * 8 : 8);
		acc ^= w * (2 * (uint64_t)i + 1);
	}
	return acc;
}
