"""The CPU sampler in C: distribution processing and inverse-CDF sampling, each in one call per block of rows,
and a round's counter-stream uniforms (random.py) in one call.

On a small model the engine processes a few rows of logits many times a round (each draft, the verifier's N+1
rows, the residual / bonus sample, every AR token), and the torch path spends ~20 tiny tensor ops on each:
here a row costs one pass or a few over its V logits, in one ctypes call for all rows (`relaxspec.native`
builds the C source below on first use). `processing.process_logits_unchecked` and
`processing.sample_with_uniform` call these for float32 CPU tensors when the library loaded, and keep their
torch code for everything else (other devices and dtypes, `RELAXSPEC_NATIVE=0`); tests compare the two.

* `process`: logits / temperature (float32 division, as torch), top-k (ties with the k-th value kept: the k-th
  largest from a size-k heap), top-p (the smallest most-likely set whose mass reaches top_p, ties at the cut
  kept lowest index first, the order of a stable descending sort), renormalised. Top-p never sorts: one pass
  adds each token's mass to a histogram over the float bits of max - logit (eight buckets an octave, from 2^-6
  to 32: a larger logit is never in a later bucket); walking the buckets from the max finds the one where the mass
  reaches top_p, every token before it is kept, and a quickselect on the mass (O(n) expected) picks, in that
  bucket only, the tokens the sorted walk would keep. exp in float32 of z - max as torch's softmax (Cephes'
  polynomial, written to vectorise: `native.EXP_NONPOSITIVE`), sums in float64: probabilities may differ from
  torch's in the last bits.
* `sample`: the cdf in float64 in vocabulary order (the same sequential sums as torch's cumsum, so the same
  bits), index i with cdf[i-1] <= u * total < cdf[i], the target clamped strictly below the total (a
  zero-weight index is never returned): the same indices as the torch path.
* `first_rejection` and `finish`: the shared verify loop's bookkeeping (acceptance/verify.py), one call each: the
  acceptance tests up to each row's first rejection, then the emitted token (the residual, p where the residual has
  no mass, or the bonus, sampled as `sample` does) and the row of output tokens; the same results as the loop's torch
  ops, bit for bit (`loop_disabled()` sets these aside alone, the rules' libraries too, for tests and benchmarks).
  `verify_default` is both in one call for a rule that keeps strict's bonus and its residual (p - q)+ or takes argmax
  p (Rule.residual_argmax): it reads them from the blocks p and q itself (and strict's test too, for a rule that
  keeps it).
* `rule_library`: the same loop built with a rule's own math in C (`Rule.native_test`, `native_residual`,
  `native_bonus`, in the rule's file) in place of strict's, one library per rule: its whole verify step in one call
  when sampling (`verify.VerifyStep`); the rule's torch methods stay the reference (tests compare the two).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from dataclasses import dataclass

import numpy as np
import torch

from relaxspec import native

_HEAD = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
""" + native.EXP_NONPOSITIVE + r"""

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

/* The verify loop's first rejection (acceptance/verify.py) on B rows of N drafts: accepted[b, i] = u < ap, where
   i < num_drafts[b] (num_drafts NULL: every i); kept[b, i] = the accepted drafts before the first rejection; n[b] =
   their count; relaxed[b, i] = kept, though u < strict fails (strict NULL: never). u: float64 holding float32 values
   (exactly: the comparisons are float32's), ap, strict: float32; row strides su, sa, ss (unit column stride); the
   bool outputs (one byte each) and n contiguous. */
void rs_first_rejection(const double *u, int64_t su, const float *ap, int64_t sa, const float *strict, int64_t ss,
                        const int64_t *num_drafts, int64_t B, int64_t N, uint8_t *accepted, uint8_t *kept,
                        uint8_t *relaxed, int64_t *n) {
    for (int64_t b = 0; b < B; b++)
        n[b] = reject_row(u + b * su, ap + b * sa, strict ? strict + b * ss : NULL, num_drafts ? num_drafts[b] : N, N,
                          accepted + b * N, kept + b * N, relaxed + b * N);
}

/* Row b's output: tokens[b, :N+1] = its n[b] kept drafts, last[b], then -1. */
static void emit(int64_t b, int64_t N, int64_t n, const int64_t *drafts, int64_t sd, int64_t last, int64_t *tokens) {
    int64_t *t = tokens + b * (N + 1);
    for (int64_t i = 0; i <= N; i++) t[i] = i < n ? drafts[b * sd + i] : i == n ? last : -1;
}

/* The verify loop's finish on B rows: row b emits last[b], sampled (sample_row at u[b]) from its residual row
   where it stopped at a rejection (n[b] < num_drafts[b], or N where num_drafts is NULL), from its p row there
   when the residual has no mass (a sum that is not > 0: the weights are >= 0, so the same test as the float32
   sum), else from its bonus row; tokens[b, :N+1] = its n[b] kept drafts, last[b], then -1. residual, p, bonus:
   float32 rows of V with row strides sr, sp, sb; drafts int64 with row stride sd. Returns 0, or -1 when memory
   runs out. */
int rs_finish(const int64_t *n, const int64_t *num_drafts, int64_t B, int64_t N, int64_t V, const float *residual,
              int64_t sr, const float *p, int64_t sp, const float *bonus, int64_t sb, const double *u,
              const int64_t *drafts, int64_t sd, int64_t *tokens, int64_t *last) {
    double *cdf = malloc(V * sizeof(double));
    if (!cdf) return -1;
    for (int64_t b = 0; b < B; b++) {
        const float *row = bonus + b * sb;
        if (n[b] < (num_drafts ? num_drafts[b] : N)) {
            row = residual + b * sr;
            if (!(sum(row, V) > 0.0)) row = p + b * sp;
        }
        last[b] = sample_row(row, u[b], cdf, V);
        emit(b, N, n[b], drafts, sd, last[b], tokens);
    }
    free(cdf);
    return 0;
}

"""

_VERIFY = r"""
/* A rule's math at one position, in C: p and q the processed rows there, z and zq the verifier's and the drafter's raw
   logits there (NULL where the caller passed none), x the draft (the rejected one for the residual), prm the rule's
   parameters (a choice as its index) then the temperature, in the test the rule's input there (0 for none).
   Strict's test here; a rule's own (Rule.native_test) takes its place in that rule's library (rule_library), with
   its residual (RULE_RESIDUAL) and bonus (RULE_BONUS) where it has them in C. A test returns NaN, a residual or a
   bonus nonzero, for a block the rule's C declines (the caller's torch path then serves it). */
#ifndef RULE_TEST
static inline float rule_test(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                              const double *prm, float in) {
    (void)z; (void)zq; (void)V; (void)prm; (void)in;
    return capped(p[x], q[x]);
}
#endif

/* The verify loop for a rule with strict's bonus (Rule.bonus) or its own in C, from the blocks p [B, N+1, V], q [B, N,
   V], the verifier's raw logits z [B, N+1, V] and the drafter's zq [B, zq_rows, V] (float32, strides (sp0, sp1),
   (sq0, sq1), (sz0, sz1), (szq0, szq1), unit along V; z and zq may be NULL for a rule that does not read them), in
   one call: rs_first_rejection on the rule's ap (and strict, or NULL; row strides sa, ss), or, ap NULL, on ap_out[b,
   i] = rule_test at each draft x = drafts[b, i], with its input in[b * sin + i] (in NULL: 0; every in[b, i] first
   checked to lie in [in_low, in_high], as floats, NaN refused: -4 otherwise) (strict's min(1, p(x) /
   q(x)), 0 where q(x) <= 0, at_tokens and capped_ratio's float32 values, in the sampler's library) with strict_out[b,
   i] = strict's test beside it where strict_out is not NULL; then rs_finish's token: the residual of a row stopped at
   a rejection at its position n[b] is the rule's own (RULE_RESIDUAL), else (p - q)+ (float32, as torch's (p -
   q).clamp_min_(0)), p there where it has no mass (argmax 0), or (argmax 1, Rule.residual_argmax) one-hot on the
   first largest p there, whose sample is that index at any u; the bonus is the rule's own (RULE_BONUS, the
   drafter's row min(num_drafts[b], zq_rows - 1)), else p, at the row's bonus position (num_drafts[b], or N); sampled
   at ut[b * st0 + n[b] * st1] (st1 0: one uniform per row). ua: the acceptance uniforms, row stride sua. Returns 0,
   -1 when memory runs out, -2 for a draft outside [0, V), -3 where the rule's C declined the block (nothing drawn
   from is changed: the outputs are then unspecified), -4 for an input outside its range (nothing written). */
int rs_verify_default(const float *p, int64_t sp0, int64_t sp1, const float *q, int64_t sq0, int64_t sq1,
                      const float *z, int64_t sz0, int64_t sz1, const float *zq, int64_t szq0, int64_t szq1,
                      int64_t zq_rows, const float *in, int64_t sin, double in_low, double in_high,
                      const int64_t *drafts, int64_t sd,
                      const int64_t *num_drafts, int64_t B, int64_t N, int64_t V, const float *ap, int64_t sa,
                      const float *strict, int64_t ss, float *ap_out, float *strict_out, const double *prm,
                      const double *ua, int64_t sua, const double *ut, int64_t st0, int64_t st1, int64_t argmax,
                      uint8_t *accepted, uint8_t *kept,
                      uint8_t *relaxed, int64_t *n, int64_t *tokens, int64_t *last) {
#define Z_AT(b, i) (z ? z + (b) * sz0 + (i) * sz1 : NULL)
#define ZQ_AT(b, i) (zq ? zq + (b) * szq0 + (i) * szq1 : NULL)
    if (in) {  /* as torch compares a float32 tensor with its bounds: in float32 */
        const float lo = (float)in_low, hi = (float)in_high;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < N; i++) {
                const float v = in[b * sin + i];
                if (!(v >= lo && v <= hi)) return -4;
            }
    }
    for (int64_t b = 0; b < B && !ap; b++)
        for (int64_t i = 0; i < N; i++) {
            const int64_t x = drafts[b * sd + i];
            if (x < 0 || x >= V) return -2;
            const float *pr = p + b * sp0 + i * sp1, *qr = q + b * sq0 + i * sq1;
            const float a = rule_test(pr, qr, Z_AT(b, i), ZQ_AT(b, i), V, x, prm, in ? in[b * sin + i] : 0.0f);
            if (a != a) return -3;  /* NaN: declined */
            ap_out[b * N + i] = a;
            if (strict_out) strict_out[b * N + i] = capped(pr[x], qr[x]);
        }
    if (!ap) {
        ap = ap_out, sa = N;
        if (strict_out) strict = strict_out, ss = N;
    }
    double *cdf = malloc(V * sizeof(double));
    float *residual = malloc(V * sizeof(float));
    int status = -1;
    if (!cdf || !residual) goto done;
    status = -3;
    for (int64_t b = 0; b < B; b++) {
        const int64_t proposed = num_drafts ? num_drafts[b] : N;
        n[b] = reject_row(ua + b * sua, ap + b * sa, strict ? strict + b * ss : NULL, proposed, N,
                          accepted + b * N, kept + b * N, relaxed + b * N);
        const float *row = p + b * sp0 + proposed * sp1;
        if (n[b] < proposed && argmax) {
            const float *pr = p + b * sp0 + n[b] * sp1;
            int64_t best = 0;
            for (int64_t i = 1; i < V; i++) best = pr[i] > pr[best] ? i : best;
            last[b] = best;
            emit(b, N, n[b], drafts, sd, best, tokens);
            continue;
        }
        if (n[b] < proposed) {
            const float *pr = p + b * sp0 + n[b] * sp1, *qr = q + b * sq0 + n[b] * sq1;
#ifdef RULE_RESIDUAL
            if (rule_residual(pr, qr, Z_AT(b, n[b]), ZQ_AT(b, n[b]), V, drafts[b * sd + n[b]], prm, residual) != 0)
                goto done;
#else
            for (int64_t i = 0; i < V; i++) {
                const float r = pr[i] - qr[i];
                residual[i] = r < 0.0f ? 0.0f : r;
            }
#endif
            row = sum(residual, V) > 0.0 ? residual : pr;
        }
#ifdef RULE_BONUS
        else {
            if (rule_bonus(row, Z_AT(b, proposed), ZQ_AT(b, proposed < zq_rows ? proposed : zq_rows - 1), V, prm,
                           residual) != 0)
                goto done;
            row = residual;
        }
#endif
        last[b] = sample_row(row, ut[b * st0 + n[b] * st1], cdf, V);
        emit(b, N, n[b], drafts, sd, last[b], tokens);
    }
    status = 0;
done:
    free(residual);
    free(cdf);
    return status;
#undef Z_AT
#undef ZQ_AT
}
"""

_TAIL = r"""
/* The counter streams' 32 bits (random.py's definition): lowbias32(lowbias32(key_low ^ position) ^ key_high). */
static inline uint32_t lowbias32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    return x ^ (x >> 16);
}

static inline uint32_t stream_bits(uint32_t low, uint32_t high, int64_t position) {
    return lowbias32(lowbias32(low ^ (uint32_t)(position & 0xFFFFFFFF)) ^ high);
}

static inline double uniform53(uint32_t high, uint32_t low) {  /* 27 + 26 bits, exact in float64 */
    return ((double)(high >> 5) * 67108864.0 + (double)(low >> 6)) * (1.0 / 9007199254740992.0);
}

/* out[a, b] = probs[a * s0 + b * s1 + x[a, b]] for x [A, B] (contiguous int64): the probabilities at tokens x of
   float32 rows of V (unit stride along V). Returns 0, or -1 for a token outside [0, V) (nothing read there). */
int rs_at_tokens(const float *probs, int64_t s0, int64_t s1, int64_t V, const int64_t *x, int64_t A, int64_t B,
                 float *out) {
    for (int64_t a = 0; a < A; a++)
        for (int64_t b = 0; b < B; b++) {
            const int64_t t = x[a * B + b];
            if (t < 0 || t >= V) return -1;
            out[a * B + b] = probs[a * s0 + b * s1 + t];
        }
    return 0;
}

/* out = min(1, num / den), and 0 where den <= 0 (processing.capped_ratio), for n contiguous float32 values: the
   float32 quotient, NaN kept (a comparison with NaN is false, as torch's clamp propagates it). */
void rs_capped_ratio(const float *num, const float *den, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = capped(num[i], den[i]);
}

/* One engine round's uniforms for B rows (random.py, CounterDraws): keys low / high [B, K] (uint32), start [B]
   the rows' next output positions, col the key columns of (ACCEPT word 0, DRAFT words 1 and 2, TOKEN words 1
   and 2); out [B, 3W + 1]: W 24-bit acceptance uniforms, W 53-bit draft uniforms, W + 1 53-bit token
   uniforms, at positions start + 0, 1, ... */
void rs_round_table(const uint32_t *low, const uint32_t *high, int64_t K, const int64_t *start, int64_t B,
                    int64_t W, const int64_t *col, double *out) {
    for (int64_t b = 0; b < B; b++) {
        const uint32_t *lo = low + b * K, *hi = high + b * K;
        double *o = out + b * (3 * W + 1);
        for (int64_t i = 0; i < W; i++)
            o[i] = (double)(stream_bits(lo[col[0]], hi[col[0]], start[b] + i) >> 8) * (1.0 / 16777216.0);
        for (int64_t i = 0; i < W; i++)
            o[W + i] = uniform53(stream_bits(lo[col[1]], hi[col[1]], start[b] + i),
                                 stream_bits(lo[col[2]], hi[col[2]], start[b] + i));
        for (int64_t i = 0; i <= W; i++)
            o[2 * W + i] = uniform53(stream_bits(lo[col[3]], hi[col[3]], start[b] + i),
                                     stream_bits(lo[col[4]], hi[col[4]], start[b] + i));
    }
}
"""

SOURCE = _HEAD + _VERIFY + _TAIL  # the sampler's library: strict's test in the verify loop

_P, _I, _D = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
VERIFY_SIGNATURE = ("rs_verify_default", ctypes.c_int, (_P, _I, _I, _P, _I, _I, _P, _I, _I, _P, _I, _I, _I, _P, _I, _D,
                                                         _D, _P, _I, _P, _I, _I, _I, _P, _I, _P, _I, _P, _P, _P, _P,
                                                         _I, _P, _I, _I, _I, _P, _P, _P, _P, _P, _P))
SIGNATURES = (
    ("rs_process", ctypes.c_int, (_P, _P, _I, _I, _D, _I, _D)),
    ("rs_sample", ctypes.c_int, (_P, _P, _P, _I, _I)),
    ("rs_round_table", None, (_P, _P, _I, _P, _I, _I, _P, _P)),
    ("rs_first_rejection", None, (_P, _I, _P, _I, _P, _I, _P, _I, _I, _P, _P, _P, _P)),
    ("rs_finish", ctypes.c_int, (_P, _P, _I, _I, _I, _P, _I, _P, _I, _P, _I, _P, _P, _I, _P, _P)),
    VERIFY_SIGNATURE,
    ("rs_at_tokens", ctypes.c_int, (_P, _I, _I, _I, _P, _I, _I, _P)),
    ("rs_capped_ratio", None, (_P, _P, _P, _I)),
)

_UNLOADED = object()
_lib = _UNLOADED  # the loaded library, None where it cannot be (tests set None to force the torch path)


def library():
    """The sampler's library (built on first use), or None (no compiler, RELAXSPEC_NATIVE=0)."""
    global _lib
    if _lib is _UNLOADED:
        _lib = native.load("sampler", SOURCE, SIGNATURES)
    return _lib


@contextlib.contextmanager
def disabled():
    """Inside the block, the torch path serves (the library set aside): for tests and benchmarks."""
    global _lib
    saved, _lib = library(), None
    try:
        yield
    finally:
        _lib = saved


_loop = True  # whether the verify loop's kernels (first_rejection, finish) serve; loop_disabled() sets it aside


@contextlib.contextmanager
def loop_disabled():
    """Inside the block, the verify loop's bookkeeping runs its torch ops, the other kernels still serve (the
    same probabilities, so results comparable bit for bit): for tests and benchmarks."""
    global _loop
    saved, _loop = _loop, False
    try:
        yield
    finally:
        _loop = saved


def serves_loop(*tensors: torch.Tensor) -> bool:
    """True where the verify loop's kernels take these tensors (each as `serves` says; not set aside)."""
    return _loop and all(serves(t) for t in tensors)


def serves(t: torch.Tensor) -> bool:
    """True where the kernels take `t`: a non-empty float32 CPU tensor that needs no gradient, library loaded."""
    return (t.dtype is torch.float32 and t.is_cpu and not t.requires_grad and t.numel() > 0
            and (_lib if _lib is not _UNLOADED else library()) is not None)


def process(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Processed probabilities of float32 CPU logits [..., V] (checked settings; not greedy)."""
    x = logits.contiguous()
    out = torch.empty_like(x)  # contiguous as x, on its device (cheaper than torch.empty)
    V = x.shape[-1]
    if _lib.rs_process(x.data_ptr(), out.data_ptr(), x.numel() // V, V, float(temperature),
                       0 if top_k is None else int(top_k), 1.0 if top_p is None else float(top_p)) != 0:
        raise MemoryError("relaxspec sampler: out of memory processing logits")
    return out


def sample(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """[R] int64: one index per row of float32 CPU weights [R, V] by inverse CDF at CPU uniforms u [R]."""
    w, u = weights.contiguous(), _float64(u)
    index = torch.empty_like(u, dtype=torch.int64)
    if _lib.rs_sample(w.data_ptr(), u.data_ptr(), index.data_ptr(), w.shape[0], w.shape[-1]) != 0:
        raise MemoryError("relaxspec sampler: out of memory sampling")
    return index


def round_table(low, high, start, width: int, columns) -> torch.Tensor:
    """One round's uniforms [B, 3 * width + 1] float64 (CPU) from the host keys low / high (numpy uint32 [B, K]),
    the rows' next positions `start` (numpy int64 [B]) and the key columns of (ACCEPT 0, DRAFT 1, DRAFT 2,
    TOKEN 1, TOKEN 2) (numpy int64 [5]): random.CounterDraws' table, bit for bit."""
    low, high = np.ascontiguousarray(low, dtype=np.uint32), np.ascontiguousarray(high, dtype=np.uint32)
    start = np.ascontiguousarray(start, dtype=np.int64)
    out = torch.empty((low.shape[0], 3 * width + 1), dtype=torch.float64, device="cpu")  # (never the default device)
    _lib.rs_round_table(low.ctypes.data, high.ctypes.data, low.shape[1], start.ctypes.data, low.shape[0], width,
                        columns.ctypes.data, out.data_ptr())
    return out


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t with unit stride along its last dimension (its rows read in place through t.stride(0))."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _float64(u: torch.Tensor) -> torch.Tensor:
    """Uniforms u as the kernels read them: contiguous float64."""
    return u if u.dtype is torch.float64 and u.is_contiguous() else u.to(torch.float64).contiguous()


def _acceptance_uniforms(u: torch.Tensor) -> torch.Tensor:
    """Acceptance uniforms as the loop kernels read them: float64 (a float32 value converts exactly), unit stride along
    the drafts."""
    return _rows(u if u.dtype is torch.float64 else u.double())


def _test_outputs(B: int, N: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The buffers the kernels write a block's acceptance tests into: flags [3, B, N] bool (accepted, kept,
    relaxed_only) and n [B] int64."""
    return (torch.empty((3, B, N), dtype=torch.bool, device=device),
            torch.empty((B,), dtype=torch.int64, device=device))


def _token_outputs(B: int, N: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The buffers the kernels write a block's output into: tokens [B, N+1] and last [B], int64."""
    return (torch.empty((B, N + 1), dtype=torch.int64, device=device),
            torch.empty((B,), dtype=torch.int64, device=device))


def _counts(num_drafts: torch.Tensor | None) -> torch.Tensor | None:
    """num_drafts [B] as the kernels read it: contiguous int64 (or None)."""
    return None if num_drafts is None else _rows(num_drafts if num_drafts.dtype is torch.int64 else num_drafts.long())


def first_rejection(u: torch.Tensor, accept_prob: torch.Tensor, strict_accept_prob: torch.Tensor | None,
                    num_drafts: torch.Tensor | None):
    """The verify loop's first rejection on float32 CPU accept_prob [B, N] (strict_accept_prob the same or None,
    num_drafts int64 [B] or None) and CPU uniforms u [B, N] (float32, or float64 holding float32 values: a counter
    stream's 24-bit ones): (accepted, kept, n, relaxed_only), as verify's torch path gives them."""
    u, accept_prob = _acceptance_uniforms(u), _rows(accept_prob)
    strict = None if strict_accept_prob is None else _rows(strict_accept_prob)
    num_drafts = _counts(num_drafts)  # (held here: the kernel reads its memory)
    B, N = accept_prob.shape
    flags, n = _test_outputs(B, N, accept_prob.device)
    ptr = flags.data_ptr()
    _lib.rs_first_rejection(u.data_ptr(), u.stride(0), accept_prob.data_ptr(), accept_prob.stride(0),
                            None if strict is None else strict.data_ptr(), 0 if strict is None else strict.stride(0),
                            None if num_drafts is None else num_drafts.data_ptr(), B, N, ptr, ptr + B * N,
                            ptr + 2 * B * N, n.data_ptr())
    accepted, kept, relaxed_only = flags.unbind(0)
    return accepted, kept, n, relaxed_only


def finish(n: torch.Tensor, num_drafts: torch.Tensor | None, residual: torch.Tensor, p: torch.Tensor,
           bonus: torch.Tensor, u: torch.Tensor, drafts: torch.Tensor):
    """The verify loop's finish (float32 CPU rows [B, V], CPU u float64 [B], drafts int64 [B, N]): (tokens
    [B, N+1], last [B]), as verify's torch path gives them (the same sample: `sample_row`, as `sample`)."""
    residual, p, bonus, drafts = _rows(residual), _rows(p), _rows(bonus), _rows(drafts)
    u = _float64(u)
    B, N = drafts.shape
    tokens, last = _token_outputs(B, N, drafts.device)
    num_drafts = _counts(num_drafts)
    if _lib.rs_finish(n.data_ptr(), None if num_drafts is None else num_drafts.data_ptr(), B, N, residual.shape[-1],
                      residual.data_ptr(), residual.stride(0), p.data_ptr(), p.stride(0), bonus.data_ptr(),
                      bonus.stride(0), u.data_ptr(), drafts.data_ptr(), drafts.stride(0), tokens.data_ptr(),
                      last.data_ptr()) != 0:
        raise MemoryError("relaxspec sampler: out of memory sampling")
    return tokens, last


def verify_default(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, accept_prob: torch.Tensor | None,
                   strict_accept_prob: torch.Tensor | None, u: torch.Tensor, u_token: torch.Tensor,
                   num_drafts: torch.Tensor | None, argmax: bool = False, kernel: RuleKernel | None = None,
                   z: torch.Tensor | None = None, zq: torch.Tensor | None = None, inp: torch.Tensor | None = None,
                   inp_range: tuple[float, float] | None = None):
    """The verify loop in one call for a rule that keeps strict's bonus and residual (or, argmax, takes
    Rule.residual_argmax, or the kernel's rule's own), read from the blocks p [B, N+1, V] and q [B, N, V] (float32
    CPU): `first_rejection` on accept_prob (None: the test computed here, strict's min(1, p(x)/q(x)) at the drafts, or
    `kernel`'s rule's own, from p, q, the raw logits of the verifier, z [B, N+1, V], and of the drafter, zq [B, N or
    N+1, V], and its input inp [B, N] float32 or None, whose values are checked first to lie in inp_range (given with
    inp), NaN refused: InputOutOfRange otherwise), then `finish` with the residual (p - q)+ (argmax: one-hot on
    argmax p; the kernel's rule's own) at each stopped row's position and the bonus (p, or the kernel's rule's own) at
    its bonus position, the token of row b drawn at u_token[b, n[b]] (float64 [B, N+1], or a column expanded: one
    uniform per row).
    (accept_prob, strict_accept_prob, accepted, kept, n, relaxed_only, tokens, last), as the loop's torch ops give them
    (strict_accept_prob: the one given, or with a kernel strict's test computed here, else None); None where the
    kernel's rule declined the block (its torch math serves it then); ValueError for a draft outside [0, V) when
    computing the test."""
    p, q, drafts = _rows(p), _rows(q), _rows(drafts)
    u = _acceptance_uniforms(u)
    u_token = u_token if u_token.dtype is torch.float64 else u_token.double()  # (read through its strides)
    B, N = drafts.shape
    out = strict_out = None
    if accept_prob is None and kernel is None:  # strict's test, computed here
        ap = torch.empty((B, N), dtype=torch.float32, device=drafts.device)
        out = ap.data_ptr()
    elif accept_prob is None:  # the rule's test and strict's beside it
        ap, strict_accept_prob = torch.empty((2, B, N), dtype=torch.float32, device=drafts.device).unbind(0)
        out, strict_out = ap.data_ptr(), strict_accept_prob.data_ptr()
    else:
        ap = _rows(accept_prob)
    strict = None if strict_accept_prob is None or strict_out else _rows(strict_accept_prob)
    flags, n = _test_outputs(B, N, drafts.device)
    tokens, last = _token_outputs(B, N, drafts.device)
    num_drafts = _counts(num_drafts)
    ptr = flags.data_ptr()
    kernel_inputs = _NO_KERNEL_INPUTS if kernel is None else _kernel_inputs(z, zq, inp, inp_range)  # (held: C reads)
    status = (_lib if kernel is None else kernel.lib).rs_verify_default(
        p.data_ptr(), p.stride(0), p.stride(1), q.data_ptr(), q.stride(0), q.stride(1), *kernel_inputs[0],
        drafts.data_ptr(), drafts.stride(0), None if num_drafts is None else num_drafts.data_ptr(), B, N, p.shape[-1],
        None if out is not None else ap.data_ptr(), ap.stride(0), None if strict is None else strict.data_ptr(),
        0 if strict is None else strict.stride(0), out, strict_out,
        None if kernel is None else kernel.params.ctypes.data, u.data_ptr(), u.stride(0),
        u_token.data_ptr(), u_token.stride(0), u_token.stride(1), int(argmax), ptr, ptr + B * N, ptr + 2 * B * N,
        n.data_ptr(), tokens.data_ptr(), last.data_ptr())
    if status == -3:
        return None
    if status == -2:
        raise ValueError(f"a token lies outside the vocabulary [0, {p.shape[-1]})")
    if status == -4:
        raise InputOutOfRange(f"the rule's input must lie in [{inp_range[0]:g}, {inp_range[1]:g}] (NaN not allowed)")
    if status != 0:
        raise MemoryError("relaxspec sampler: out of memory sampling")
    accepted, kept, relaxed_only = flags.unbind(0)
    return ap, strict_accept_prob, accepted, kept, n, relaxed_only, tokens, last


def _kernel_inputs(z: torch.Tensor, zq: torch.Tensor, inp: torch.Tensor | None,
                   inp_range: tuple[float, float] | None) -> tuple:
    """(rs_verify_default's arguments for a rule's own math: z and zq with their row strides and zq's rows, the
    rule's input with its row stride and range; the tensors they point into, unit stride along their last dimension)."""
    if inp is not None and inp_range is None:
        raise ValueError("verify_default: a rule input needs its range (inp_range)")
    z, zq, inp = _rows(z), _rows(zq), None if inp is None else _rows(inp)
    return ((z.data_ptr(), *z.stride()[:2], zq.data_ptr(), *zq.stride()[:2], zq.shape[1],
             None if inp is None else inp.data_ptr(), 0 if inp is None else inp.stride(0),
             *(inp_range or (0.0, 0.0))), (z, zq, inp))


_NO_KERNEL_INPUTS = ((None, 0, 0, None, 0, 0, 0, None, 0, 0.0, 0.0), ())  # strict's test reads none


class InputOutOfRange(ValueError):
    """`verify_default` found a value of the rule's input outside its range, or NaN (nothing was computed)."""


@dataclass(frozen=True)
class RuleKernel:
    """A rule's verify loop in C at one setting: its library (`rule_library`) and the C's prm: the rule's parameters
    (float64, in `Rule.params` order, a choice as its index in `choices`), then the temperature."""

    lib: ctypes.CDLL
    params: np.ndarray


def rule_library(name: str, test: str, residual: str | None, bonus: str | None) -> ctypes.CDLL | None:
    """The library of a rule's verify loop: the sampler's (`rs_verify_default`) with the rule's test in C (`test`,
    Rule.native_test), and its residual and bonus (Rule.native_residual, native_bonus, or None: strict's), in place of
    strict's; None where it cannot be built or the kernels are off (`disabled()` included: nothing is remembered
    from there; `native.load` keeps each library built)."""
    if library() is None:
        return None
    return native.load("rule-" + name, _rule_source(test, residual, bonus), (VERIFY_SIGNATURE,))


@functools.cache
def _rule_source(test: str, residual: str | None, bonus: str | None) -> str:
    """A rule library's C source, composed once per rule (one string object: `native.load`'s cache then finds it
    without hashing and comparing ~30 KB again on every `VerifyStep`)."""
    own = "#define RULE_TEST\n" + test
    for macro, source in (("RULE_RESIDUAL", residual), ("RULE_BONUS", bonus)):
        own += "" if source is None else f"\n#define {macro}\n" + source
    return _NO_CONTRACTION + _HEAD + own + "\n" + _VERIFY


# A rule's float32 operations rounded one by one, as torch's are (a * b + c not fused into one rounding: -march=native
# has FMA), so that its C gives torch's values where it does the same operations.
_NO_CONTRACTION = r"""
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize ("fp-contract=off")
#endif
"""


def at_tokens(probs: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """probs [A, V] or [A, B, V] (float32 CPU, unit stride along V) at int64 CPU tokens x [A] or [A, B]: float32
    [A] or [A, B], what probs.gather(-1, x[..., None])[..., 0] gives; ValueError for a token outside [0, V)."""
    x, probs = x.contiguous(), _rows(probs)
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    two = probs.dim() == 3
    if _lib.rs_at_tokens(probs.data_ptr(), probs.stride(0), probs.stride(1) if two else 0, probs.shape[-1],
                         x.data_ptr(), x.shape[0], x.shape[1] if two else 1, out.data_ptr()) != 0:
        raise ValueError(f"a token lies outside the vocabulary [0, {probs.shape[-1]})")
    return out


def capped_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """processing.capped_ratio of float32 CPU tensors of one shape, in one call."""
    num, den = num.contiguous(), den.contiguous()
    out = torch.empty_like(num)
    _lib.rs_capped_ratio(num.data_ptr(), den.data_ptr(), out.data_ptr(), num.numel())
    return out

