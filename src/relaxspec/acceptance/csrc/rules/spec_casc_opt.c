/* The rule spec-casc-opt's math in C (spec_casc_opt.py: native_test; rule.h declares its functions). */

static inline float rule_test(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                              const double *prm, float in) {
    (void)z; (void)zq; (void)in;
    const float slack = (float)prm[0] * total_variation(p, q, V);
    return accept_or_strict(max(q, V) >= max(p, V) - slack, p[x], q[x]);
}
