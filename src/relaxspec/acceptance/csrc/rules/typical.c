/* The rule typical's math in C (typical.py: native_test; rule.h declares its functions). */

static inline float rule_test(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                              const double *prm, float in) {
    (void)q; (void)z; (void)zq; (void)in;
    float threshold = (float)prm[1] * expf((float)neg_entropy(p, V));
    const float epsilon = (float)prm[0];
    threshold = threshold > epsilon ? epsilon : threshold;
    return p[x] > threshold ? 1.0f : 0.0f;
}
