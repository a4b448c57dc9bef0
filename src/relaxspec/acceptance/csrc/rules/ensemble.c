/* The rule ensemble's math in C (ensemble.py: native_test; rule.h declares its functions). */

static inline float rule_test(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                              const double *prm, float in) {
    (void)z; (void)zq; (void)V; (void)in;
    const double weight = prm[0];
    if (weight == 0.0) return 1.0f;
    if (!(q[x] > 0.0f)) return 0.0f;
    const float strict = capped(p[x], q[x]), mixed = (float)weight * strict;
    return (float)(1.0 - weight) + mixed;
}
