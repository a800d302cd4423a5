// Kernel families with several vector implementations (softmax rows, matrix-vector products,
// activations): each file lists the ones this CPU runs, best first, and calls the first; tests
// run each one by name. The x86 guard, the lane mask, the exponential of the softmax and the
// activations, the list's entry, the lookup by name and the list of names live here, once, and
// the attribute that clones a plain loop for the widest vectors (norm, resize, lstm).
#ifndef TVM_OLLIE_VECTORS_H_
#define TVM_OLLIE_VECTORS_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

// OLLIE_X86_VECTORS: whether this compiler builds x86 intrinsics (immintrin.h, target
// attributes, __builtin_cpu_supports) for the implementations beyond the baseline.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define OLLIE_X86_VECTORS 1
#else
#define OLLIE_X86_VECTORS 0
#endif

// OLLIE_WIDEST_VECTORS: a plain loop built for AVX-512, AVX2 and the baseline, the widest one
// the CPU runs chosen when the library loads (the library itself is compiled for the baseline
// x86-64, whose loops run 4 floats at a time); elsewhere as the compiler builds it. For loops
// the compiler vectorizes on its own; the families with intrinsics list their implementations
// (Vectors below) instead. Check the clones' object code (objdump -d) for ymm/zmm loops.
#if OLLIE_X86_VECTORS
#define OLLIE_WIDEST_VECTORS __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define OLLIE_WIDEST_VECTORS
#endif

namespace tvm_ollie {

#if OLLIE_X86_VECTORS
// A helper of the AVX2 + FMA implementations, inlined into them (their own target attribute).
#define OLLIE_AVX2 __attribute__((target("avx2,fma"), always_inline)) inline

// Whether this CPU runs the OLLIE_AVX2 implementations (AVX2 and FMA).
inline bool CpuRunsAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// The lanes [0, m) of an 8-lane vector as a mask, m in [0, 8].
OLLIE_AVX2 __m256i FirstLanes(int64_t m) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(m)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// exp(x) on 8 lanes, x <= 0: k = round(x log2(e)) by the 1.5 * 2^23 shift (whose low mantissa
// bits are then k + 127, 2^k's exponent bits), r = x - k ln(2) (ln 2 split in two, products
// exact by FMA), e^r by ExpNonPositive's degree-7 Taylor polynomial, times 2^k. Below -87
// (where 2^k would leave the normal range) the result is 0; a NaN stays NaN (the comparison with
// -87 is false for it).
OLLIE_AVX2 __m256 Exp8(__m256 x) {
  const __m256 shift = _mm256_set1_ps(12582912.0f + 127.0f);
  const __m256 kb = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), shift);
  const __m256 k = _mm256_sub_ps(kb, shift);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // k in [-126, 0] for x >= -87: the low mantissa bits of kb are k + 127 (2^22 above them
  // shifts out), the biased exponent of the normal float 2^k
  p = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(kb), 23)));
  return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ), p);
}
#endif

// exp(x) for x <= 0 (a softmax row shifted by its max, exp(-|x|) of an activation), in a form
// the compiler vectorizes:
// 2^t with t = x log2(e) split into round(t) and r in [-1/2, 1/2], 2^r by its Taylor polynomial
// of degree 7 (relative error below 1e-8 on that range, under float32's rounding), the integer
// part added to the exponent bits. Below -87 (exp < 2^-126, float32's smallest normal) it is 0;
// a NaN stays NaN (a row of -inf: -inf - -inf).
inline __attribute__((always_inline)) float ExpNonPositive(float x) {
  const float t = std::max(x, -87.0f) * 1.44269504088896341f;
  // round to nearest by the 1.5 * 2^23 shift (|t| <= 126): plain arithmetic, no libm call
  const float k = (t + 12582912.0f) - 12582912.0f;
  const float r = (t - k) * 0.693147180559945309f;  // 2^(t - k) = e^r
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &p, sizeof(bits));
  bits += static_cast<int32_t>(k) * (1 << 23);
  std::memcpy(&p, &bits, sizeof(bits));
  return x < -87.0f ? 0.0f : p;
}

// One implementation of a family: its name ("avx2", "baseline", ...) and its function.
template <typename Fn>
struct Vectors {
  const char* name;
  Fn fn;
};

// The implementation named `name` in `available`, or nullptr when the CPU does not run it.
template <typename Fn>
Fn NamedVectors(const std::vector<Vectors<Fn>>& available, const std::string& name) {
  for (const Vectors<Fn>& v : available) {
    if (name == v.name) return v.fn;
  }
  return nullptr;
}

// The names of `available`, in order, joined by `sep` ("avx2,baseline", say).
template <typename Fn>
std::string VectorsNames(const std::vector<Vectors<Fn>>& available, const char* sep) {
  std::string s;
  for (const Vectors<Fn>& v : available) s += (s.empty() ? "" : sep) + std::string(v.name);
  return s;
}

// The implementation named `name` in `available`; when the CPU does not run it, a ValueError
// of `fn` (the exported function asked for it) naming the ones it runs, joined by `sep`.
template <typename Fn>
Fn RequireVectors(const std::vector<Vectors<Fn>>& available, const std::string& name,
                  const char* fn, const char* sep) {
  if (Fn f = NamedVectors(available, name)) return f;
  TVM_FFI_THROW(ValueError) << fn << ": vectors '" << name
                            << "' not available on this CPU (it runs "
                            << VectorsNames(available, sep) << ")";
}

}  // namespace tvm_ollie

#endif  // TVM_OLLIE_VECTORS_H_
