/* The sampler's library (acceptance/fused.py): its interface is sampler.h; strict's test in the verify loop. */
#include "sampler_core.c"
#include "verify_loop.c"

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
