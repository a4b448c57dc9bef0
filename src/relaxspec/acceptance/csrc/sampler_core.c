/* The sampler's core (acceptance/fused.py): distribution processing, inverse-CDF sampling, the verify loop's
   first rejection and finish, and the helpers a rule's math in C may call (acceptance/csrc/rule.h). Included
   by sampler.c and by rule.c (a rule's library). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exp_nonpositive.h"
#include "sampler.h"


typedef struct { float z, e; int64_t i; } item;  /* a candidate token: its logit, exp(logit - max), index */

/* a comes after b in a stable descending sort: a smaller logit, or an equal one at a larger index */
static inline int after(item a, item b) { return a.z < b.z || (a.z == b.z && a.i > b.i); }

/* a min-heap of floats */
static void float_down(float *h, int64_t n, int64_t at) {
    for (;;) {
        int64_t l = 2 * at + 1, w = at;
        if (l < n && h[l] < h[w]) w = l;
        if (l + 1 < n && h[l + 1] < h[w]) w = l + 1;
        if (w == at) return;
        float t = h[at]; h[at] = h[w]; h[w] = t; at = w;
    }
}

/* the k-th largest of z[V] (a multiset: ties count), 0 < k < V; h has room for k floats */
static float kth_largest(const float *z, int64_t V, int64_t k, float *h) {
    memcpy(h, z, k * sizeof(float));
    for (int64_t at = k / 2; at-- > 0;) float_down(h, k, at);
    for (int64_t i = k; i < V; i++)
        if (z[i] > h[0]) { h[0] = z[i]; float_down(h, k, 0); }
    return h[0];
}

/* sum of e[V] in float64 (eight running sums) */
static double sum(const float *e, int64_t V) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s = 0.0;
    int64_t i = 0;
    for (; i + 8 <= V; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += e[i + k];
    for (; i < V; i++) s += e[i];
    for (int k = 0; k < 8; k++) s += acc[k];
    return s;
}

/* the largest of z[V] (-inf for none; eight running maxima, so that it vectorises) */
static float max(const float *z, int64_t V) {
    float acc[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    float m = -INFINITY;
    int64_t i = 0;
    for (; i + 8 <= V; i += 8)
        for (int k = 0; k < 8; k++) acc[k] = z[i + k] > acc[k] ? z[i + k] : acc[k];
    for (; i < V; i++) m = z[i] > m ? z[i] : m;
    for (int k = 0; k < 8; k++) m = acc[k] > m ? acc[k] : m;
    return m;
}

/* e[i] = exp(z[i] - zmax) where z[i] >= floor, else 0; returns their sum */
static double exps(const float *z, float *e, int64_t V, float zmax, float floor) {
    for (int64_t i = 0; i < V; i++) e[i] = z[i] >= floor ? exp_nonpositive(z[i] - zmax) : 0.0f;
    return sum(e, V);
}

/* How many of the n candidates a[] the top-p set keeps (a token is kept iff the mass before it, in stable
   descending order, is < target), moving them to a[0..kept): a quickselect on the mass, O(n) expected. */
static int64_t select_mass(item *a, int64_t n, double target) {
    int64_t lo = 0, hi = n;  /* a[0..lo) kept; the answer in [lo, hi]; target: top_p mass minus a[0..lo)'s */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2, last = hi - 1, p;
        /* median of three as the pivot, moved to a[last] */
        if (after(a[lo], a[mid])) { item t = a[lo]; a[lo] = a[mid]; a[mid] = t; }
        if (after(a[mid], a[last])) { item t = a[mid]; a[mid] = a[last]; a[last] = t; }
        if (after(a[lo], a[mid])) { item t = a[lo]; a[lo] = a[mid]; a[mid] = t; }
        { item t = a[mid]; a[mid] = a[last]; a[last] = t; }
        item pivot = a[last];
        double mass = 0.0;
        p = lo;
        for (int64_t k = lo; k < last; k++)
            if (after(pivot, a[k])) { mass += a[k].e; item t = a[k]; a[k] = a[p]; a[p] = t; p++; }
        a[last] = a[p]; a[p] = pivot;
        if (mass >= target) { hi = p; continue; }  /* a[lo..p) already hold the mass: the cut is among them */
        if (mass + pivot.e >= target) return p + 1;  /* the pivot is the last token kept */
        target -= mass + pivot.e;
        lo = p + 1;
    }
    return lo;
}

#define BUCKETS 90  /* tokens by d = max - z: [0, 2^-6), 8 per octave up to 32 (float bits >> 20), [32, inf] */

/* A token's bucket: never smaller for a smaller logit (max - z rounds monotonically), equal for equal ones. */
static inline int32_t bucket(float z, float zmax) {
    const float d = zmax - z;
    int32_t bits;
    memcpy(&bits, &d, sizeof bits);
    const int32_t k = (bits >> 20) - 0x3C7;  /* 2^-6 is 0x3C800000: bucket 1 */
    return k < 0 ? 0 : k > BUCKETS - 1 ? BUCKETS - 1 : k;
}

/* top-p of one row: z its logits (read before out is written: they may share memory), e = exp(z - zmax) (0 off
   the candidates), target = top_p times their sum, key[V] scratch. A histogram of the mass by bucket finds the
   bucket where the mass reaches the target (the tokens of the buckets before it are kept: their logits are
   larger); a select on the mass among that bucket's tokens, in stable descending order, finds the rest. */
static int top_p_row(const float *z, const float *e, float *out, int64_t V, float zmax, double target,
                     uint8_t *key, item **items, int64_t *capacity) {
    double hist[4][BUCKETS] = {{0}}, before = 0.0;  /* four, taking turns: shorter chains of adds to a bucket */
    for (int64_t i = 0; i < V; i++) key[i] = (uint8_t)bucket(z[i], zmax);
    int64_t i = 0;
    for (; i + 4 <= V; i += 4)
        for (int k = 0; k < 4; k++) hist[k][key[i + k]] += e[i + k];
    for (; i < V; i++) hist[0][key[i]] += e[i];
    int32_t b = 0;
    for (; b < BUCKETS - 1; b++) {
        const double mass = hist[0][b] + hist[1][b] + hist[2][b] + hist[3][b];
        if (before + mass >= target) break;
        before += mass;
    }
    int64_t n = 0;
    for (i = 0; i < V; i++) n += key[i] == b && e[i] > 0.0f;
    if (n > *capacity) {
        free(*items);
        *capacity = n;
        if (!(*items = malloc(n * sizeof(item)))) return -1;
    }
    item *a = *items;
    n = 0;
    for (i = 0; i < V; i++)
        if (key[i] == b && e[i] > 0.0f) { a[n].z = z[i]; a[n].e = e[i]; a[n].i = i; n++; }
    const int64_t kept = select_mass(a, n, target - before);
    double sk = before;
    for (int64_t j = 0; j < kept; j++) sk += a[j].e;
    const double inv = 1.0 / sk;
    for (i = 0; i < V; i++) out[i] = key[i] < b ? (float)(e[i] * inv) : 0.0f;
    for (int64_t j = 0; j < kept; j++) out[a[j].i] = (float)(a[j].e * inv);
    return 0;
}

/* out[R, V] = processed probabilities of logits[R, V] (top_k <= 0 or >= V: off; top_p >= 1: off).
   Returns 0, or -1 when memory runs out (out is then unspecified). */
int rs_process(const float *logits, float *out, int64_t R, int64_t V, double temperature, int64_t top_k,
               double top_p) {
    const float t = (float)temperature;
    const int use_k = top_k > 0 && top_k < V, use_p = top_p < 1.0;
    float *kheap = use_k ? malloc(top_k * sizeof(float)) : NULL, *e = use_p ? malloc(V * sizeof(float)) : NULL;
    uint8_t *key = use_p ? malloc(V) : NULL;
    item *items = NULL;  /* a top-p boundary's candidates */
    int64_t capacity = 0;
    int status = -1;
    if ((use_k && !kheap) || (use_p && (!e || !key))) goto done;
    for (int64_t r = 0; r < R; r++) {
        const float *x = logits + r * V;
        float *z = out + r * V;
        if (temperature != 1.0) for (int64_t i = 0; i < V; i++) z[i] = x[i] / t;
        else memcpy(z, x, V * sizeof(float));
        const float zmax = max(z, V);
        const float floor = use_k ? kth_largest(z, V, top_k, kheap) : -INFINITY;
        if (!use_p) {
            const double inv = 1.0 / exps(z, z, V, zmax, floor);
            for (int64_t i = 0; i < V; i++) z[i] = (float)(z[i] * inv);
            continue;
        }
        if (top_p_row(z, e, z, V, zmax, top_p * exps(z, e, V, zmax, floor), key, &items, &capacity) != 0)
            goto done;
    }
    status = 0;
done:
    free(items);
    free(key);
    free(e);
    free(kheap);
    return status;
}

/* The index i with cdf[i-1] <= u * total < cdf[i], cdf the float64 running sum of x[V] in order (the same sums
   as torch's cumsum); the target clamped below the total, so a zero weight is never picked. cdf[V]: scratch. */
static int64_t sample_row(const float *x, double u, double *cdf, int64_t V) {
    double c = 0.0;
    for (int64_t i = 0; i < V; i++) cdf[i] = c += x[i];
    double target = u * c, below = nextafter(c, 0.0);
    if (below < target) target = below;
    int64_t lo = 0, hi = V;  /* the first i with cdf[i] > target (V if none) */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (cdf[mid] > target) hi = mid; else lo = mid + 1;
    }
    return lo;
}

/* index[r] = sample_row of w[r, :] at u[r]. Returns 0, or -1 when memory runs out. */
int rs_sample(const float *w, const double *u, int64_t *index, int64_t R, int64_t V) {
    double *cdf = malloc(V * sizeof(double));
    if (!cdf) return -1;
    for (int64_t r = 0; r < R; r++) index[r] = sample_row(w + r * V, u[r], cdf, V);
    free(cdf);
    return 0;
}

/* min(1, num / den), and 0 where den <= 0 (processing.capped_ratio's float32 value) */
static inline float capped(float num, float den) {
    const float r = num / den;
    return den <= 0.0f ? 0.0f : r > 1.0f ? 1.0f : r;
}

/* Helpers for the rules' math in C (Rule.native_test), as processing.py's: Σ x log x of a row in float64 (xlogy(0, 0)
   = 0: minus the entropy), the Jensen-Shannon divergence of two rows in nats (the same formula as processing.jsd,
   clamped to [0, ln 2]), and their total variation Σ (p - q)+. Sums in float64: within float32 rounding of torch's. */
static inline double neg_entropy(const float *x, int64_t V) {
    double s = 0.0;
    for (int64_t i = 0; i < V; i++)
        if (x[i] > 0.0f) s += (double)(x[i] * logf(x[i]));
    return s;
}

static inline float jsd(const float *p, const float *q, int64_t V) {
    double mix = 0.0, total = 0.0;
    for (int64_t i = 0; i < V; i++) {
        const float s = p[i] + q[i];
        total += s;
        if (s > 0.0f) mix += (double)(s * logf(s));
    }
    const double ln2 = 0.69314718055994530942, out = 0.5 * (neg_entropy(p, V) + neg_entropy(q, V) - mix)
                                                      + 0.5 * ln2 * total;
    return (float)(out < 0.0 ? 0.0 : out > ln2 ? ln2 : out);
}

static inline float total_variation(const float *p, const float *q, int64_t V) {
    double s = 0.0;
    for (int64_t i = 0; i < V; i++) {
        const float d = p[i] - q[i];
        s += d > 0.0f ? d : 0.0f;
    }
    return (float)s;
}

/* processing.accept_or_strict: a candidate draft is accepted, unless q(x) = 0; any other gets strict's test. */
static inline float accept_or_strict(int candidate, float px, float qx) {
    return candidate ? (qx > 0.0f ? 1.0f : 0.0f) : capped(px, qx);
}

/* topk-delta's and topk-ratio's test when sampling (processing.top_candidate, then accept_or_strict, the same float32
   comparisons): a candidate is a draft among the k most probable tokens of p (fewer than k above it) with p(x) >=
   scale * p(top-1) + shift and p(x) > 0. */
static inline float top_candidate_test(const float *p, const float *q, int64_t V, int64_t x, double topk, float scale,
                                       float shift) {
    const float px = p[x];
    const int64_t k = topk >= (double)V ? V : (int64_t)topk;
    int candidate = 0;
    if (k >= 1 && px > 0.0f) {
        int64_t above = 0;
        float top = p[0];
        for (int64_t i = 0; i < V; i++) {
            above += p[i] > px;
            top = p[i] > top ? p[i] : top;
        }
        candidate = above < k && px >= scale * top + shift;
    }
    return accept_or_strict(candidate, px, q[x]);
}

/* Row b's acceptance tests (pointers at its row): accepted[i] = u < ap where i < proposed; kept[i] = the accepted
   drafts before the first rejection; relaxed[i] = kept, though u < strict fails (strict NULL: never); returns their
   count. u: float64 holding float32 values (exactly: the comparisons are float32's). */
static int64_t reject_row(const double *u, const float *ap, const float *strict, int64_t proposed, int64_t N,
                          uint8_t *accepted, uint8_t *kept, uint8_t *relaxed) {
    int64_t count = 0;
    for (int64_t i = 0; i < N; i++) {
        const double x = u[i];
        const uint8_t a = i < proposed && x < ap[i], k = a && count == i;
        accepted[i] = a;
        kept[i] = k;
        relaxed[i] = k && strict && !(x < strict[i]);
        count += k;
    }
    return count;
}

/* The verify loop's first rejection (acceptance/verify.py; its arguments: the fields of args) on B rows of N
   drafts: accepted[b, i] = u < ap, where i < num_drafts[b] (num_drafts NULL: every i); kept[b, i] = the accepted
   drafts before the first rejection; n[b] = their count; relaxed[b, i] = kept, though u < strict fails (strict NULL:
   never). u: float64 holding float32 values (exactly: the comparisons are float32's), ap, strict: float32; row
   strides su, sa, ss (unit column stride); the bool outputs (one byte each) and n contiguous. */
void rs_first_rejection(const struct rs_first_rejection_args *args) {
    const struct rs_first_rejection_args a = *args;
    for (int64_t b = 0; b < a.B; b++)
        a.n[b] = reject_row(a.u + b * a.su, a.ap + b * a.sa, a.strict ? a.strict + b * a.ss : NULL,
                            a.num_drafts ? a.num_drafts[b] : a.N, a.N, a.accepted + b * a.N, a.kept + b * a.N,
                            a.relaxed + b * a.N);
}

/* Row b's output: tokens[b, :N+1] = its n[b] kept drafts, last[b], then -1. */
static void emit(int64_t b, int64_t N, int64_t n, const int64_t *drafts, int64_t sd, int64_t last, int64_t *tokens) {
    int64_t *t = tokens + b * (N + 1);
    for (int64_t i = 0; i <= N; i++) t[i] = i < n ? drafts[b * sd + i] : i == n ? last : -1;
}

/* The verify loop's finish on B rows (its arguments: the fields of args): row b emits last[b], sampled (sample_row
   at u[b]) from its residual row where it stopped at a rejection (n[b] < num_drafts[b], or N where num_drafts is
   NULL), from its p row there when the residual has no mass (a sum that is not > 0: the weights are >= 0, so the
   same test as the float32 sum), else from its bonus row; tokens[b, :N+1] = its n[b] kept drafts, last[b], then
   -1. residual, p, bonus: float32 rows of V with row strides sr, sp, sb; drafts int64 with row stride sd. Returns
   0, or -1 when memory runs out. */
int rs_finish(const struct rs_finish_args *args) {
    const struct rs_finish_args a = *args;
    double *cdf = malloc(a.V * sizeof(double));
    if (!cdf) return -1;
    for (int64_t b = 0; b < a.B; b++) {
        const float *row = a.bonus + b * a.sb;
        if (a.n[b] < (a.num_drafts ? a.num_drafts[b] : a.N)) {
            row = a.residual + b * a.sr;
            if (!(sum(row, a.V) > 0.0)) row = a.p + b * a.sp;
        }
        a.last[b] = sample_row(row, a.u[b], cdf, a.V);
        emit(b, a.N, a.n[b], a.drafts, a.sd, a.last[b], a.tokens);
    }
    free(cdf);
    return 0;
}
