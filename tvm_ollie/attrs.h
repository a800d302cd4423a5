// Attribute strings ("key=value;..."), activations and shape helpers shared by the CPU library
// (libtvm_ollie_native) and the CUDA library (libtvm_ollie_cuda); no vendor dependency.
#ifndef TVM_OLLIE_ATTRS_H_
#define TVM_OLLIE_ATTRS_H_

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tvm_ollie {

// ---------------------------------------------------------------------------------------------
// Attributes: "key=value;key=value". Every key must be consumed by the kernel (strict parsing).
class Attrs {
 public:
  Attrs(const std::string& kernel, const std::string& text);
  bool Has(const std::string& key) const { return values_.count(key) != 0; }
  // Typed getters mark the key as used; a bad value throws ValueError.
  bool GetBool(const std::string& key, bool dflt);
  int64_t GetInt(const std::string& key, int64_t dflt);
  std::vector<int64_t> GetInts(const std::string& key, size_t n, std::vector<int64_t> dflt);
  std::string GetStr(const std::string& key, const std::string& dflt,
                     const std::vector<std::string>& allowed);
  std::string GetRaw(const std::string& key, const std::string& dflt);
  // Throws ValueError naming every key that no getter asked for.
  void CheckAllUsed() const;
  const std::string& kernel() const { return kernel_; }

 private:
  [[noreturn]] void Bad(const std::string& key, const std::string& why) const;
  std::string kernel_;
  std::string text_;
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> used_;
};

// ---------------------------------------------------------------------------------------------
// Activations (applied after bias and residual).
// New kinds go last: the CUDA epilogue's codes (cuda_epilogue.h) are these values.
enum class Act {
  kNone,
  kRelu,
  kClip,
  kSigmoid,
  kTanh,
  kGelu,
  kGeluTanh,
  kSilu,
  kHardswish,    // x * clip(alpha * x + beta, 0, 1)
  kHardsigmoid,  // clip(alpha * x + beta, 0, 1)
  kLeakyRelu,    // x > 0 ? x : alpha * x
  kScale,        // alpha * x (a product by a constant after the kernel, e.g. attention's 1/sqrt(d))
};

struct Activation {
  Act kind = Act::kNone;
  float lo = 0.f, hi = 0.f;        // clip bounds
  float alpha = 0.f, beta = 0.f;   // hardswish/hardsigmoid (alpha, beta), leaky_relu, scale
                                   // (alpha)
  std::string text = "none";
};

// Parses "none|relu|clip_LO_HI|sigmoid|tanh|gelu|gelu_tanh|silu|hardswish_A_B|
// hardsigmoid_A_B|leaky_relu_A|scale_A"; throws ValueError.
Activation ParseActivation(const Attrs& attrs, const std::string& value);
// Decimal integer / float parsing of a whole string (false on trailing text or overflow; NaN is
// rejected, infinities are accepted).
bool ParseInt(const std::string& s, int64_t* out);
bool ParseFloat(const std::string& s, float* out);

// Shape helpers.
std::string ShapeStr(const tvm::ffi::TensorView& t);
std::vector<int64_t> Dims(const tvm::ffi::TensorView& t);

// A (batched) GEMM Out = op(A) @ op(B) after its shape checks: the batch dims of A and B padded
// with 1s on the left to rank nb and broadcast to `batch` (`count` matrices), and M, N, K.
struct GemmShape {
  std::vector<int64_t> a_batch, b_batch, batch;  // all of length nb
  int64_t M = 0, N = 0, K = 0, count = 1;
};

// Checks A [..., M, K] (ta: [..., K, M]), B [..., K, N] (tb: [..., N, K]) and Out
// [batch..., M, N]; throws ValueError naming `kernel`. Shared by the CPU and CUDA GEMMs.
GemmShape CheckGemmShapes(const char* kernel, bool ta, bool tb, const tvm::ffi::TensorView& A,
                          const tvm::ffi::TensorView& B, const tvm::ffi::TensorView& Out);

}  // namespace tvm_ollie

#endif  // TVM_OLLIE_ATTRS_H_
