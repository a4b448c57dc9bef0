/* The rule r-fuzzy's math in C (rfuzzy.py: native_test; rule.h declares its functions). */

static inline float rule_test(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                              const double *prm, float in) {
    (void)z; (void)zq; (void)in;
    return accept_or_strict(jsd(p, q, V) <= (float)prm[0], p[x], q[x]);
}
