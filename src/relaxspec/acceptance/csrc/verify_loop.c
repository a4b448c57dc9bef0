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

/* The verify loop for a rule with strict's bonus (Rule.bonus) or its own in C (its arguments: the fields of args),
   from the blocks p [B, N+1, V], q [B, N, V], the verifier's raw logits z [B, N+1, V] and the drafter's zq [B,
   zq_rows, V] (float32, strides (sp0, sp1), (sq0, sq1), (sz0, sz1), (szq0, szq1), unit along V; z and zq may be NULL
   for a rule that does not read them), in one call: rs_first_rejection on the rule's ap (and strict, or NULL; row
   strides sa, ss), or, ap NULL, on ap_out[b, i] = rule_test at each draft x = drafts[b, i] (row stride sd), with its
   input inp[b * sinp + i] (inp NULL: 0; every inp[b, i] first checked to lie in [inp_low, inp_high], as floats, NaN
   refused: -4 otherwise) (strict's min(1, p(x) / q(x)), 0 where q(x) <= 0, at_tokens and capped_ratio's float32
   values, in the sampler's library) with strict_out[b, i] = strict's test beside it where strict_out is not NULL;
   then rs_finish's token: the residual of a row stopped at a rejection at its position n[b] is the rule's own
   (RULE_RESIDUAL), else (p - q)+ (float32, as torch's (p - q).clamp_min_(0)), p there where it has no mass (argmax
   0), or (argmax 1, Rule.residual_argmax) one-hot on the first largest p there, whose sample is that index at any u;
   the bonus is the rule's own (RULE_BONUS, the drafter's row min(num_drafts[b], zq_rows - 1)), else p, at the row's
   bonus position (num_drafts[b], or N); sampled at ut[b * st0 + n[b] * st1] (st1 0: one uniform per row). ua: the
   acceptance uniforms, row stride sua. Returns 0, -1 when memory runs out, -2 for a draft outside [0, V), -3 where
   the rule's C declined the block (nothing drawn from is changed: the outputs are then unspecified), -4 for an input
   outside its range (nothing written). */
int rs_verify_default(const struct rs_verify_default_args *args) {
    struct rs_verify_default_args a = *args;  /* (ap, sa, strict, ss: replaced by the outputs once computed) */
#define Z_AT(b, i) (a.z ? a.z + (b) * a.sz0 + (i) * a.sz1 : NULL)
#define ZQ_AT(b, i) (a.zq ? a.zq + (b) * a.szq0 + (i) * a.szq1 : NULL)
    if (a.inp) {  /* as torch compares a float32 tensor with its bounds: in float32 */
        const float lo = (float)a.inp_low, hi = (float)a.inp_high;
        for (int64_t b = 0; b < a.B; b++)
            for (int64_t i = 0; i < a.N; i++) {
                const float v = a.inp[b * a.sinp + i];
                if (!(v >= lo && v <= hi)) return -4;
            }
    }
    for (int64_t b = 0; b < a.B && !a.ap; b++)
        for (int64_t i = 0; i < a.N; i++) {
            const int64_t x = a.drafts[b * a.sd + i];
            if (x < 0 || x >= a.V) return -2;
            const float *pr = a.p + b * a.sp0 + i * a.sp1, *qr = a.q + b * a.sq0 + i * a.sq1;
            const float test = rule_test(pr, qr, Z_AT(b, i), ZQ_AT(b, i), a.V, x, a.prm,
                                         a.inp ? a.inp[b * a.sinp + i] : 0.0f);
            if (test != test) return -3;  /* NaN: declined */
            a.ap_out[b * a.N + i] = test;
            if (a.strict_out) a.strict_out[b * a.N + i] = capped(pr[x], qr[x]);
        }
    if (!a.ap) {
        a.ap = a.ap_out, a.sa = a.N;
        if (a.strict_out) a.strict = a.strict_out, a.ss = a.N;
    }
    double *cdf = malloc(a.V * sizeof(double));
    float *residual = malloc(a.V * sizeof(float));
    int status = -1;
    if (!cdf || !residual) goto done;
    status = -3;
    for (int64_t b = 0; b < a.B; b++) {
        const int64_t proposed = a.num_drafts ? a.num_drafts[b] : a.N;
        a.n[b] = reject_row(a.ua + b * a.sua, a.ap + b * a.sa, a.strict ? a.strict + b * a.ss : NULL, proposed, a.N,
                            a.accepted + b * a.N, a.kept + b * a.N, a.relaxed + b * a.N);
        const float *row = a.p + b * a.sp0 + proposed * a.sp1;
        if (a.n[b] < proposed && a.argmax) {
            const float *pr = a.p + b * a.sp0 + a.n[b] * a.sp1;
            int64_t best = 0;
            for (int64_t i = 1; i < a.V; i++) best = pr[i] > pr[best] ? i : best;
            a.last[b] = best;
            emit(b, a.N, a.n[b], a.drafts, a.sd, best, a.tokens);
            continue;
        }
        if (a.n[b] < proposed) {
            const float *pr = a.p + b * a.sp0 + a.n[b] * a.sp1, *qr = a.q + b * a.sq0 + a.n[b] * a.sq1;
#ifdef RULE_RESIDUAL
            if (rule_residual(pr, qr, Z_AT(b, a.n[b]), ZQ_AT(b, a.n[b]), a.V, a.drafts[b * a.sd + a.n[b]], a.prm,
                              residual) != 0)
                goto done;
#else
            for (int64_t i = 0; i < a.V; i++) {
                const float r = pr[i] - qr[i];
                residual[i] = r < 0.0f ? 0.0f : r;
            }
#endif
            row = sum(residual, a.V) > 0.0 ? residual : pr;
        }
#ifdef RULE_BONUS
        else {
            if (rule_bonus(row, Z_AT(b, proposed), ZQ_AT(b, proposed < a.zq_rows ? proposed : a.zq_rows - 1), a.V,
                           a.prm, residual) != 0)
                goto done;
            row = residual;
        }
#endif
        a.last[b] = sample_row(row, a.ut[b * a.st0 + a.n[b] * a.st1], cdf, a.V);
        emit(b, a.N, a.n[b], a.drafts, a.sd, a.last[b], a.tokens);
    }
    status = 0;
done:
    free(residual);
    free(cdf);
    return status;
#undef Z_AT
#undef ZQ_AT
}
