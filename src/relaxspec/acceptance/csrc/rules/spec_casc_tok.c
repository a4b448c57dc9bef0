/* The rule spec-casc-tok's math in C (spec_casc_tok.py: native_test; rule.h declares its functions). */

typedef struct { const float *z; float zmax, cut; } top_set;  /* A = {v : z(v) - zmax >= cut} */

static inline top_set top_set_of(const float *z, int64_t V, double alpha) {
    const top_set a = {z, max(z, V), (float)log(1.0 - alpha)};
    return a;
}

static inline int in_a(top_set a, int64_t i) { return a.z[i] - a.zmax >= a.cut; }

static inline float eta_of(top_set a, const float *q, int64_t V) {  /* the mass of q outside A */
    double s = 0.0;
    for (int64_t i = 0; i < V; i++) s += in_a(a, i) ? 0.0f : q[i];
    return (float)s;
}

static inline float rule_test(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                              const double *prm, float in) {
    (void)zq; (void)in;
    const top_set a = top_set_of(z, V, prm[0]);
    return capped((in_a(a, x) ? q[x] : 0.0f) + eta_of(a, q, V) * p[x], q[x]);
}

static int rule_residual(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                         const double *prm, float *out) {
    (void)x; (void)zq;
    const top_set a = top_set_of(z, V, prm[0]);
    const float eta = eta_of(a, q, V);
    for (int64_t i = 0; i < V; i++) {
        const float r = ((in_a(a, i) ? q[i] : 0.0f) + eta * p[i]) - q[i];
        out[i] = r < 0.0f ? 0.0f : r;
    }
    return 0;
}
