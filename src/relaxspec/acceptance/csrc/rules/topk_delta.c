/* The rule topk-delta's math in C (topk_delta.py: native_test; rule.h declares its functions). */

static inline float rule_test(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                              const double *prm, float in) {
    (void)z; (void)zq; (void)in;
    return top_candidate_test(p, q, V, x, prm[0], 1.0f, -(float)prm[1]);
}
