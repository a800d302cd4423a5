// Matrix-vector products for tvm_ollie.cpu.matmul's M == 1 and N == 1 calls (gemv.cc).
#ifndef TVM_OLLIE_GEMV_H_
#define TVM_OLLIE_GEMV_H_

#include <cstdint>

namespace tvm_ollie {

// How the matrix W of a product y = x W is stored.
enum class GemvForm {
  kRows,     // K rows of n: W(k, j) = w[k * ld + j] (B of A @ B; A of A' @ b)
  kColumns,  // n rows of K: W(k, j) = w[j * ld + k] (B' of A @ B'; A of A @ b)
};

// The vector implementation a product runs with (the widest this CPU runs unless named).
using GemvFn = void (*)(const float* x, const float* w, int64_t K, int64_t n, int64_t ld,
                        GemvForm form, bool accumulate, float* y);

// y[j] = (accumulate ? y[j] : 0) + sum_k x[k] * W(k, j), for j < n and k < K; x and y
// contiguous. One thread: the product reads each element of W once, so memory bounds it.
void Gemv(const float* x, const float* w, int64_t K, int64_t n, int64_t ld, GemvForm form,
          bool accumulate, float* y);

// The implementations this CPU runs, best first ("avx2,baseline", say).
const char* GemvVectorsList();

}  // namespace tvm_ollie

#endif  // TVM_OLLIE_GEMV_H_
