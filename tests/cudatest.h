/* What the CUDA tests share: skipping, with the reason, where no device is. */
#ifndef TESTS_CUDATEST_H
#define TESTS_CUDATEST_H

#ifdef TESSERA_CUDA
#include "node/store/store_cuda.h"

/* Skips the calling cmocka test, saying why, when no CUDA device is visible. */
static inline void tu_skip_without_gpu(void)
{
	char why[256];
	int ndev = 0;

	if (node_cuda_probe(&ndev, why, sizeof(why)) != 0) {
		print_message("skipped: %s\n", why);
		skip();
	}
}
#endif

#endif
