// tvm_ollie.cpu.matmul: Out = act(A' @ B' + bias + residual), float32, batched with numpy-style
// broadcasting of the leading dims, oneDNN matmul, OpenBLAS sgemm, or for a matrix-vector product
// (M == 1 or N == 1) gemv.cc's loops.
//
// Calling convention (destination-passing style, Out last):
//   tvm_ollie.cpu.matmul(attrs: str, A, B, [bias], [residual], Out)
// attrs: ta=0|1 (A stored [..., K, M]), tb=0|1 (B stored [..., N, K]), bias=0|1, res=0|1,
//        act=none|relu|clip_LO_HI|sigmoid|tanh|gelu|gelu_tanh|silu|hardswish_A_B|hardsigmoid_A_B|
//        leaky_relu_A|scale_A (A * x), lib=onednn|openblas, wpacked=0|1.
//
// Packed weights: oneDNN's matmul reads a plain B through its own copy into a blocked format on
// every call (as MLAS would without its pre-packing). tvm_ollie.cpu.matmul_pack_weight(attrs, A,
// B, Out, Packed) makes that copy once (float32 Packed of matmul_packed_size(attrs, A, B, Out)
// elements: a header (weight_pack.h), then B in the format oneDNN picks for this problem); a
// call with wpacked=1 takes it as B (1-D; K from A, N from Out; ta=0, B not batched; always
// oneDNN). Where the pack was made for another primitive (another thread count's or CPU's
// format), the call reorders it from the header's format tag on every call.
//
// Per call: each thread keeps, with the parsed attrs and per argument shapes, a call site
// (MatmulSite: the checked GEMM, the library, the oneDNN primitive and the call's dnnl::memory
// objects with their handles reset per call), as conv2d does (docs/per-call.md).
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cblas.h"
#include "common.h"
#include "gemv.h"
#include "kernels.h"
#include "weight_pack.h"

namespace tvm_ollie {

namespace ffi = tvm::ffi;

namespace {

constexpr const char* kName = "tvm_ollie.cpu.matmul";

enum class Lib { kAuto, kOneDNN, kOpenBLAS };

struct MatmulParams {
  bool ta = false, tb = false, has_bias = false, has_res = false, wpacked = false;
  Activation act;
  Lib lib = Lib::kAuto;
  std::string canonical;  // attrs in canonical order (cache key)
};

MatmulParams ParseMatmulAttrs(const std::string& text) {
  Attrs attrs(kName, text);
  MatmulParams p;
  p.ta = attrs.GetBool("ta", false);
  p.tb = attrs.GetBool("tb", false);
  p.has_bias = attrs.GetBool("bias", false);
  p.has_res = attrs.GetBool("res", false);
  p.act = ParseActivation(attrs, attrs.GetRaw("act", "none"));
  std::string lib = attrs.GetStr("lib", "auto", {"auto", "onednn", "openblas"});
  p.lib = lib == "onednn" ? Lib::kOneDNN : (lib == "openblas" ? Lib::kOpenBLAS : Lib::kAuto);
  p.wpacked = attrs.GetBool("wpacked", false);
  attrs.CheckAllUsed();
  if (p.wpacked && (p.ta || p.lib == Lib::kOpenBLAS)) {
    TVM_FFI_THROW(ValueError) << kName << ": wpacked=1 needs ta=0 and the oneDNN kernel";
  }
  p.canonical = std::string("ta=") + (p.ta ? "1" : "0") + ";tb=" + (p.tb ? "1" : "0") +
                ";bias=" + (p.has_bias ? "1" : "0") + ";res=" + (p.has_res ? "1" : "0") +
                ";act=" + p.act.text + (p.wpacked ? ";wp=1" : "");
  return p;
}

// Broadcast epilogue prologue: Out = residual (+ bias) or bias, before a beta=1 GEMM.
void FillOutWithAddends(float* out, const float* bias, const float* res, int64_t rows,
                        int64_t N) {
  const int64_t total = rows * N;
  if (res != nullptr) {
    std::memcpy(out, res, sizeof(float) * total);
    if (bias != nullptr) {
#pragma omp parallel for schedule(static) if (total > 65536)
      for (int64_t r = 0; r < rows; ++r) {
        float* o = out + r * N;
        for (int64_t j = 0; j < N; ++j) o[j] += bias[j];
      }
    }
  } else if (bias != nullptr) {
#pragma omp parallel for schedule(static) if (total > 65536)
    for (int64_t r = 0; r < rows; ++r) std::memcpy(out + r * N, bias, sizeof(float) * N);
  }
}

// Row-major strides of a batch shape (element strides per batch of a [..., X, Y] tensor with
// matrix size `mat`); a broadcast (size-1) dim gets stride 0.
std::vector<int64_t> BatchStrides(const std::vector<int64_t>& dims, int64_t mat) {
  std::vector<int64_t> s(dims.size(), 0);
  int64_t acc = mat;
  for (int i = static_cast<int>(dims.size()) - 1; i >= 0; --i) {
    s[i] = dims[i] == 1 ? 0 : acc;
    acc *= dims[i];
  }
  return s;
}

bool FitsBlasInt(int64_t v) { return v <= std::numeric_limits<blasint>::max(); }

// out[M, N] = A' @ B' (+ out when accumulate), row-major, A' and B' as sgemm takes them; a
// matrix-vector product (M == 1 or N == 1) by gemv.cc's loops, which OpenBLAS's sgemm runs
// through its GEMM path, packing B on every call (2.6-4.6x slower at EfficientViT's head).
void Product(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* a, const float* b,
             bool accumulate, float* out) {
  if (M == 1) {  // x = A's one row (contiguous whether stored [1, K] or [K, 1]), W = B'
    Gemv(a, b, K, N, tb ? K : N, tb ? GemvForm::kColumns : GemvForm::kRows, accumulate, out);
    return;
  }
  if (N == 1) {  // x = B's one column (contiguous either way), W = A'^T
    Gemv(b, a, K, M, ta ? M : K, ta ? GemvForm::kRows : GemvForm::kColumns, accumulate, out);
    return;
  }
  if (!FitsBlasInt(M) || !FitsBlasInt(K) || !FitsBlasInt(N)) {
    TVM_FFI_THROW(ValueError) << kName << ": problem too large for 32-bit BLAS";
  }
  scipy_cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K),
                    1.f, a, static_cast<blasint>(ta ? M : K), b,
                    static_cast<blasint>(tb ? K : N), accumulate ? 1.f : 0.f, out,
                    static_cast<blasint>(N));
}

void RunOpenBLAS(const MatmulParams& p, const GemmShape& pr, const float* a, const float* b,
                 const float* bias, const float* res, float* out) {
  const int64_t M = pr.M, N = pr.N, K = pr.K;
  const int64_t total_rows = pr.count * M;
  FillOutWithAddends(out, bias, res, total_rows, N);
  const bool accumulate = bias != nullptr || res != nullptr;
  const bool b_broadcast = std::all_of(pr.b_batch.begin(), pr.b_batch.end(),
                                       [](int64_t d) { return d == 1; });
  if (K == 0 || M == 0 || N == 0) {
    if (!accumulate) std::fill(out, out + total_rows * N, 0.f);
  } else if (b_broadcast && !p.ta && pr.count > 1 &&
             std::equal(pr.a_batch.begin(), pr.a_batch.end(), pr.batch.begin())) {
    // Fold A's batch into M: one [batch*M, K] @ [K, N] GEMM.
    Product(false, p.tb, total_rows, N, K, a, b, accumulate, out);
  } else {
    const std::vector<int64_t> sa = BatchStrides(pr.a_batch, M * K);
    const std::vector<int64_t> sb = BatchStrides(pr.b_batch, K * N);
    const int nb = static_cast<int>(pr.batch.size());
    std::vector<int64_t> idx(nb, 0);
    for (int64_t bi = 0; bi < pr.count; ++bi) {
      int64_t oa = 0, ob = 0;
      for (int d = 0; d < nb; ++d) {
        oa += idx[d] * sa[d];
        ob += idx[d] * sb[d];
      }
      Product(p.ta, p.tb, M, N, K, a + oa, b + ob, accumulate, out + bi * M * N);
      for (int d = nb - 1; d >= 0; --d) {
        if (++idx[d] < pr.batch[d]) break;
        idx[d] = 0;
      }
    }
  }
  ApplyActivation(p.act, out, total_rows * N);
}

// A cached oneDNN matmul for one (attrs, shapes) pair.
// wei_md: the primitive's weight format (a blocked one with wpacked=1); user_wei_md: B as the
// caller stores it (what matmul_pack_weight reorders from).
struct OneDNNMatmul {
  dnnl::matmul prim;
  dnnl::memory::desc src_md, wei_md, user_wei_md, bias_md, dst_md, scratch_md;
};

std::string DimsKey(const std::vector<int64_t>& d) {
  std::string s;
  for (int64_t v : d) s += std::to_string(v) + ",";
  return s;
}

// The problem oneDNN is given: A's batch folded into M when B is not batched (one big 2-D
// GEMM), else the batch dims as they are.
struct OneDNNProblem {
  std::vector<int64_t> a_batch, b_batch, batch;
  int64_t m = 0, N = 0, K = 0;
};

OneDNNProblem FoldProblem(const MatmulParams& p, const GemmShape& pr) {
  const bool b_broadcast = std::all_of(pr.b_batch.begin(), pr.b_batch.end(),
                                       [](int64_t d) { return d == 1; });
  const bool fold = b_broadcast && !p.ta &&
                    std::equal(pr.a_batch.begin(), pr.a_batch.end(), pr.batch.begin());
  OneDNNProblem q;
  q.N = pr.N;
  q.K = pr.K;
  if (fold) {
    q.m = pr.M * pr.count;
  } else {
    q.m = pr.M;
    q.a_batch = pr.a_batch;
    q.b_batch = pr.b_batch;
    q.batch = pr.batch;
  }
  return q;
}

std::string OneDNNKey(const MatmulParams& p, const OneDNNProblem& q) {
  return std::string(kName) + "|" + p.canonical + "|a" + DimsKey(q.a_batch) + "|b" +
         DimsKey(q.b_batch) + "|" + std::to_string(q.m) + "x" + std::to_string(q.N) + "x" +
         std::to_string(q.K);
}

std::shared_ptr<OneDNNMatmul> CreateOneDNNMatmul(const MatmulParams& p, const OneDNNProblem& q) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const int64_t m = q.m, N = q.N, K = q.K;
  auto e = std::make_shared<OneDNNMatmul>();
  const int nb = static_cast<int>(q.batch.size());
  dims src_d(q.a_batch.begin(), q.a_batch.end()), wei_d(q.b_batch.begin(), q.b_batch.end()),
      dst_d(q.batch.begin(), q.batch.end());
  src_d.push_back(m);
  src_d.push_back(K);
  wei_d.push_back(K);
  wei_d.push_back(N);
  dst_d.push_back(m);
  dst_d.push_back(N);
  // Strides of A and B as stored (transposes are expressed as strides).
  dims src_s(nb + 2), wei_s(nb + 2);
  src_s[nb] = p.ta ? 1 : K;
  src_s[nb + 1] = p.ta ? m : 1;
  wei_s[nb] = p.tb ? 1 : N;
  wei_s[nb + 1] = p.tb ? K : 1;
  int64_t acc_a = m * K, acc_b = K * N;
  for (int i = nb - 1; i >= 0; --i) {
    src_s[i] = acc_a;
    acc_a *= q.a_batch[i];
    wei_s[i] = acc_b;
    acc_b *= q.b_batch[i];
  }
  e->src_md = dnnl::memory::desc(src_d, dt::f32, src_s);
  e->wei_md = p.wpacked ? dnnl::memory::desc(wei_d, dt::f32, dnnl::memory::format_tag::any)
                        : dnnl::memory::desc(wei_d, dt::f32, wei_s);
  e->user_wei_md = dnnl::memory::desc(wei_d, dt::f32, wei_s);
  // dst must be plain row-major: give explicit strides.
  dims dst_s(nb + 2);
  int64_t acc = 1;
  for (int i = nb + 1; i >= 0; --i) {
    dst_s[i] = acc;
    acc *= dst_d[i];
  }
  e->dst_md = dnnl::memory::desc(dst_d, dt::f32, dst_s);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops ops;
  if (p.has_res) ops.append_binary(dnnl::algorithm::binary_add, e->dst_md);
  AppendActivation(p.act, &ops);
  attr.set_post_ops(ops);
  dnnl::matmul::primitive_desc pd;
  if (p.has_bias) {
    dims bias_d(nb + 2, 1);
    bias_d[nb + 1] = N;
    dims bias_s(nb + 2, N);
    bias_s[nb + 1] = 1;
    e->bias_md = dnnl::memory::desc(bias_d, dt::f32, bias_s);
    pd = dnnl::matmul::primitive_desc(Engine(), e->src_md, e->wei_md, e->bias_md, e->dst_md,
                                      attr);
  } else {
    pd = dnnl::matmul::primitive_desc(Engine(), e->src_md, e->wei_md, e->dst_md, attr);
  }
  e->scratch_md = pd.scratchpad_desc();
  e->wei_md = pd.weights_desc();
  e->prim = dnnl::matmul(pd);
  return e;
}

// One thread's state of the matmul calls made with one attribute string and one set of argument
// shapes (a call site, as a Relax module makes it on every run), as ConvSite is for conv2d
// (docs/per-call.md): the shapes checked and resolved once (the GEMM, the library, the oneDNN
// problem and its cache key), the primitive for the OpenMP thread count it was bound under, and
// the dnnl::memory objects and argument map of the call, whose data handles are reset when they
// change. Before, every call built the key string, took the cache's mutex, and made 3-5
// dnnl::memory objects and a map.
struct MatmulSite {
  GemmShape pr;
  Lib lib = Lib::kOneDNN;
  double flops = 0;
  OneDNNProblem q;
  std::string key;  // OneDNNKey (oneDNN sites)
  int nthr = 0;     // the OpenMP thread count `e` was made for (0: not bound)
  int64_t best_ns = kNoBestNs;  // the fastest parallel run (stall.h)
  std::shared_ptr<OneDNNMatmul> e;
  dnnl::memory src, wei, dst, bias, res, scratch;
  std::unordered_map<int, dnnl::memory> args;
  size_t scratch_bytes = 0;
  uint64_t pack_hash = 0;  // weight_pack::Hash of the bound primitive (wpacked=1)
  weight_pack::PackThreads pack_threads;  // packs made under another thread count (wpacked=1)
  weight_pack::RelaidPacks relaid;  // packs re-laid for a primitive of another count (wpacked=1)
};

// The ParsedAttrs value of matmul: the attributes and, per argument shapes, the call sites.
struct MatmulCall {
  MatmulParams p;
  std::unordered_map<ShapeKey, std::unique_ptr<MatmulSite>, ShapeKeyHash> sites;
};

MatmulCall ParseMatmulCall(const std::string& text) {
  return MatmulCall{ParseMatmulAttrs(text), {}};
}

// The site's primitive for the OpenMP thread count in effect (the cache keys by it), and fresh
// memory objects for its descriptors (no buffer until a call sets the handles).
void BindSite(const MatmulParams& p, MatmulSite* site, int nthr) {
  site->e = CachedGet<OneDNNMatmul>(site->key,
                                    [&]() { return CreateOneDNNMatmul(p, site->q); });
  site->nthr = nthr;
  const OneDNNMatmul& e = *site->e;
  const dnnl::engine& eng = Engine();
  site->src = dnnl::memory(e.src_md, eng, DNNL_MEMORY_NONE);
  site->wei = dnnl::memory(e.wei_md, eng, DNNL_MEMORY_NONE);
  site->dst = dnnl::memory(e.dst_md, eng, DNNL_MEMORY_NONE);
  site->args = {{DNNL_ARG_SRC, site->src}, {DNNL_ARG_WEIGHTS, site->wei},
                {DNNL_ARG_DST, site->dst}};
  if (p.has_bias) {
    site->bias = dnnl::memory(e.bias_md, eng, DNNL_MEMORY_NONE);
    site->args[DNNL_ARG_BIAS] = site->bias;
  }
  if (p.has_res) {
    site->res = dnnl::memory(e.dst_md, eng, DNNL_MEMORY_NONE);
    site->args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1] = site->res;
  }
  site->scratch_bytes = e.scratch_md.get_size();
  if (p.wpacked) site->pack_hash = weight_pack::Hash(site->key, e.wei_md);
  if (site->scratch_bytes > 0) {
    site->scratch = dnnl::memory(e.scratch_md, eng, DNNL_MEMORY_NONE);
    site->args[DNNL_ARG_SCRATCHPAD] = site->scratch;
  }
}

// A reorder from a pack's format tag into a primitive's weight format (cached per primitive and
// tag).
struct PortablePack {
  dnnl::memory::desc from;
  weight_pack::PackReorder reorder;
};

// The weights of a wpacked=1 call: the pack's data as they are when its header was made for the
// site's primitive; else (another CPU's format, or another thread count's inside a stall window:
// Matmul runs other calls at the pack's count) reordered from the header's format tag, once
// into the site's kept copy (weight_pack::RelaidPacks); a pack of other weights or without a
// tag is rejected.
const float* PackedWeights(MatmulSite* site, const float* b, int64_t numel) {
  const weight_pack::Header h = weight_pack::ReadHeader(b, numel);
  const OneDNNMatmul& e = *site->e;
  const int64_t have = weight_pack::PackedFloats(h.bytes);
  if (h.magic != weight_pack::kMagic || h.dims != weight_pack::DimsHash(e.wei_md.get_dims()) ||
      numel != have) {
    TVM_FFI_THROW(ValueError) << kName << ": the packed B (" << numel << " elements) was made "
                              << "for other weights; repack it with "
                              << "tvm_ollie.cpu.matmul_pack_weight";
  }
  if (h.hash == site->pack_hash) return b + weight_pack::kHeaderFloats;
  if (h.tag == 0) {
    TVM_FFI_THROW(ValueError) << kName << ": the packed B was made for another primitive in a "
                              << "format without a oneDNN tag; repack it in this process";
  }
  auto port = CachedGet<PortablePack>(site->key + "|from_tag=" + std::to_string(h.tag), [&]() {
    auto r = std::make_shared<PortablePack>();
    r->from = dnnl::memory::desc(e.wei_md.get_dims(), e.wei_md.get_data_type(),
                                 static_cast<dnnl::memory::format_tag>(h.tag));
    r->reorder.Init(r->from, e.wei_md);
    return r;
  });
  const dnnl::engine& eng = Engine();
  const float* data = b + weight_pack::kHeaderFloats;
  if (!port->reorder.needed) return data;
  bool fill = false;
  void* wei = site->relaid.Slot(b, numel, site->pack_hash, e.wei_md.get_size(), &fill);
  if (fill) {
    weight_pack::CountReorder();
    port->reorder.Run(dnnl::memory(port->from, eng, const_cast<float*>(data)), wei);
  }
  return static_cast<const float*>(wei);
}

// One oneDNN call on a bound site.
void RunSite(const MatmulParams& p, MatmulSite* site, const float* a, const float* b,
             const float* bias, const float* res, float* out) {
  Point(site->src, const_cast<float*>(a));
  Point(site->wei, const_cast<float*>(b));
  Point(site->dst, out);
  if (p.has_bias) Point(site->bias, const_cast<float*>(bias));
  if (p.has_res) Point(site->res, const_cast<float*>(res));
  if (site->scratch_bytes > 0) Point(site->scratch, ScratchBuffer(0, site->scratch_bytes));
  Execute(site->e->prim, site->args);
  Stream().wait();
}

// Default library per shape class. Measured with 2 threads on the shared 2-core AVX-512 Xeon
// (GFLOP/s, best of repeated calls, oneDNN vs OpenBLAS; the machine was heavily loaded, so only
// large ratios were trusted): 256^3 8 vs 4, 512^3 25 vs 13, 1024^3 39 vs 44 (tie),
// 4608x512x49 66 vs 25, 49x4608x512 18 vs 7, 4096x448x64 109 vs 49, 128x768x3072 14 vs 18
// (tie), 1x768x768 0.3 vs 9 (oneDNN splits a GEMV over OpenMP threads and stalls whenever a
// thread is descheduled; OpenBLAS runs it on one thread). Rule: the BLAS path for
// matrix-vector products (M == 1 or N == 1), oneDNN otherwise. Since 2026-12-04 that path runs
// them with gemv.cc's loops on the calling thread, not sgemm: on the AVX2 EPYC, one thread,
// 1x256x320 took 26.0-26.6 us in sgemm, 5.9-8.2 in oneDNN, 5.7 in OpenBLAS's sgemv, 4.8-5.8
// in gemv.cc's loops (docs/profiling.md).
Lib ChooseLib(const GemmShape& pr) {
  return (pr.M == 1 || pr.N == 1) ? Lib::kOpenBLAS : Lib::kOneDNN;
}

// The tensors of a matmul call after the per-call checks (dtype, device, contiguity, rank).
struct MatmulTensors {
  ffi::TensorView A, B, Out;
  std::optional<ffi::TensorView> Bias, Res;
  const float *a = nullptr, *b = nullptr, *bias = nullptr, *res = nullptr;
  float* out = nullptr;
};

ffi::TensorView TensorArg(ffi::PackedArgs args, int i, const char* what) {
  auto t = args[i].try_cast<ffi::TensorView>();
  if (!t.has_value()) TVM_FFI_THROW(TypeError) << kName << ": " << what << " must be a tensor";
  return t.value();
}

MatmulTensors CheckMatmulTensors(const MatmulParams& p, ffi::PackedArgs args) {
  const int want = 4 + (p.has_bias ? 1 : 0) + (p.has_res ? 1 : 0);
  if (args.size() != want) {
    TVM_FFI_THROW(TypeError) << kName << ": expected " << want
                             << " arguments (attrs, A, B" << (p.has_bias ? ", bias" : "")
                             << (p.has_res ? ", residual" : "") << ", Out) for attrs \""
                             << p.canonical << "\", got " << args.size();
  }
  int i = 1;
  MatmulTensors t{TensorArg(args, i, "A"), TensorArg(args, i + 1, "B"),
                  TensorArg(args, args.size() - 1, "Out")};
  i += 2;
  t.a = CheckFloatTensor(t.A, kName, "A", 2);
  t.b = CheckFloatTensor(t.B, kName, "B", p.wpacked ? 1 : 2);
  if (p.wpacked && t.B.ndim() != 1) {
    TVM_FFI_THROW(ValueError) << kName << ": with wpacked=1 B must be the 1-D output of "
                              << "tvm_ollie.cpu.matmul_pack_weight, got " << ShapeStr(t.B);
  }
  if (p.has_bias) {
    t.Bias = TensorArg(args, i++, "bias");
    t.bias = CheckFloatTensor(*t.Bias, kName, "bias", 1);
  }
  if (p.has_res) {
    t.Res = TensorArg(args, i++, "residual");
    t.res = CheckFloatTensor(*t.Res, kName, "residual", 0);
  }
  t.out = CheckFloatTensor(t.Out, kName, "Out", 2);
  return t;
}

// The GEMM of a wpacked=1 call (ta=0): A [..., M, K], Out [..., M, N], B not batched.
GemmShape PackedGemmShape(const ffi::TensorView& A, const ffi::TensorView& Out) {
  const std::vector<int64_t> ad = Dims(A), od = Dims(Out);
  std::vector<int64_t> want(ad);
  want.back() = od.empty() ? 0 : od.back();
  if (od != want) {
    TVM_FFI_THROW(ValueError) << kName << ": with wpacked=1 Out must have A's shape "
                              << ShapeStr(A) << " with the last dim N, got " << ShapeStr(Out);
  }
  GemmShape pr;
  pr.batch.assign(ad.begin(), ad.end() - 2);
  pr.a_batch = pr.batch;
  pr.b_batch.assign(pr.batch.size(), 1);
  pr.M = ad[ad.size() - 2];
  pr.K = ad.back();
  pr.N = od.back();
  for (int64_t d : pr.batch) pr.count *= d;
  return pr;
}

// The problem of a call from its shapes (every shape check), or nullopt when Out is empty.
std::optional<MatmulSite> ResolveSite(const MatmulParams& p, const MatmulTensors& t) {
  MatmulSite site;
  site.pr = p.wpacked ? PackedGemmShape(t.A, t.Out)
                      : CheckGemmShapes(kName, p.ta, p.tb, t.A, t.B, t.Out);
  const GemmShape& pr = site.pr;
  if (t.Bias.has_value() && (t.Bias->ndim() != 1 || t.Bias->shape()[0] != pr.N)) {
    TVM_FFI_THROW(ValueError) << kName << ": bias has shape " << ShapeStr(*t.Bias)
                              << ", expected [" << pr.N << "]";
  }
  if (t.Res.has_value() && Dims(*t.Res) != Dims(t.Out)) {
    TVM_FFI_THROW(ValueError) << kName << ": residual has shape " << ShapeStr(*t.Res)
                              << ", expected Out's shape " << ShapeStr(t.Out);
  }
  if (t.Out.numel() == 0) return std::nullopt;
  site.lib = p.wpacked ? Lib::kOneDNN : (p.lib == Lib::kAuto ? ChooseLib(pr) : p.lib);
  if (pr.K == 0 && !p.wpacked) site.lib = Lib::kOpenBLAS;  // epilogue only: the BLAS path
  site.flops = 2.0 * pr.count * pr.M * pr.N * pr.K;
  if (site.lib == Lib::kOneDNN) {
    site.q = FoldProblem(p, pr);
    site.key = OneDNNKey(p, site.q);
  }
  return site;
}

void Matmul(ffi::PackedArgs args, ffi::Any* rv) {
  constexpr size_t kMaxSites = 256;  // per attribute string and thread
  ThreadScope threads;
  std::optional<ffi::String> holder;
  MatmulCall& call = ParsedAttrs<MatmulCall>(AttrsView(args, kName, &holder), ParseMatmulCall);
  const MatmulParams& p = call.p;
  const MatmulTensors t = CheckMatmulTensors(p, args);
  ShapeKey key;
  const bool keyed = key.Add(t.A) && key.Add(t.B) && (!t.Bias || key.Add(*t.Bias)) &&
                     (!t.Res || key.Add(*t.Res)) && key.Add(t.Out);
  auto it = keyed ? call.sites.find(key) : call.sites.end();
  MatmulSite* site;
  std::optional<MatmulSite> unkept;
  if (it != call.sites.end()) {
    site = it->second.get();
  } else {
    std::optional<MatmulSite> resolved = ResolveSite(p, t);
    if (!resolved.has_value()) return;  // empty Out
    if (keyed) {
      if (call.sites.size() >= kMaxSites) call.sites.clear();
      site = call.sites.emplace(key, std::make_unique<MatmulSite>(std::move(*resolved)))
                 .first->second.get();
    } else {
      unkept = std::move(resolved);
      site = &*unkept;
    }
  }
  if (site->lib == Lib::kOpenBLAS) {
    RunOpenBLAS(p, site->pr, t.a, t.b, t.bias, t.res, t.out);
    return;
  }
  threads.SerialBelow(site->flops, &site->best_ns);
  int nthr = omp_get_max_threads();
  if (p.wpacked && !threads.HeldByStall() && site->pack_threads.Threads(nthr) != nthr) {
    nthr = site->pack_threads.Threads(nthr);
    threads.Fix(nthr);
  }
  if (site->nthr != nthr) BindSite(p, site, nthr);
  // A pack made under another count (the build's TVM_NUM_THREADS, or the serial threshold's
  // count there) runs at its count rather than being reordered per call (weight_pack.h); not
  // inside a stall window, whose point is to keep the call off the stalled worker.
  if (p.wpacked && !threads.HeldByStall()) {
    const int n = site->pack_threads.Note(weight_pack::ReadHeader(t.b, t.B.numel()),
                                          weight_pack::kMagic, site->pack_hash, nthr);
    if (n > 0) {
      threads.Fix(n);
      BindSite(p, site, n);
    }
  }
  const float* b = p.wpacked ? PackedWeights(site, t.b, t.B.numel()) : t.b;
  RunSite(p, site, t.a, b, t.bias, t.res, t.out);
}

// matmul_packed_size(attrs, A, B, Out) -> int and matmul_pack_weight(attrs, A, B, Out, Packed):
// attrs those of the calls that will take the pack (with or without wpacked=1); A and Out give
// the shapes only, B the weights ([K, N], or [N, K] with tb=1). The pack is made for the
// primitive those calls run with the thread count in effect (the serial threshold as in a call;
// not a passing stall window).
constexpr const char* kPackSizeName = "tvm_ollie.cpu.matmul_packed_size";
constexpr const char* kPackName = "tvm_ollie.cpu.matmul_pack_weight";

// The pack's site: the packed call's problem resolved and bound as a call would.
MatmulSite PackSite(ffi::PackedArgs args, const char* name, int count, ThreadScope* threads) {
  if (args.size() != count) {
    TVM_FFI_THROW(TypeError) << name << ": expected " << count << " arguments";
  }
  std::optional<ffi::String> holder;
  const std::string text(AttrsView(args, name, &holder));
  const MatmulParams p = ParseMatmulAttrs(text.find("wpacked=") == std::string::npos
                                              ? text + (text.empty() ? "" : ";") + "wpacked=1"
                                              : text);
  if (!p.wpacked) TVM_FFI_THROW(ValueError) << name << ": attrs must not set wpacked=0";
  ffi::TensorView A = TensorArg(args, 1, "A"), B = TensorArg(args, 2, "B");
  ffi::TensorView Out = TensorArg(args, 3, "Out");
  CheckFloatTensor(A, name, "A", 2);
  CheckFloatTensor(B, name, "B", 2);
  CheckFloatTensor(Out, name, "Out", 2);
  if (B.ndim() != 2) TVM_FFI_THROW(ValueError) << name << ": B must have rank 2";
  const int64_t K = p.tb ? B.shape()[1] : B.shape()[0], N = p.tb ? B.shape()[0] : B.shape()[1];
  MatmulSite site;
  site.pr = PackedGemmShape(A, Out);
  if (site.pr.K != K || site.pr.N != N) {
    TVM_FFI_THROW(ValueError) << name << ": B " << ShapeStr(B) << (p.tb ? " (tb=1)" : "")
                              << " does not fit A " << ShapeStr(A) << " and Out "
                              << ShapeStr(Out);
  }
  site.lib = Lib::kOneDNN;
  site.flops = 2.0 * site.pr.count * site.pr.M * site.pr.N * site.pr.K;
  site.q = FoldProblem(p, site.pr);
  site.key = OneDNNKey(p, site.q);
  threads->SerialBelowThreshold(site.flops);  // a pack outlives a passing stall window
  BindSite(p, &site, omp_get_max_threads());
  return site;
}

void PackedSize(ffi::PackedArgs args, ffi::Any* rv) {
  ThreadScope threads;
  const MatmulSite site = PackSite(args, kPackSizeName, 4, &threads);
  *rv = weight_pack::PackedFloats(site.e->wei_md.get_size());
}

void PackWeight(ffi::PackedArgs args, ffi::Any* rv) {
  ThreadScope threads;
  const MatmulSite site = PackSite(args, kPackName, 5, &threads);
  const OneDNNMatmul& e = *site.e;
  ffi::TensorView B = TensorArg(args, 2, "B"), P = TensorArg(args, 4, "Packed");
  float* packed = CheckFloatTensor(P, kPackName, "Packed", 1);
  const int64_t want = weight_pack::PackedFloats(e.wei_md.get_size());
  if (P.ndim() != 1 || P.numel() != want) {
    TVM_FFI_THROW(ValueError) << kPackName << ": Packed has shape " << ShapeStr(P)
                              << ", expected [" << want << "] (" << kPackSizeName << ")";
  }
  weight_pack::WriteHeader(weight_pack::MakeHeader(site.key, e.wei_md), packed);
  float* b = CheckFloatTensor(B, kPackName, "B", 2);
  Reorder to_packed;
  to_packed.Init(e.user_wei_md, e.wei_md);
  float* dst = packed + weight_pack::kHeaderFloats;
  if (to_packed.needed) {
    to_packed.Run(dnnl::memory(e.user_wei_md, Engine(), b), dnnl::memory(e.wei_md, Engine(), dst),
                  5);
    Stream().wait();
  } else {
    std::memcpy(dst, b, e.wei_md.get_size());
  }
}

}  // namespace

std::string MatmulInfo() {
  return std::string("matmul default: native gemv (") + GemvVectorsList() +
         ") when M == 1 or N == 1, onednn matmul otherwise; lib=openblas: sgemm, gemv for M or "
         "N == 1";
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def_packed(kName, Matmul)
      .def_packed(kPackSizeName, PackedSize)
      .def_packed(kPackName, PackWeight);
}

}  // namespace tvm_ollie
