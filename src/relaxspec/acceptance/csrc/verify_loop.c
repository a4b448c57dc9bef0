/* The verify loop in one call (rs_verify_default), with strict's test or a rule's own (rule.c). Included by
   sampler.c and rule.c after sampler_core.c. */
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
#ifndef RULE_BONUS
    (void)zq_rows;  /* read by a rule's own bonus only */
#endif
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
