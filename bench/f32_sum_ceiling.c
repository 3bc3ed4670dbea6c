/* How fast can an f32 sum run on this core, exact or nearly?  (issue 10, sum(-1) / sum(0) rows)

   lazycandle's f32 sums first widened every element to f64 (the f64 sum rounded once); on Zen 4
   that was bound by the conversions, so codegen/reduce.py now adds PAIRED = 4 registers in f32
   before each widening (pair4_f32 below).  This program times hand-written AVX-512 loops over
   one f32 array, in GB/s of input:

     exact   cvt_zmm     vcvtps2pd 8 -> 8 lanes, 4 f64 accumulators (lazycandle's old loop; the
                         4 -> 4 lane form ran at the same rate: the conversion unit, not the
                         register width, is the limit)
     exact   twosum4     4 loads added in f32 by error-free TwoSums (half of the adds as
                         FMAs x*1+y, on the other pipes), the sum and the f32 error sum widened
     exact   int_widen   f32 bits placed into f64 bits with integer ops (x 2^-896, scaled back
                         once): no conversion instruction at all
     inexact pair2_f32   2 loads added in f32, then widened (f64 partials per 2 elements)
     inexact pair4_f32   4 loads added in f32 as a tree, then widened (lazycandle's loop now)
     inexact plain_f32   4 f32 accumulators (torch's and NumPy's kind of sum)

   Each "exact" line also checks its result against a long double sum.

     gcc -O2 -march=native bench/f32_sum_ceiling.c -o /tmp/f32_sum_ceiling && /tmp/f32_sum_ceiling

   Sizes: 64 KiB (L2), 1 MiB (L2/L3), 16 MiB (L3, the bench's 4096 x 1024).  Needs AVX-512. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifndef __AVX512F__
int main(void) { puts("needs an AVX-512 host (compile with -march=native there)"); return 0; }
#else
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static volatile float ONE = 1.0f;   /* not a constant, so x*1+y stays an FMA */

static double hsum(__m512d a, __m512d b) { return _mm512_reduce_add_pd(_mm512_add_pd(a, b)); }

static double cvt_zmm(const float *x, long n) {
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    for (long i = 0; i < n; i += 32) {
        a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm256_loadu_ps(x + i)));
        a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8)));
        a2 = _mm512_add_pd(a2, _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 16)));
        a3 = _mm512_add_pd(a3, _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 24)));
    }
    return hsum(a0, a1) + hsum(a2, a3);
}

/* s + e == a + b exactly (Knuth's TwoSum; two of its six adds as FMAs with 1) */
#define TWOSUM(a, b, s, e) do { s = _mm512_fmadd_ps(a, one, b); __m512 bp_ = _mm512_sub_ps(s, a); \
    __m512 ap_ = _mm512_fnmadd_ps(bp_, one, s); \
    e = _mm512_add_ps(_mm512_fnmadd_ps(ap_, one, a), _mm512_sub_ps(b, bp_)); } while (0)

static __m512d widen_lo(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
static __m512d widen_hi(__m512 v) { return _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)); }

static double twosum4(const float *x, long n) {
    const __m512 one = _mm512_set1_ps(ONE);
    __m512d a0 = _mm512_setzero_pd(), a1 = a0;
    __m512 err = _mm512_setzero_ps();
    for (long i = 0; i < n; i += 64) {
        __m512 s1, e1, s2, e2, s, e3;
        TWOSUM(_mm512_loadu_ps(x + i), _mm512_loadu_ps(x + i + 16), s1, e1);
        TWOSUM(_mm512_loadu_ps(x + i + 32), _mm512_loadu_ps(x + i + 48), s2, e2);
        TWOSUM(s1, s2, s, e3);
        err = _mm512_fmadd_ps(_mm512_add_ps(e1, e2), one, _mm512_add_ps(err, e3));
        a0 = _mm512_add_pd(a0, widen_lo(s));
        a1 = _mm512_add_pd(a1, widen_hi(s));
    }
    return hsum(_mm512_add_pd(a0, widen_lo(err)), _mm512_add_pd(a1, widen_hi(err)));
}

/* the f32 bits in the high half of a qword, shifted right by 3 without the sign and the sign
   put back in bit 63, are x 2^-896 as an f64 (normal and subnormal x; inf / NaN would need a
   check beside it) */
static __m512d int_widen1(__m512i hi_half, __m512i sign) {
    __m512i mag = _mm512_srli_epi64(_mm512_andnot_si512(sign, hi_half), 3);
    return _mm512_castsi512_pd(_mm512_or_si512(_mm512_and_si512(sign, hi_half), mag));
}

static double int_widen(const float *x, long n) {
    const __m512i z = _mm512_setzero_si512(), sign = _mm512_set1_epi64((long long)0x8000000000000000ULL);
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    for (long i = 0; i < n; i += 32) {
        __m512i b0 = _mm512_loadu_si512(x + i), b1 = _mm512_loadu_si512(x + i + 16);
        a0 = _mm512_add_pd(a0, int_widen1(_mm512_unpacklo_epi32(z, b0), sign));
        a1 = _mm512_add_pd(a1, int_widen1(_mm512_unpackhi_epi32(z, b0), sign));
        a2 = _mm512_add_pd(a2, int_widen1(_mm512_unpacklo_epi32(z, b1), sign));
        a3 = _mm512_add_pd(a3, int_widen1(_mm512_unpackhi_epi32(z, b1), sign));
    }
    return (hsum(a0, a1) + hsum(a2, a3)) * 0x1p896;
}

static double pair4_f32(const float *x, long n) {
    __m512d a0 = _mm512_setzero_pd(), a1 = a0;
    for (long i = 0; i < n; i += 64) {
        __m512 p = _mm512_add_ps(_mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(x + i + 16)),
                                 _mm512_add_ps(_mm512_loadu_ps(x + i + 32), _mm512_loadu_ps(x + i + 48)));
        a0 = _mm512_add_pd(a0, widen_lo(p));
        a1 = _mm512_add_pd(a1, widen_hi(p));
    }
    return hsum(a0, a1);
}

static double pair2_f32(const float *x, long n) {
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    for (long i = 0; i < n; i += 64) {
        __m512 p = _mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(x + i + 16));
        __m512 q = _mm512_add_ps(_mm512_loadu_ps(x + i + 32), _mm512_loadu_ps(x + i + 48));
        a0 = _mm512_add_pd(a0, widen_lo(p));
        a1 = _mm512_add_pd(a1, widen_hi(p));
        a2 = _mm512_add_pd(a2, widen_lo(q));
        a3 = _mm512_add_pd(a3, widen_hi(q));
    }
    return hsum(a0, a1) + hsum(a2, a3);
}

static double plain_f32(const float *x, long n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (long i = 0; i < n; i += 64) {
        a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + i));
        a1 = _mm512_add_ps(a1, _mm512_loadu_ps(x + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_loadu_ps(x + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_loadu_ps(x + i + 48));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

typedef double (*SumFn)(const float *, long);
static const struct { const char *name; SumFn fn; int exact; } FORMS[] = {
    {"cvt_zmm", cvt_zmm, 1}, {"twosum4", twosum4, 1},
    {"int_widen", int_widen, 1}, {"pair2_f32", pair2_f32, 0}, {"pair4_f32", pair4_f32, 0}, {"plain_f32", plain_f32, 0}};
#define NFORMS (sizeof FORMS / sizeof FORMS[0])

int main(void) {
    const long sizes[] = {16384, 262144, 4194304};
    for (int s = 0; s < 3; s++) {
        long n = sizes[s];
        float *x = aligned_alloc(64, n * sizeof(float));
        long double want = 0;
        srand(1);
        for (long i = 0; i < n; i++) {        /* +-150, zeros, subnormals, values 1e20 apart */
            x[i] = (float)((rand() / (double)RAND_MAX - 0.5) * 300);
            if (i % 7 == 0) x[i] = 0;
            if (i % 11 == 0) x[i] *= 1e-40f;
            if (i % 13 == 0) x[i] *= 1e20f;
            want += x[i];
        }
        long reps = (1L << 31) / (n * 4);
        double best[NFORMS], sink = 0;
        for (unsigned k = 0; k < NFORMS; k++) best[k] = 1e30;
        for (int round = 0; round < 9; round++)        /* the forms rotate within each round */
            for (unsigned k = 0; k < NFORMS; k++) {
                double t0 = now();
                for (long r = 0; r < reps; r++) sink += FORMS[k].fn(x, n) * 1e-30;
                double dt = now() - t0;
                if (dt < best[k]) best[k] = dt;
            }
        printf("%8ld KiB:", n * 4 / 1024);
        for (unsigned k = 0; k < NFORMS; k++) {
            double got = FORMS[k].fn(x, n);
            printf("  %s %.1f GB/s%s", FORMS[k].name, reps * n * 4 / best[k] / 1e9,
                   FORMS[k].exact && (float)got != (float)want ? " (WRONG)" : "");
        }
        printf("\n");
        free(x);
        if (sink == 42) puts("");
    }
    return 0;
}
#endif
