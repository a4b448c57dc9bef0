/* The rule spec-cont-dec's math in C (spec_cont_dec.py: native_test; rule.h declares its functions). */

typedef struct { float a, b, t, top; int64_t banned; double sum; } contrast;  /* banned: tokens with zq = -inf */

static inline float score(contrast c, const float *z, const float *zq, int64_t i) {
    return (c.a * z[i] - c.b * zq[i]) / c.t;
}

/* π's weight at token i (unnormalised: c.sum is the total) */
static inline float contrast_weight(contrast c, const float *p, const float *z, const float *zq, int64_t i) {
    if (!(p[i] > 0.0f)) return 0.0f;
    if (c.banned) return zq[i] == -INFINITY ? 1.0f : 0.0f;
    return exp_nonpositive(score(c, z, zq, i) - c.top);
}

/* the scores' largest and total over p's support; banned < 0 for a score that is not finite there (declined) */
static inline contrast contrast_of(const float *p, const float *z, const float *zq, int64_t V, const double *prm) {
    contrast c = {(float)(1.0 + prm[0]), (float)prm[0], (float)prm[1], -INFINITY, 0, 0.0};
    for (int64_t i = 0; i < V; i++) {
        if (!(p[i] > 0.0f)) continue;
        if (zq[i] == -INFINITY) { c.banned++; continue; }
        const float s = score(c, z, zq, i);
        if (!isfinite(s)) { c.banned = -1; return c; }
        c.top = s > c.top ? s : c.top;
    }
    for (int64_t i = 0; i < V; i++) c.sum += contrast_weight(c, p, z, zq, i);
    return c;
}

/* π's V weights, normalised as torch's softmax is (β = 0: p); returns 0, or 1 to decline */
static inline int contrast_row(const float *p, const float *z, const float *zq, int64_t V, const double *prm,
                               float *out) {
    if (prm[0] == 0.0) { memcpy(out, p, V * sizeof(float)); return 0; }
    const contrast c = contrast_of(p, z, zq, V, prm);
    if (c.banned < 0) return 1;
    for (int64_t i = 0; i < V; i++) out[i] = (float)(contrast_weight(c, p, z, zq, i) / c.sum);
    return 0;
}

static inline float rule_test(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                              const double *prm, float in) {
    (void)in;
    if (prm[0] == 0.0) return capped(p[x], q[x]);
    const contrast c = contrast_of(p, z, zq, V, prm);
    if (c.banned < 0) return NAN;
    return capped((float)(contrast_weight(c, p, z, zq, x) / c.sum), q[x]);
}

static int rule_residual(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                         const double *prm, float *out) {
    (void)x;
    if (contrast_row(p, z, zq, V, prm, out) != 0) return 1;
    for (int64_t i = 0; i < V; i++) {
        const float r = out[i] - q[i];
        out[i] = r < 0.0f ? 0.0f : r;
    }
    return 0;
}

static int rule_bonus(const float *p, const float *z, const float *zq, int64_t V, const double *prm, float *out) {
    return contrast_row(p, z, zq, V, prm, out);
}
