// tvm_ollie.cuda.conv2d: Out = act(conv2d(data, weight) + bias + residual), float32 on a CUDA
// device, cuDNN (cudnnConvolutionForward).
//
// Calling convention (destination-passing style, Out last), as tvm_ollie.cpu.conv2d:
//   tvm_ollie.cuda.conv2d(attrs: str, data, weight, [bias], [residual], Out)
// attrs: layout=NCHW|NHWC, klayout=OIHW|OHWI (cuDNN's filter formats: NCHW data takes OIHW,
//        NHWC data OHWI; HWIO has no cuDNN filter format and is rejected), stride=SH,SW,
//        pad=TOP,LEFT,BOTTOM,RIGHT (symmetric only: TOP == BOTTOM, LEFT == RIGHT; cuDNN has no
//        asymmetric padding), dil=DH,DW, groups=G, bias=0|1, res=0|1, act=... (as matmul),
//        math=fp32|tf32 (fp32: FMA math only, the default; tf32: tensor cores allowed),
//        algo=auto|0..7 (a cudnnConvolutionFwdAlgo_t; auto = cuDNN's heuristic ranking, first
//        that is supported).
// The residual: when it is Out itself the convolution blends into it (beta = 1); otherwise the
// epilogue kernel adds it with the bias (per output channel) and applies the activation.
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cuda_common.h"

namespace tvm_ollie {
namespace cuda {

namespace ffi = tvm::ffi;

namespace {

constexpr const char* kName = "tvm_ollie.cuda.conv2d";

struct ConvParams {
  bool nhwc = false, has_bias = false, has_res = false, tf32 = false;
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
  int algo = -1;  // -1: auto
  Activation act;
  std::string canonical;  // the cache key's attribute part
};

ConvParams ParseConvAttrs(const std::string& text) {
  Attrs attrs(kName, text);
  ConvParams p;
  const std::string layout = attrs.GetStr("layout", "NCHW", {"NCHW", "NHWC"});
  p.nhwc = layout == "NHWC";
  const std::string klayout = attrs.GetStr("klayout", "OIHW", {"OIHW", "OHWI", "HWIO"});
  const auto s = attrs.GetInts("stride", 2, {1, 1});
  const auto pad = attrs.GetInts("pad", 4, {0, 0, 0, 0});
  const auto d = attrs.GetInts("dil", 2, {1, 1});
  p.groups = attrs.GetInt("groups", 1);
  p.has_bias = attrs.GetBool("bias", false);
  p.has_res = attrs.GetBool("res", false);
  p.act = ParseActivation(attrs, attrs.GetRaw("act", "none"));
  p.tf32 = attrs.GetStr("math", "fp32", {"fp32", "tf32"}) == "tf32";
  const std::string algo = attrs.GetStr(
      "algo", "auto", {"auto", "0", "1", "2", "3", "4", "5", "6", "7"});
  p.algo = algo == "auto" ? -1 : std::stoi(algo);
  attrs.CheckAllUsed();
  if ((p.nhwc ? "OHWI" : "OIHW") != klayout) {
    TVM_FFI_THROW(ValueError) << kName << ": layout=" << layout << " with klayout=" << klayout
                              << " is not supported (cuDNN takes NCHW data with OIHW weights "
                                 "and NHWC data with OHWI weights)";
  }
  if (pad[0] != pad[2] || pad[1] != pad[3]) {
    TVM_FFI_THROW(ValueError) << kName << ": asymmetric padding " << pad[0] << "," << pad[1]
                              << "," << pad[2] << "," << pad[3]
                              << " is not supported (cuDNN pads symmetrically)";
  }
  p.sh = s[0], p.sw = s[1], p.ph = pad[0], p.pw = pad[1], p.dh = d[0], p.dw = d[1];
  if (p.sh < 1 || p.sw < 1) TVM_FFI_THROW(ValueError) << kName << ": stride must be >= 1";
  if (p.dh < 1 || p.dw < 1) TVM_FFI_THROW(ValueError) << kName << ": dil must be >= 1";
  if (p.ph < 0 || p.pw < 0) TVM_FFI_THROW(ValueError) << kName << ": pad must be >= 0";
  if (p.groups < 1) TVM_FFI_THROW(ValueError) << kName << ": groups must be >= 1";
  p.canonical = layout + ";" + std::to_string(p.sh) + "," + std::to_string(p.sw) + ";" +
                std::to_string(p.ph) + "," + std::to_string(p.pw) + ";" +
                std::to_string(p.dh) + "," + std::to_string(p.dw) + ";" +
                std::to_string(p.groups) + ";" + (p.tf32 ? "tf32" : "fp32") + ";" +
                std::to_string(p.algo);
  return p;
}

struct ConvShape {
  int64_t N, C, H, W, O, I, KH, KW, OH, OW;
};

ConvShape ConvShapes(const ConvParams& p, const ffi::TensorView& X, const ffi::TensorView& Wt,
                     const ffi::TensorView& Out) {
  if (X.ndim() != 4 || Wt.ndim() != 4 || Out.ndim() != 4) {
    TVM_FFI_THROW(ValueError) << kName << ": data, weight and Out must be 4-D, got data "
                              << ShapeStr(X) << ", weight " << ShapeStr(Wt) << ", Out "
                              << ShapeStr(Out);
  }
  const std::vector<int64_t> x = Dims(X), w = Dims(Wt);
  ConvShape s;
  s.N = x[0];
  s.C = p.nhwc ? x[3] : x[1];
  s.H = p.nhwc ? x[1] : x[2];
  s.W = p.nhwc ? x[2] : x[3];
  s.O = w[0];
  s.I = p.nhwc ? w[3] : w[1];
  s.KH = p.nhwc ? w[1] : w[2];
  s.KW = p.nhwc ? w[2] : w[3];
  if (s.I * p.groups != s.C || s.O % p.groups != 0 || s.O == 0 || s.C == 0) {
    TVM_FFI_THROW(ValueError) << kName << ": weight " << ShapeStr(Wt) << " does not fit data "
                              << ShapeStr(X) << " with groups=" << p.groups
                              << " (need I * groups == C > 0 and O % groups == 0)";
  }
  if (s.KH < 1 || s.KW < 1) TVM_FFI_THROW(ValueError) << kName << ": empty kernel";
  const int64_t ekh = (s.KH - 1) * p.dh + 1, ekw = (s.KW - 1) * p.dw + 1;
  const int64_t hp = s.H + 2 * p.ph, wp = s.W + 2 * p.pw;
  if (hp < ekh || wp < ekw) {
    TVM_FFI_THROW(ValueError) << kName << ": the (dilated) kernel " << ekh << "x" << ekw
                              << " is larger than the padded input " << hp << "x" << wp;
  }
  s.OH = (hp - ekh) / p.sh + 1;
  s.OW = (wp - ekw) / p.sw + 1;
  const std::vector<int64_t> want = p.nhwc ? std::vector<int64_t>{s.N, s.OH, s.OW, s.O}
                                           : std::vector<int64_t>{s.N, s.O, s.OH, s.OW};
  if (Dims(Out) != want) {
    std::string t = "[";
    for (size_t i = 0; i < want.size(); ++i) t += (i ? ", " : "") + std::to_string(want[i]);
    TVM_FFI_THROW(ValueError) << kName << ": Out has shape " << ShapeStr(Out) << ", expected "
                              << t << "]";
  }
  return s;
}

int AsInt(int64_t v) {
  if (v > (int64_t{1} << 31) - 1) {
    TVM_FFI_THROW(ValueError) << kName << ": dimension " << v << " too large for cuDNN";
  }
  return static_cast<int>(v);
}

// The cuDNN descriptors and algorithm of one problem on one device (read-only once built).
struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  size_t workspace = 0;
  ~ConvPlan() {
    const CudnnApi& api = Cudnn();
    if (x) api.DestroyTensorDescriptor(x);
    if (y) api.DestroyTensorDescriptor(y);
    if (w) api.DestroyFilterDescriptor(w);
    if (conv) api.DestroyConvolutionDescriptor(conv);
  }
};

std::shared_ptr<ConvPlan> MakePlan(const ConvParams& p, const ConvShape& s, cudnnHandle_t h) {
  const CudnnApi& api = Cudnn();
  auto plan = std::make_shared<ConvPlan>();
  const cudnnTensorFormat_t fmt = p.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  CheckCudnn(api.CreateTensorDescriptor(&plan->x), kName, "cudnnCreateTensorDescriptor");
  CheckCudnn(api.CreateTensorDescriptor(&plan->y), kName, "cudnnCreateTensorDescriptor");
  CheckCudnn(api.CreateFilterDescriptor(&plan->w), kName, "cudnnCreateFilterDescriptor");
  CheckCudnn(api.CreateConvolutionDescriptor(&plan->conv), kName,
             "cudnnCreateConvolutionDescriptor");
  // Dimensions are always given in NCHW / KCRS order; the format says how they are stored.
  CheckCudnn(api.SetTensor4dDescriptor(plan->x, fmt, CUDNN_DATA_FLOAT, AsInt(s.N), AsInt(s.C),
                                       AsInt(s.H), AsInt(s.W)),
             kName, "cudnnSetTensor4dDescriptor(data)");
  CheckCudnn(api.SetFilter4dDescriptor(plan->w, CUDNN_DATA_FLOAT, fmt, AsInt(s.O), AsInt(s.I),
                                       AsInt(s.KH), AsInt(s.KW)),
             kName, "cudnnSetFilter4dDescriptor");
  CheckCudnn(api.SetConvolution2dDescriptor(plan->conv, AsInt(p.ph), AsInt(p.pw), AsInt(p.sh),
                                            AsInt(p.sw), AsInt(p.dh), AsInt(p.dw),
                                            CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
             kName, "cudnnSetConvolution2dDescriptor");
  CheckCudnn(api.SetConvolutionGroupCount(plan->conv, AsInt(p.groups)), kName,
             "cudnnSetConvolutionGroupCount");
  CheckCudnn(api.SetConvolutionMathType(plan->conv, p.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH),
             kName, "cudnnSetConvolutionMathType");
  int n = 0, c = 0, oh = 0, ow = 0;
  CheckCudnn(api.GetConvolution2dForwardOutputDim(plan->conv, plan->x, plan->w, &n, &c, &oh, &ow),
             kName, "cudnnGetConvolution2dForwardOutputDim");
  if (n != s.N || c != s.O || oh != s.OH || ow != s.OW) {
    TVM_FFI_THROW(InternalError) << kName << ": cuDNN's output " << n << "x" << c << "x" << oh
                                 << "x" << ow << " differs from ours " << s.N << "x" << s.O
                                 << "x" << s.OH << "x" << s.OW;
  }
  CheckCudnn(api.SetTensor4dDescriptor(plan->y, fmt, CUDNN_DATA_FLOAT, n, c, oh, ow), kName,
             "cudnnSetTensor4dDescriptor(out)");
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int returned = 0;
  if (api.FindConvolutionForwardAlgorithm != nullptr) {
    // Timed on the device, fastest first: the heuristics' first choice (v7) ran the small
    // convolutions of a ResNet-18 at 190-390 us on an H200 where TVM's kernels take 14-100
    // (docs/device_bundle.md). Runs once per plan (plans are cached below).
    CheckCudnn(api.FindConvolutionForwardAlgorithm(h, plan->x, plan->w, plan->conv, plan->y,
                                                   CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned,
                                                   perf),
               kName, "cudnnFindConvolutionForwardAlgorithm");
  } else {
    CheckCudnn(api.GetConvolutionForwardAlgorithm_v7(h, plan->x, plan->w, plan->conv, plan->y,
                                                     CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                     &returned, perf),
               kName, "cudnnGetConvolutionForwardAlgorithm_v7");
  }
  bool found = false;
  for (int i = 0; i < returned && !found; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (p.algo >= 0 && static_cast<int>(perf[i].algo) != p.algo) continue;
    plan->algo = perf[i].algo;
    plan->workspace = perf[i].memory;
    found = true;
  }
  if (!found) {
    TVM_FFI_THROW(RuntimeError) << kName << ": cuDNN has no forward algorithm"
                                << (p.algo >= 0 ? " " + std::to_string(p.algo) : std::string())
                                << " for this problem";
  }
  return plan;
}

// Plans by (device, attrs, shapes); building one queries cuDNN's heuristics.
std::shared_ptr<ConvPlan> GetPlan(int device, const ConvParams& p, const ConvShape& s,
                                  cudnnHandle_t h) {
  static std::mutex mu;
  static auto* plans = new std::map<std::string, std::shared_ptr<ConvPlan>>();  // never freed
  const std::string key = std::to_string(device) + "|" + p.canonical + "|" +
                          std::to_string(s.N) + "," + std::to_string(s.C) + "," +
                          std::to_string(s.H) + "," + std::to_string(s.W) + "," +
                          std::to_string(s.O) + "," + std::to_string(s.KH) + "," +
                          std::to_string(s.KW);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = plans->find(key);
    if (it != plans->end()) return it->second;
  }
  std::shared_ptr<ConvPlan> plan = MakePlan(p, s, h);
  std::lock_guard<std::mutex> lock(mu);
  return plans->emplace(key, plan).first->second;  // the first insert wins
}

void Conv2d(ffi::PackedArgs args, ffi::Any*) {
  if (args.size() < 1) TVM_FFI_THROW(TypeError) << kName << ": missing attrs";
  auto text = args[0].try_cast<ffi::String>();
  if (!text.has_value()) {
    TVM_FFI_THROW(TypeError) << kName << ": first argument must be the attrs string";
  }
  const ConvParams p = ParseConvAttrs(std::string(text.value()));
  const int want = 4 + (p.has_bias ? 1 : 0) + (p.has_res ? 1 : 0);
  if (args.size() != want) {
    TVM_FFI_THROW(TypeError) << kName << ": expected " << want << " arguments (attrs, data, "
                             << "weight" << (p.has_bias ? ", bias" : "")
                             << (p.has_res ? ", residual" : "") << ", Out), got "
                             << args.size();
  }
  auto tensor = [&](int i, const char* what) {
    auto t = args[i].try_cast<ffi::TensorView>();
    if (!t.has_value()) TVM_FFI_THROW(TypeError) << kName << ": " << what << " must be a tensor";
    return t.value();
  };
  int device = -1, i = 1;
  ffi::TensorView X = tensor(i++, "data"), Wt = tensor(i++, "weight");
  const float* x = CheckCudaTensor(X, kName, "data", 4, &device);
  const float* w = CheckCudaTensor(Wt, kName, "weight", 4, &device);
  const float *bias = nullptr, *res = nullptr;
  std::optional<ffi::TensorView> Bias, Res;
  if (p.has_bias) {
    Bias = tensor(i++, "bias");
    bias = CheckCudaTensor(*Bias, kName, "bias", 1, &device);
  }
  if (p.has_res) {
    Res = tensor(i++, "residual");
    res = CheckCudaTensor(*Res, kName, "residual", 0, &device);
  }
  ffi::TensorView Out = tensor(i++, "Out");
  float* out = CheckCudaTensor(Out, kName, "Out", 4, &device);
  const ConvShape s = ConvShapes(p, X, Wt, Out);
  if (Bias.has_value() && Dims(*Bias) != std::vector<int64_t>{s.O}) {
    TVM_FFI_THROW(ValueError) << kName << ": bias has shape " << ShapeStr(*Bias)
                              << ", expected [" << s.O << "]";
  }
  if (Res.has_value() && Dims(*Res) != Dims(Out)) {
    TVM_FFI_THROW(ValueError) << kName << ": residual has shape " << ShapeStr(*Res)
                              << ", expected Out's shape " << ShapeStr(Out);
  }
  const CudnnApi& api = RequireCudnn(kName);
  if (Out.numel() == 0) return;
  DeviceScope scope(device, kName);
  cudaStream_t stream = CurrentStream(device);
  cudnnHandle_t h = CudnnHandle(device, stream, kName);
  std::shared_ptr<ConvPlan> plan = GetPlan(device, p, s, h);
  StreamBuffer workspace(plan->workspace, stream, kName);
  const bool accumulate = res != nullptr && res == out;  // Out already holds the residual
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  CheckCudnn(api.ConvolutionForward(h, &alpha, plan->x, x, plan->w, w, plan->conv, plan->algo,
                                    workspace.get(), plan->workspace, &beta, plan->y, out),
             kName, "cudnnConvolutionForward");
  ApplyEpilogue(p.act, out, bias, accumulate ? nullptr : res, Out.numel(),
                p.nhwc ? 1 : s.OH * s.OW, s.O, stream, kName);
}

}  // namespace

std::string Conv2dInfo() {
  return "conv2d: cudnnConvolutionForward (NCHW/OIHW or NHWC/OHWI, symmetric padding, groups, "
         "dilation; algorithm timed by cudnnFind once per shape, else cuDNN's heuristics, "
         "unless algo=), epilogue kernel for bias/residual/activation";
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef().def_packed(kName, Conv2d);
}

}  // namespace cuda
}  // namespace tvm_ollie
