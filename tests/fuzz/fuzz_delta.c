/* libFuzzer target: the delta parser, stream decoders and apply. */
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* As is (the header hash guards the tables), then fixed up so that
	 * mutations reach the decoders and the in-place apply. */
	fz_delta_one(data, size, false, NULL, NULL);
	fz_delta_one(data, size, true, NULL, NULL);
	return 0;
}
