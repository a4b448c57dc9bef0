/* The rule pad's math in C (pad.py: native_test; rule.h declares its functions). */

static inline float softmax_at(const float *z, int64_t V, int64_t x, float t) {  /* softmax(z / t)(x) */
    const float top = max(z, V) / t;  /* the largest z[i] / t: dividing by t > 0 keeps the order, rounding too */
    double s = 0.0;
    for (int64_t i = 0; i < V; i++) s += exp_nonpositive(z[i] / t - top);
    return (float)(exp_nonpositive(z[x] / t - top) / s);
}

static inline float rule_test(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                              const double *prm, float in) {
    (void)zq;
    const float strict = capped(p[x], q[x]), threshold = (float)prm[0], min_prob = (float)prm[1];
    if (prm[2] == 0.0)  /* classifier floor: the classifier's branch, gated on the untempered p~(x) */
        return in < threshold && softmax_at(z, V, x, 1.0f) >= min_prob ? 1.0f : strict;
    if (!(softmax_at(z, V, x, (float)prm[3]) >= min_prob)) return 0.0f;  /* authors' floor, at T */
    return in <= threshold ? 1.0f : strict;
}
