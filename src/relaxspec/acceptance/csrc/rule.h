/* A rule's math in C (Rule.native_test: one file per rule in rules/, acceptance/base.py says what each computes):
   the functions its file defines, declared here so that the compiler checks them. The rule's library defines
   RULE_RESIDUAL where Rule.native_residual is set, RULE_BONUS where Rule.native_bonus is (a function defined
   without its macro is unused: an error in tests/project/test_native_build.py's build). The helpers they may call
   (capped, sum, max, exp_nonpositive, neg_entropy, jsd, total_variation, accept_or_strict, top_candidate_test)
   are sampler_core.c's. */
#ifndef RELAXSPEC_RULE_H
#define RELAXSPEC_RULE_H

static inline float rule_test(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                              const double *prm, float in);
#ifdef RULE_RESIDUAL
static int rule_residual(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                         const double *prm, float *out);
#endif
#ifdef RULE_BONUS
static int rule_bonus(const float *p, const float *z, const float *zq, int64_t V, const double *prm, float *out);
#endif

#endif
