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
"""

from __future__ import annotations

import contextlib
import ctypes

import numpy as np
import torch

from relaxspec import native

SOURCE = r"""
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

/* index[r] = i with cdf[i-1] <= u[r] * total < cdf[i], cdf the float64 running sum of w[r, :] in order (the
   same sums as torch's cumsum); the target clamped below the total, so a zero weight is never picked.
   Returns 0, or -1 when memory runs out. */
int rs_sample(const float *w, const double *u, int64_t *index, int64_t R, int64_t V) {
    double *cdf = malloc(V * sizeof(double));
    if (!cdf) return -1;
    for (int64_t r = 0; r < R; r++) {
        const float *x = w + r * V;
        double c = 0.0;
        for (int64_t i = 0; i < V; i++) cdf[i] = c += x[i];
        double target = u[r] * c, below = nextafter(c, 0.0);
        if (below < target) target = below;
        int64_t lo = 0, hi = V;  /* the first i with cdf[i] > target (V if none) */
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if (cdf[mid] > target) hi = mid; else lo = mid + 1;
        }
        index[r] = lo;
    }
    free(cdf);
    return 0;
}

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

_P, _I, _D = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
SIGNATURES = (
    ("rs_process", ctypes.c_int, (_P, _P, _I, _I, _D, _I, _D)),
    ("rs_sample", ctypes.c_int, (_P, _P, _P, _I, _I)),
    ("rs_round_table", None, (_P, _P, _I, _P, _I, _I, _P, _P)),
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
    w = weights.contiguous()
    if u.dtype is not torch.float64 or not u.is_contiguous():
        u = u.to(torch.float64).contiguous()
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
