/* dyndq's compiled kernel: everything particular to a compiler or a CPU family, in one place.
   The other files of the kernel write DQ_INLINE, DQ_NOINLINE, DQ_AVX2, DQ_AVX512 and
   DQ_X86, never __attribute__, __declspec or a builtin, so that a port to another compiler
   (MSVC's names are here) or another CPU touches this file only.

   DQ_X86: the x86-64 vector variants are compiled in (not with DYNDQ_NO_SIMD defined, which
   builds the plain C variant alone: what a CPU of another family gets). */
#pragma once

#include <stdint.h>
#include <string.h>

#define DQ_STR_(x) #x
#define DQ_STR(x) DQ_STR_(x)

#if defined(_MSC_VER) && !defined(__clang__)
#define DQ_INLINE static __forceinline
#define DQ_NOINLINE __declspec(noinline)
#define DQ_TARGET(features) /* MSVC compiles any intrinsic anywhere: no per-function target */
#define DQ_COMPILER "MSVC " DQ_STR(_MSC_VER)
#else
#define DQ_INLINE static inline __attribute__((always_inline))
#define DQ_NOINLINE __attribute__((noinline))
#define DQ_TARGET(features) __attribute__((target(features)))
#if defined(__clang__)
#define DQ_COMPILER "clang " __clang_version__
#elif defined(__GNUC__)
#define DQ_COMPILER "gcc " __VERSION__
#else
#define DQ_COMPILER "unknown C compiler"
#endif
#endif

#if !defined(DYNDQ_NO_SIMD) && (defined(__x86_64__) || defined(_M_X64)) && \
    (defined(__GNUC__) || defined(__clang__) || defined(_MSC_VER))
#define DQ_X86 1
#include <immintrin.h>
#if defined(_MSC_VER) && !defined(__clang__)
#include <intrin.h>
#endif

/* The two vector targets: what each level may use (level 1: AVX2 and F16C; level 2: AVX-512
   F, BW and VL besides).  A function compiled for one is only called once dq_cpu_level()
   says the CPU has it. */
#define DQ_AVX2 DQ_TARGET("avx2,f16c")
#define DQ_AVX512 DQ_TARGET("avx512f,avx512bw,avx512vl,avx2,f16c")

/* cpuid and xgetbv, each compiler's way */
#if defined(_MSC_VER) && !defined(__clang__)
static void dq_cpuid(int leaf, unsigned r[4]) { __cpuidex((int *)r, leaf, 0); }
static unsigned long long dq_xgetbv(void) { return _xgetbv(0); }
#else
#include <cpuid.h>
static void dq_cpuid(int leaf, unsigned r[4]) { __cpuid_count(leaf, 0, r[0], r[1], r[2], r[3]); }
static unsigned long long dq_xgetbv(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

/* The highest level this CPU, and its operating system (which must save the wider registers:
   XCR0), let us use: 0 plain C, 1 AVX2 + F16C, 2 AVX-512 F/BW/VL besides. */
static int dq_cpu_level(void) {
    unsigned r[4];
    dq_cpuid(0, r);
    if (r[0] < 7) return 0;
    dq_cpuid(1, r);
    const int osxsave = (r[2] >> 27) & 1, avx = (r[2] >> 28) & 1, f16c = (r[2] >> 29) & 1;
    if (!osxsave || !avx || !f16c) return 0;
    const unsigned long long xcr0 = dq_xgetbv();
    dq_cpuid(7, r);
    const int avx2 = (r[1] >> 5) & 1, avx512f = (r[1] >> 16) & 1, avx512bw = (r[1] >> 30) & 1,
              avx512vl = (r[1] >> 31) & 1;
    if (!avx2 || (xcr0 & 0x6) != 0x6) return 0;                      /* SSE and AVX state */
    return avx512f && avx512bw && avx512vl && (xcr0 & 0xE6) == 0xE6 ? 2 : 1; /* + opmask, ZMM state */
}

/* non-temporal stores made visible before a call returns */
static void dq_store_fence(void) { _mm_sfence(); }
#else
static int dq_cpu_level(void) { return 0; }
#endif
