// tvm_ollie.cuda.matmul / tvm_ollie.cuda.batch_matmul: Out = act(A' @ B' + bias + residual),
// float32 on a CUDA device, batched with numpy-style broadcasting of the leading dims, cuBLAS.
//
// Calling convention (destination-passing style, Out last), as tvm_ollie.cpu.matmul:
//   tvm_ollie.cuda.matmul(attrs: str, A, B, [bias], [residual], Out)
// attrs: ta=0|1 (A stored [..., K, M]), tb=0|1 (B stored [..., N, K]), bias=0|1, res=0|1,
//        act=none|relu|clip_LO_HI|sigmoid|tanh|gelu|gelu_tanh|silu (as the CPU kernel),
//        math=fp32|tf32 (fp32: IEEE single precision, the default; tf32: tensor cores with
//        10-bit mantissa inputs, faster and less exact).
// tvm_ollie.cuda.batch_matmul is the same kernel for operands that are both batched (rank >= 3),
// the form of Relax's batched matmuls; it rejects a 2-D operand.
//
// Row-major C = A @ B is the column-major product C^T = B^T A^T, so cuBLAS gets (B, A) with
// m = N, n = M. Batches: one GEMM with the batch folded into M when B is shared and A is not
// transposed; one strided-batched GEMM when each operand is either fully batched or shared
// (stride 0); otherwise one GEMM per batch element. The residual: when it is Out itself the
// GEMM accumulates into it (beta = 1); otherwise the epilogue kernel adds it with the bias and
// applies the activation in one pass.
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cuda_common.h"

namespace tvm_ollie {
namespace cuda {

namespace ffi = tvm::ffi;

namespace {

constexpr const char* kMatmul = "tvm_ollie.cuda.matmul";
constexpr const char* kBatchMatmul = "tvm_ollie.cuda.batch_matmul";

struct GemmParams {
  bool ta = false, tb = false, has_bias = false, has_res = false, tf32 = false;
  Activation act;
};

GemmParams ParseGemmAttrs(const char* kernel, const std::string& text) {
  Attrs attrs(kernel, text);
  GemmParams p;
  p.ta = attrs.GetBool("ta", false);
  p.tb = attrs.GetBool("tb", false);
  p.has_bias = attrs.GetBool("bias", false);
  p.has_res = attrs.GetBool("res", false);
  p.act = ParseActivation(attrs, attrs.GetRaw("act", "none"));
  p.tf32 = attrs.GetStr("math", "fp32", {"fp32", "tf32"}) == "tf32";
  attrs.CheckAllUsed();
  return p;
}

int AsInt(int64_t v, const char* kernel) {
  if (v > std::numeric_limits<int>::max()) {
    TVM_FFI_THROW(ValueError) << kernel << ": dimension " << v << " too large for cuBLAS";
  }
  return static_cast<int>(v);
}

bool AllOnes(const std::vector<int64_t>& d) {
  return std::all_of(d.begin(), d.end(), [](int64_t v) { return v == 1; });
}

// Element offset of batch element `flat` (row-major over `batch`) in an operand with batch dims
// `dims` (size-1 dims broadcast) and matrices of `mat` elements.
int64_t BatchOffset(int64_t flat, const std::vector<int64_t>& batch,
                    const std::vector<int64_t>& dims, int64_t mat) {
  int64_t off = 0, stride = mat;
  for (int i = static_cast<int>(batch.size()) - 1; i >= 0; --i) {
    const int64_t idx = flat % batch[i];
    flat /= batch[i];
    if (dims[i] != 1) off += idx * stride;
    stride *= dims[i];
  }
  return off;
}

// The GEMMs: Out[b] (+)= A'[b] @ B'[b] for every batch element, beta 0 or 1.
void RunGemms(const char* kernel, const GemmParams& p, const GemmShape& pr, const float* a,
              const float* b, float beta, float* out, cublasHandle_t h) {
  const CublasApi& api = Cublas();
  CheckCublas(api.SetMathMode(h, p.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
              kernel, "cublasSetMathMode");
  const float alpha = 1.f;
  const cublasOperation_t op_a = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int n = AsInt(pr.N, kernel), k = AsInt(pr.K, kernel);
  const int lda = AsInt(p.ta ? pr.M : pr.K, kernel), ldb = AsInt(p.tb ? pr.K : pr.N, kernel);
  const bool b_shared = AllOnes(pr.b_batch), a_shared = AllOnes(pr.a_batch);
  const bool a_full = pr.a_batch == pr.batch, b_full = pr.b_batch == pr.batch;
  if (pr.count == 1 || (b_shared && a_full && !p.ta)) {
    // One GEMM: the batch of A (stored [batch*M, K]) folded into M.
    const int m = AsInt(pr.M * pr.count, kernel);
    CheckCublas(api.Sgemm(h, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, out, n),
                kernel, "cublasSgemm");
  } else if ((a_full || a_shared) && (b_full || b_shared)) {
    const int m = AsInt(pr.M, kernel), count = AsInt(pr.count, kernel);
    const long long sa = a_shared ? 0 : pr.M * pr.K, sb = b_shared ? 0 : pr.K * pr.N;
    CheckCublas(api.SgemmStridedBatched(h, op_b, op_a, n, m, k, &alpha, b, ldb, sb, a, lda, sa,
                                        &beta, out, n, pr.M * pr.N, count),
                kernel, "cublasSgemmStridedBatched");
  } else {
    const int m = AsInt(pr.M, kernel);
    for (int64_t i = 0; i < pr.count; ++i) {
      const float* ai = a + BatchOffset(i, pr.batch, pr.a_batch, pr.M * pr.K);
      const float* bi = b + BatchOffset(i, pr.batch, pr.b_batch, pr.K * pr.N);
      CheckCublas(api.Sgemm(h, op_b, op_a, n, m, k, &alpha, bi, ldb, ai, lda, &beta,
                            out + i * pr.M * pr.N, n),
                  kernel, "cublasSgemm");
    }
  }
}

void Gemm(const char* kernel, bool batched_only, ffi::PackedArgs args) {
  if (args.size() < 1) TVM_FFI_THROW(TypeError) << kernel << ": missing attrs";
  auto text = args[0].try_cast<ffi::String>();
  if (!text.has_value()) {
    TVM_FFI_THROW(TypeError) << kernel << ": first argument must be the attrs string";
  }
  const GemmParams p = ParseGemmAttrs(kernel, std::string(text.value()));
  const int want = 4 + (p.has_bias ? 1 : 0) + (p.has_res ? 1 : 0);
  if (args.size() != want) {
    TVM_FFI_THROW(TypeError) << kernel << ": expected " << want << " arguments (attrs, A, B"
                             << (p.has_bias ? ", bias" : "") << (p.has_res ? ", residual" : "")
                             << ", Out), got " << args.size();
  }
  auto tensor = [&](int i, const char* what) {
    auto t = args[i].try_cast<ffi::TensorView>();
    if (!t.has_value()) TVM_FFI_THROW(TypeError) << kernel << ": " << what << " must be a tensor";
    return t.value();
  };
  int device = -1, i = 1;
  const int min_rank = batched_only ? 3 : 2;
  ffi::TensorView A = tensor(i++, "A"), B = tensor(i++, "B");
  const float* a = CheckCudaTensor(A, kernel, "A", min_rank, &device);
  const float* b = CheckCudaTensor(B, kernel, "B", min_rank, &device);
  const float *bias = nullptr, *res = nullptr;
  std::optional<ffi::TensorView> Bias, Res;
  if (p.has_bias) {
    Bias = tensor(i++, "bias");
    bias = CheckCudaTensor(*Bias, kernel, "bias", 1, &device);
  }
  if (p.has_res) {
    Res = tensor(i++, "residual");
    res = CheckCudaTensor(*Res, kernel, "residual", 0, &device);
  }
  ffi::TensorView Out = tensor(i++, "Out");
  float* out = CheckCudaTensor(Out, kernel, "Out", 2, &device);
  const GemmShape pr = CheckGemmShapes(kernel, p.ta, p.tb, A, B, Out);
  if (Bias.has_value() && Dims(*Bias) != std::vector<int64_t>{pr.N}) {
    TVM_FFI_THROW(ValueError) << kernel << ": bias has shape " << ShapeStr(*Bias)
                              << ", expected [" << pr.N << "]";
  }
  if (Res.has_value() && Dims(*Res) != Dims(Out)) {
    TVM_FFI_THROW(ValueError) << kernel << ": residual has shape " << ShapeStr(*Res)
                              << ", expected Out's shape " << ShapeStr(Out);
  }
  RequireCublas(kernel);
  if (Out.numel() == 0) return;
  DeviceScope scope(device, kernel);
  cudaStream_t stream = CurrentStream(device);
  const bool accumulate = res != nullptr && res == out;  // Out already holds the residual
  const int64_t total = Out.numel();
  if (pr.K == 0) {
    if (!accumulate) {
      CheckCuda(cudaMemsetAsync(out, 0, sizeof(float) * total, stream), kernel,
                "cudaMemsetAsync");
    }
  } else {
    RunGemms(kernel, p, pr, a, b, accumulate ? 1.f : 0.f, out,
             CublasHandle(device, stream, kernel));
  }
  ApplyEpilogue(p.act, out, bias, accumulate ? nullptr : res, total, 1, pr.N, stream, kernel);
}

}  // namespace

std::string GemmInfo() {
  return "matmul/batch_matmul: cublasSgemm (batch folded into M when B is shared), "
         "cublasSgemmStridedBatched, or one GEMM per batch element for mixed broadcasting; "
         "epilogue kernel for bias/residual/activation";
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def_packed(kMatmul, [](ffi::PackedArgs args, ffi::Any*) { Gemm(kMatmul, false, args); })
      .def_packed(kBatchMatmul,
                  [](ffi::PackedArgs args, ffi::Any*) { Gemm(kBatchMatmul, true, args); });
}

}  // namespace cuda
}  // namespace tvm_ollie
