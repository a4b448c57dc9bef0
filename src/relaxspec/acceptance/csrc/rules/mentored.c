/* The rule mentored's math in C (mentored.py: native_test; rule.h declares its functions). */

static inline float rule_test(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                              const double *prm, float in) {
    (void)z; (void)zq; (void)V; (void)in;
    return capped(p[x], (float)(1.0 - prm[0]) * q[x]);  /* torch: the float32 scalar (1 - alpha) times q(x) */
}
