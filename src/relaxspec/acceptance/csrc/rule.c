/* A rule's library (acceptance/fused.py, rule_library): the sampler's verify loop with the rule's own math in C,
   RULE_FILE (rules/<rule>.c), in place of strict's. Its interface: rs_verify_default in sampler.h. Built with
   RULE_TEST defined, and RULE_RESIDUAL, RULE_BONUS where the rule has them in C. */

/* A rule's float32 operations rounded one by one, as torch's are (a * b + c not fused into one rounding:
   -march=native has FMA), so that its C gives torch's values where it does the same operations. */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize ("fp-contract=off")
#endif

#include "sampler_core.c"
#include "rule.h"
#include RULE_FILE
#include "verify_loop.c"
