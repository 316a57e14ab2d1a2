/* libFuzzer target: the safetensors header parser. */
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fz_safetensors_one(data, size);
	return 0;
}
