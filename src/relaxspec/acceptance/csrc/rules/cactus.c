/* The rule cactus's math in C (cactus.py: native_test; rule.h declares its functions). */

static inline float cactus_h(float px, double delta) {
    const float rest = 1.0f - px;
    const float h = px + sqrtf((float)(2.0 * delta) * px * rest);
    return h > 1.0f ? 1.0f : h;
}

static inline float rule_test(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                              const double *prm, float in) {
    (void)z; (void)zq; (void)V; (void)in;
    return capped(cactus_h(p[x], prm[0]), q[x]);
}

static int rule_residual(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                         const double *prm, float *out) {
    (void)z; (void)zq;
    const float h = cactus_h(p[x], prm[0]);
    float scale = (1.0f - h) / (1.0f - p[x]);
    if (isnan(scale)) scale = 1.0f;
    for (int64_t i = 0; i < V; i++) {
        const float r = p[i] * scale - q[i];
        out[i] = r < 0.0f ? 0.0f : r;
    }
    const float rx = h - q[x];
    out[x] = rx < 0.0f ? 0.0f : rx;
    return 0;
}
