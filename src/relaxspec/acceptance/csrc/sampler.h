/* The sampler's interface (acceptance/fused.py reads its ctypes signatures from these prototypes and its argument
   structs from these definitions; every pointer is a tensor's data pointer). sampler.c defines all of them; a
   rule's library (rule.c) rs_process, rs_sample, rs_first_rejection, rs_finish and rs_verify_default. What each
   computes: beside its definition. */
#ifndef RELAXSPEC_SAMPLER_H
#define RELAXSPEC_SAMPLER_H
#include <stdint.h>

/* The arguments of a function of more than 8, one struct each, filled by name (relaxspec.native.structs; a field's
   meaning: beside the function's definition). A row pointer and its row stride share a line. */
struct rs_first_rejection_args {
    const double *u; int64_t su;
    const float *ap; int64_t sa;
    const float *strict; int64_t ss;
    const int64_t *num_drafts;
    int64_t B, N;
    uint8_t *accepted, *kept, *relaxed;
    int64_t *n;
};
struct rs_finish_args {
    const int64_t *n, *num_drafts;
    int64_t B, N, V;
    const float *residual; int64_t sr;
    const float *p; int64_t sp;
    const float *bonus; int64_t sb;
    const double *u;
    const int64_t *drafts; int64_t sd;
    int64_t *tokens, *last;
};
struct rs_verify_default_args {
    const float *p; int64_t sp0, sp1;
    const float *q; int64_t sq0, sq1;
    const float *z; int64_t sz0, sz1;
    const float *zq; int64_t szq0, szq1, zq_rows;
    const float *inp; int64_t sinp; double inp_low, inp_high;
    const int64_t *drafts; int64_t sd;
    const int64_t *num_drafts;
    int64_t B, N, V;
    const float *ap; int64_t sa;
    const float *strict; int64_t ss;
    float *ap_out, *strict_out;
    const double *prm;
    const double *ua; int64_t sua;
    const double *ut; int64_t st0, st1;
    int64_t argmax;
    uint8_t *accepted, *kept, *relaxed;
    int64_t *n, *tokens, *last;
};

int rs_process(const float *logits, float *out, int64_t R, int64_t V, double temperature, int64_t top_k,
               double top_p);
int rs_sample(const float *w, const double *u, int64_t *index, int64_t R, int64_t V);
void rs_round_table(const uint32_t *low, const uint32_t *high, int64_t K, const int64_t *start, int64_t B,
                    int64_t W, const int64_t *col, double *out);
void rs_first_rejection(const struct rs_first_rejection_args *args);
int rs_finish(const struct rs_finish_args *args);
int rs_verify_default(const struct rs_verify_default_args *args);
int rs_at_tokens(const float *probs, int64_t s0, int64_t s1, int64_t V, const int64_t *x, int64_t A, int64_t B,
                 float *out);
void rs_capped_ratio(const float *num, const float *den, float *out, int64_t n);

#endif
