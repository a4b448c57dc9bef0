/* A scalar reference for the int4 kernel's int8-activation path (tests/models/test_int4_block.py). */
#ifndef RELAXSPEC_TEST_INT4_Q8_REFERENCE_H
#define RELAXSPEC_TEST_INT4_Q8_REFERENCE_H
#include <stdint.h>

void int4_q8_reference(const float* x, int64_t M, int64_t in, const uint8_t* codes, const int32_t* sz, float* y,
                       int64_t out);

#endif
