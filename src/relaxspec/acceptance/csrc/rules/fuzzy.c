/* The rule fuzzy's math in C (fuzzy.py: native_test; rule.h declares its functions). */

static inline float rule_test(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                              const double *prm, float in) {
    (void)z; (void)zq; (void)x; (void)in;
    return jsd(p, q, V) < (float)prm[0] ? 1.0f : 0.0f;
}

static int rule_residual(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                         const double *prm, float *out) {
    (void)q; (void)z; (void)zq; (void)x; (void)prm;
    memcpy(out, p, V * sizeof(float));
    return 0;
}
