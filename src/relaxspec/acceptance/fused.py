"""The CPU sampler in C: distribution processing and inverse-CDF sampling, each in one call per block of rows.

On a small model the engine processes a few rows of logits many times a round (each draft, the verifier's N+1
rows, the residual / bonus sample, every AR token), and the torch path spends ~20 tiny tensor ops on each:
here a row costs one pass or a few over its V logits, in one ctypes call for all rows (`relaxspec.native`
builds the C source below on first use). `processing.process_logits_unchecked` and
`processing.sample_with_uniform` call these for float32 CPU tensors when the library loaded, and keep their
torch code for everything else (other devices and dtypes, `RELAXSPEC_NATIVE=0`); tests compare the two.

* `process`: logits / temperature (float32 division, as torch), top-k (keeps ties with the k-th value: the
  k-th largest found with a size-k heap), top-p (the smallest most-likely set whose mass reaches top_p, in
  the order of a stable descending sort: the m best candidates from a size-m heap, m = 64 growing 8x until the
  set closes within them, so V is never fully sorted), renormalised. exp in float32 of z - max as torch's
  softmax, sums in float64, so the probabilities may differ from torch's in the last bits.
* `sample`: the cdf in float64 in vocabulary order (the same sequential sums as torch's cumsum, so the same
  bits), index i with cdf[i-1] <= u * total < cdf[i], the target clamped strictly below the total (a
  zero-weight index is never returned): the same indices as the torch path.
"""

from __future__ import annotations

import ctypes

import torch

from relaxspec import native

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { float z; int64_t i; } item;

/* a comes after b in a stable descending sort: a smaller value, or an equal one at a larger index */
static inline int after(item a, item b) { return a.z < b.z || (a.z == b.z && a.i > b.i); }

/* heaps whose root is the element that comes last */
static void item_down(item *h, int64_t n, int64_t at) {
    for (;;) {
        int64_t l = 2 * at + 1, w = at;
        if (l < n && after(h[l], h[w])) w = l;
        if (l + 1 < n && after(h[l + 1], h[w])) w = l + 1;
        if (w == at) return;
        item t = h[at]; h[at] = h[w]; h[w] = t; at = w;
    }
}

static void item_up(item *h, int64_t at) {
    while (at > 0) {
        int64_t parent = (at - 1) / 2;
        if (!after(h[at], h[parent])) return;
        item t = h[at]; h[at] = h[parent]; h[parent] = t; at = parent;
    }
}

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

/* The first min(m, count) candidates (z[i] >= floor, z[i] > -inf) in stable descending order, into h;
   returns how many; *count: the number of candidates. */
static int64_t best(const float *z, int64_t V, float floor, item *h, int64_t m, int64_t *count) {
    int64_t n = 0, c = 0;
    for (int64_t i = 0; i < V; i++) {
        float v = z[i];
        if (!(v >= floor) || v == -INFINITY) continue;
        c++;
        if (n < m) { h[n].z = v; h[n].i = i; item_up(h, n); n++; }
        else if (v > h[0].z) { h[0].z = v; h[0].i = i; item_down(h, n, 0); }  /* equal value: larger index, after */
    }
    *count = c;
    for (int64_t last = n - 1; last > 0; last--) {  /* heapsort: the last element to the end, repeatedly */
        item t = h[0]; h[0] = h[last]; h[last] = t; item_down(h, last, 0);
    }
    return n;
}

/* out[R, V] = processed probabilities of logits[R, V] (top_k <= 0 or >= V: off; top_p >= 1: off).
   Returns 0, or -1 when memory runs out (out is then unspecified). */
int rs_process(const float *logits, float *out, int64_t R, int64_t V, double temperature, int64_t top_k,
               double top_p) {
    const float t = (float)temperature;
    const int use_k = top_k > 0 && top_k < V, use_p = top_p < 1.0;
    float *kheap = use_k ? malloc(top_k * sizeof(float)) : NULL;
    item *h = NULL;
    int64_t capacity = 0;
    if (use_k && !kheap) return -1;
    for (int64_t r = 0; r < R; r++) {
        const float *x = logits + r * V;
        float *z = out + r * V;
        float zmax = -INFINITY;
        if (temperature != 1.0) for (int64_t i = 0; i < V; i++) z[i] = x[i] / t;
        else memcpy(z, x, V * sizeof(float));
        for (int64_t i = 0; i < V; i++) zmax = z[i] > zmax ? z[i] : zmax;
        const float floor = use_k ? kth_largest(z, V, top_k, kheap) : -INFINITY;
        if (!use_p) {
            double s = 0.0;
            for (int64_t i = 0; i < V; i++) {
                float e = z[i] >= floor ? expf(z[i] - zmax) : 0.0f;
                z[i] = e;
                s += e;
            }
            for (int64_t i = 0; i < V; i++) z[i] = (float)(z[i] / s);
            continue;
        }
        double s = 0.0;
        for (int64_t i = 0; i < V; i++) if (z[i] >= floor) s += expf(z[i] - zmax);
        /* token j of the order is kept iff the mass of the tokens before it is < top_p */
        int64_t m = 64, n, count, kept;
        for (;;) {
            if (m > V) m = V;
            if (m > capacity) {
                free(h);
                capacity = m;
                h = malloc(capacity * sizeof(item));
                if (!h) { free(kheap); return -1; }
            }
            n = best(z, V, floor, h, m, &count);
            double mass = 0.0;
            kept = -1;
            for (int64_t j = 0; j < n; j++) {
                if (mass >= top_p) { kept = j; break; }
                mass += expf(h[j].z - zmax) / s;
            }
            if (kept < 0 && (mass >= top_p || n == count)) kept = n;
            if (kept >= 0) break;
            m *= 8;  /* the set did not close among the m best: look further */
        }
        double sk = 0.0;
        for (int64_t j = 0; j < kept; j++) sk += expf(h[j].z - zmax);
        memset(z, 0, V * sizeof(float));
        for (int64_t j = 0; j < kept; j++) z[h[j].i] = (float)(expf(h[j].z - zmax) / sk);
    }
    free(h);
    free(kheap);
    return 0;
}

/* index[r] = i with cdf[i-1] <= u[r] * total < cdf[i], cdf the float64 running sum of w[r, :] */
void rs_sample(const float *w, const double *u, int64_t *index, int64_t R, int64_t V) {
    for (int64_t r = 0; r < R; r++) {
        const float *x = w + r * V;
        double total = 0.0;
        for (int64_t i = 0; i < V; i++) total += x[i];
        double target = u[r] * total, below = nextafter(total, 0.0);
        if (below < target) target = below;
        double c = 0.0;
        int64_t i = 0;
        for (; i < V; i++) {
            c += x[i];
            if (c > target) break;
        }
        index[r] = i;
    }
}
"""

_P, _I, _D = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
SIGNATURES = (
    ("rs_process", ctypes.c_int, (_P, _P, _I, _I, _D, _I, _D)),
    ("rs_sample", None, (_P, _P, _P, _I, _I)),
)

_UNLOADED = object()
_lib = _UNLOADED  # the loaded library, None where it cannot be (tests set None to force the torch path)


def library():
    """The sampler's library (built on first use), or None (no compiler, RELAXSPEC_NATIVE=0)."""
    global _lib
    if _lib is _UNLOADED:
        _lib = native.load("sampler", SOURCE, SIGNATURES)
    return _lib


def serves(t: torch.Tensor) -> bool:
    """True where the kernels take `t`: a non-empty float32 CPU tensor that needs no gradient, library loaded."""
    return (t.dtype == torch.float32 and t.device.type == "cpu" and not t.requires_grad and t.numel() > 0
            and library() is not None)


def process(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Processed probabilities of float32 CPU logits [..., V] (checked settings; not greedy)."""
    x = logits.contiguous()
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    V = x.shape[-1]
    if _lib.rs_process(native.ptr(x), native.ptr(out), x.numel() // V, V, float(temperature),
                       0 if top_k is None else int(top_k), 1.0 if top_p is None else float(top_p)) != 0:
        raise MemoryError("relaxspec sampler: out of memory processing logits")
    return out


def sample(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """[R] int64: one index per row of float32 CPU weights [R, V] by inverse CDF at uniforms u [R]."""
    w = weights.contiguous()
    u = u.to(torch.float64).contiguous()
    index = torch.empty(w.shape[0], dtype=torch.int64, device=w.device)
    _lib.rs_sample(native.ptr(w), native.ptr(u), native.ptr(index), w.shape[0], w.shape[-1])
    return index
