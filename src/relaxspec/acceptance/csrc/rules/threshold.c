/* The rule threshold's math in C (threshold.py: native_test; rule.h declares its functions). */

static inline float rule_test(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                              const double *prm, float in) {
    (void)q; (void)z; (void)zq; (void)V; (void)in;
    if (p[x] >= (float)prm[0]) return 1.0f;
    if (!(p[x] > 0.0f)) return 0.0f;
    const double acc = prm[1] > 1e-9 ? prm[1] : 1e-9;
    const float r = p[x] / (float)acc;
    return r >= 1.0f ? 1.0f : nextafterf(r, 2.0f);
}

static int rule_residual(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                         const double *prm, float *out) {
    (void)q; (void)z; (void)zq; (void)prm;
    memcpy(out, p, V * sizeof(float));
    out[x] = 0.0f;
    return 0;
}
