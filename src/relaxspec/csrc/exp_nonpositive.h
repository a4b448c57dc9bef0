/* exp(x) in float32 for x <= 0 (-inf included): the kernels' shared exp (needs <stdint.h> and <string.h>). */
#ifndef RELAXSPEC_EXP_NONPOSITIVE_H
#define RELAXSPEC_EXP_NONPOSITIVE_H

/* exp(x) in float32 for x <= 0 (-inf included), within ~1 ulp: Cephes' expf, written so that loops over it
   vectorise (2^n as two normal factors, so results down to the smallest subnormal, 0 below) */
static inline float exp_nonpositive(float x) {
    const float round = 12582912.0f;  /* 1.5 * 2^23: adding it rounds to an integer */
    float xc = x < -104.0f ? -104.0f : x;
    float n = (xc * 1.44269504088896341f + round) - round;
    float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;
    int32_t b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    return x < -103.972077f ? 0.0f : y * s1 * s2;
}

#endif
