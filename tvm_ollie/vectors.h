// Kernel families with several vector implementations (softmax rows, matrix-vector products):
// each file lists the ones this CPU runs, best first, and calls the first; tests run each one
// by name. The x86 guard, the lane mask, the list's entry, the lookup by name and the list of
// names live here, once, and the attribute that clones a plain loop for the widest vectors
// (norm, resize, lstm).
#ifndef TVM_OLLIE_VECTORS_H_
#define TVM_OLLIE_VECTORS_H_

#include <cstdint>
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
#endif

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

}  // namespace tvm_ollie

#endif  // TVM_OLLIE_VECTORS_H_
