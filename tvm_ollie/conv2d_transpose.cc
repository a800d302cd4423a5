// tvm_ollie.cpu.conv2d_transpose: Out = act(conv2d_transpose(data, weight) + bias + residual),
// float32: oneDNN deconvolution_forward, or a GEMM and a scatter of its columns (fmt=gemm).
//
// Calling convention (destination-passing style, Out last):
//   tvm_ollie.cpu.conv2d_transpose(attrs: str, data, weight, [bias], [residual], Out)
// Semantics of Relax's nn.conv2d_transpose: data NCHW [N, C, H, W], weight IOHW
// [C, O / groups, KH, KW], Out NCHW [N, O, OH, OW] with
//   OH = (H - 1) * SH - TOP - BOTTOM + DH * (KH - 1) + OPH + 1   (OW likewise)
//   Out[n, g*Og + o, y, x] = sum_{i < C/groups, ky, kx} data[n, g*Ig + i, h, w] *
//                            weight[g*Ig + i, o, ky, kx]  where y = h*SH - TOP + ky*DH, ...
// attrs: layout=NCHW, klayout=IOHW, stride=SH,SW, pad=TOP,LEFT,BOTTOM,RIGHT, opad=OPH,OPW,
//        dil=DH,DW, groups=G, bias=0|1, res=0|1, act=... (as matmul),
//        fmt=plain|blocked|gemm (oneDNN on the caller's formats, oneDNN on its preferred formats
//        with reorders inside the call, or the GEMM + col2im of RunGemm; default: see
//        ChooseFormat),
//        src_fmt=nchw|nhwc, dst_fmt=nchw|nhwc (layout=NCHW semantics; nhwc: that activation is
//        the 4-D [N, H, W, C] tensor, as conv2d's src_fmt/dst_fmt; the residual is in dst_fmt),
//        so that a chain kept channels-last passes through the transposed convolution.
// oneDNN: the residual is a sum post-op (Out prefilled with it), not binary_add: see
// CreateDeconv.
// fmt=gemm (what ONNX Runtime's ConvTranspose does, with the epilogue fused): per image and
// group, cols[O/G*KH*KW, H*W] = weight^T @ data (one dnnl_sgemm; the IOHW weight of a group is
// the row-major [C/G, O/G*KH*KW] matrix as it is), each column row scattered into Out, which was
// first filled with bias + residual; then the activation. The output channels are split over
// the OpenMP threads (one parallel region per call; each thread's GEMM runs on its own columns),
// and the data rows into blocks whose columns stay in cache (kColFloats); blocks of few data
// columns compute them transposed (kTransposedColumns).
// Per call: each thread keeps, with the parsed attrs and per argument shapes, a call site
// (DeconvSite: the resolved problem and, for oneDNN, the primitive and the call's dnnl::memory
// objects with their handles reset per call), as conv2d's ConvSite.
// fmt=gemm with a channels-last source: the same GEMM on the stored transpose of the data.
// fmt=gemm with a channels-last destination of more than one channel (RunGemmPositions): per
// image and group,
// cols[H*W, O/G*KH*KW] = data^T @ weight (one row per data position), then each output row
// gathers the columns that land in it (output rows split over the OpenMP threads).
// oneDNN has no output padding: it is expressed as a smaller right padding (BOTTOM - OPH), which
// oneDNN accepts while it is > -stride, hence the requirement OPH < SH (OPW < SW).
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "kernels.h"

namespace tvm_ollie {

namespace ffi = tvm::ffi;

namespace {

constexpr const char* kName = "tvm_ollie.cpu.conv2d_transpose";

enum class Fmt { kAuto, kPlain, kBlocked, kGemm };

struct DeconvParams {
  int64_t sh = 1, sw = 1, pt = 0, pl = 0, pb = 0, pr = 0, oph = 0, opw = 0, dh = 1, dw = 1;
  int64_t groups = 1;
  bool has_bias = false, has_res = false;
  Activation act;
  Fmt fmt = Fmt::kAuto;
  bool src_nhwc = false, dst_nhwc = false;  // src_fmt/dst_fmt
  std::string canonical;  // every key but fmt (cache key, error messages)
};

std::string Pair(int64_t a, int64_t b) { return std::to_string(a) + "," + std::to_string(b); }

void CheckParams(const DeconvParams& p) {
  if (p.sh < 1 || p.sw < 1) TVM_FFI_THROW(ValueError) << kName << ": stride must be >= 1";
  if (p.dh < 1 || p.dw < 1) TVM_FFI_THROW(ValueError) << kName << ": dil must be >= 1";
  if (p.pt < 0 || p.pl < 0 || p.pb < 0 || p.pr < 0) {
    TVM_FFI_THROW(ValueError) << kName << ": pad must be >= 0";
  }
  if (p.oph < 0 || p.opw < 0 || p.oph >= p.sh || p.opw >= p.sw) {
    TVM_FFI_THROW(ValueError) << kName << ": opad must satisfy 0 <= opad < stride, got opad="
                              << Pair(p.oph, p.opw) << " with stride=" << Pair(p.sh, p.sw);
  }
  if (p.groups < 1) TVM_FFI_THROW(ValueError) << kName << ": groups must be >= 1";
}

DeconvParams ParseDeconvAttrs(const std::string& text) {
  Attrs attrs(kName, text);
  DeconvParams p;
  attrs.GetStr("layout", "NCHW", {"NCHW"});
  attrs.GetStr("klayout", "IOHW", {"IOHW"});
  auto s = attrs.GetInts("stride", 2, {1, 1});
  auto pad = attrs.GetInts("pad", 4, {0, 0, 0, 0});
  auto op = attrs.GetInts("opad", 2, {0, 0});
  auto d = attrs.GetInts("dil", 2, {1, 1});
  p.groups = attrs.GetInt("groups", 1);
  p.has_bias = attrs.GetBool("bias", false);
  p.has_res = attrs.GetBool("res", false);
  p.act = ParseActivation(attrs, attrs.GetRaw("act", "none"));
  std::string fmt = attrs.GetStr("fmt", "auto", {"auto", "plain", "blocked", "gemm"});
  p.src_nhwc = attrs.GetStr("src_fmt", "nchw", {"nchw", "nhwc"}) == "nhwc";
  p.dst_nhwc = attrs.GetStr("dst_fmt", "nchw", {"nchw", "nhwc"}) == "nhwc";
  p.fmt = fmt == "plain"     ? Fmt::kPlain
          : fmt == "blocked" ? Fmt::kBlocked
          : fmt == "gemm"    ? Fmt::kGemm
                             : Fmt::kAuto;
  attrs.CheckAllUsed();
  p.sh = s[0], p.sw = s[1];
  p.pt = pad[0], p.pl = pad[1], p.pb = pad[2], p.pr = pad[3];
  p.oph = op[0], p.opw = op[1];
  p.dh = d[0], p.dw = d[1];
  CheckParams(p);
  p.canonical = "stride=" + Pair(p.sh, p.sw) + ";pad=" + Pair(p.pt, p.pl) + "," +
                Pair(p.pb, p.pr) + ";opad=" + Pair(p.oph, p.opw) + ";dil=" + Pair(p.dh, p.dw) +
                ";groups=" + std::to_string(p.groups) + ";bias=" + (p.has_bias ? "1" : "0") +
                ";res=" + (p.has_res ? "1" : "0") + ";act=" + p.act.text;
  if (p.src_nhwc) p.canonical += ";src_fmt=nhwc";
  if (p.dst_nhwc) p.canonical += ";dst_fmt=nhwc";
  return p;
}

struct DeconvShape {
  int64_t N, C, H, W, O, KH, KW, OH, OW;
};

std::string DimsStr(const std::vector<int64_t>& d) {
  std::string out = "[";
  for (size_t i = 0; i < d.size(); ++i) out += (i ? ", " : "") + std::to_string(d[i]);
  return out + "]";
}

// The most floats of columns RunGemmPositions makes for the default implementation (16 MiB).
constexpr int64_t kPositionColFloats = int64_t{1} << 22;

// One output extent: (in - 1) * stride - pads + dil * (k - 1) + opad + 1.
int64_t OutExtent(int64_t in, int64_t stride, int64_t pads, int64_t dil, int64_t k,
                  int64_t opad) {
  return (in - 1) * stride - pads + dil * (k - 1) + opad + 1;
}

DeconvShape CheckDeconvShapes(const DeconvParams& p, const std::vector<int64_t>& x,
                              const std::vector<int64_t>& w, const std::vector<int64_t>& out) {
  if (x.size() != 4 || w.size() != 4 || out.size() != 4) {
    TVM_FFI_THROW(ValueError) << kName << ": data, weight and Out must be 4-D, got data "
                              << DimsStr(x) << ", weight " << DimsStr(w) << ", Out "
                              << DimsStr(out);
  }
  const int64_t c = p.src_nhwc ? x[3] : x[1], h = p.src_nhwc ? x[1] : x[2];
  const int64_t wd = p.src_nhwc ? x[2] : x[3];
  DeconvShape s{x[0], c, h, wd, w[1] * p.groups, w[2], w[3], 0, 0};
  if (w[0] != s.C || s.C % p.groups != 0 || w[1] < 1) {
    TVM_FFI_THROW(ValueError) << kName << ": weight " << DimsStr(w)
                              << " (IOHW) does not fit data " << DimsStr(x) << " with groups="
                              << p.groups << " (need weight[0] == C, C % groups == 0, "
                              << "weight[1] >= 1)";
  }
  if (s.KH < 1 || s.KW < 1) TVM_FFI_THROW(ValueError) << kName << ": empty kernel";
  if (s.H < 1 || s.W < 1 || s.C < 1) {
    TVM_FFI_THROW(ValueError) << kName << ": data " << DimsStr(x) << " is empty";
  }
  s.OH = OutExtent(s.H, p.sh, p.pt + p.pb, p.dh, s.KH, p.oph);
  s.OW = OutExtent(s.W, p.sw, p.pl + p.pr, p.dw, s.KW, p.opw);
  if (s.OH < 1 || s.OW < 1) {
    TVM_FFI_THROW(ValueError) << kName << ": padding leaves an empty output (" << s.OH << "x"
                              << s.OW << ") for data " << DimsStr(x) << " and weight "
                              << DimsStr(w);
  }
  std::vector<int64_t> want = p.dst_nhwc ? std::vector<int64_t>{s.N, s.OH, s.OW, s.O}
                                         : std::vector<int64_t>{s.N, s.O, s.OH, s.OW};
  if (out != want) {
    TVM_FFI_THROW(ValueError) << kName << ": Out has shape " << DimsStr(out) << ", expected "
                              << DimsStr(want) << " for data " << DimsStr(x) << " and weight "
                              << DimsStr(w) << " with \"" << p.canonical << "\"";
  }
  return s;
}

using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;

// The element strides of an activation's n, c, h, w in NCHW or channels-last.
dims ActivationStrides(bool nhwc, int64_t c, int64_t h, int64_t w) {
  return nhwc ? dims{h * w * c, 1, w * c, c} : dims{c * h * w, h * w, w, 1};
}

dnnl::memory::desc ActivationDesc(bool nhwc, int64_t n, int64_t c, int64_t h, int64_t w) {
  return dnnl::memory::desc(dims{n, c, h, w}, dt::f32, ActivationStrides(nhwc, c, h, w));
}

// The caller's IOHW weight as oneDNN's deconvolution weights {O, I, KH, KW} (groups:
// {G, O/G, I/G, KH, KW}): the same memory with I and O swapped through the strides.
dnnl::memory::desc WeightDesc(const DeconvParams& p, const DeconvShape& s) {
  const int64_t og = s.O / p.groups, ig = s.C / p.groups, k = s.KH * s.KW;
  if (p.groups == 1) {
    return dnnl::memory::desc(dims{s.O, s.C, s.KH, s.KW}, dt::f32, dims{k, og * k, s.KW, 1});
  }
  return dnnl::memory::desc(dims{p.groups, og, ig, s.KH, s.KW}, dt::f32,
                            dims{ig * og * k, k, og * k, s.KW, 1});
}

struct OneDNNDeconv {
  dnnl::deconvolution_forward prim;
  dnnl::memory::desc user_src, user_wei, user_dst, bias_md;
  dnnl::memory::desc src_md, wei_md, dst_md, scratch_md;
  Reorder src_in, wei_in, res_in, dst_out;
  // Epilogue after the deconvolution instead of as post-ops (see SeparateEpilogue): the
  // residual added by a loop, then the activation by an eltwise primitive in place.
  bool separate = false, has_act = false;
  bool separate_bias = false;  // the bias added after the deconvolution too (EpilogueBroken)
  dnnl::eltwise_forward act;
  std::string impl;
};

// Whether the residual and the activation run after the deconvolution rather than as oneDNN
// post-ops. On the plain formats oneDNN deconvolves with its GEMM implementation (gemm:jit),
// whose post-ops are slow. One thread, us, bias + relu post-op / bias only / bias, then a
// separate relu (`python -m tvm_ollie.bench.native_choice deconv` shapes, DCGAN quick layers):
//   1x64x4x4 -> 32 k4 s2 p1:   147 / 55      1x16x16x16 -> 8:   488 / 94
//   1x8x32x32 -> 3:            736 / 113     (a residual sum post-op costs the same as relu)
// The blocked implementations (brgconv) apply post-ops at no measurable cost, so they keep them.
bool SeparateEpilogue(const DeconvParams& p, Fmt fmt) {
  return fmt == Fmt::kPlain && (p.has_res || p.act.kind != Act::kNone);
}

// Whether oneDNN's implementation `impl` gets a fused epilogue (bias, residual, activation)
// wrong. oneDNN 3.2's brgconv_strided (the blocked stride > 1 deconvolution on avx512_core)
// applies its bias and post-ops to each chunk of input channels it accumulates once the weights
// of a channel block outgrow its cache blocking: 1x504x4x4 -> 32 k4 s2 p1 was off by up to 7.5
// with a bias, 3.6 with a relu post-op, 13 with a residual sum, and exact with none; with 496
// input channels exact in every case. Its epilogue then runs after the deconvolution instead.
bool EpilogueBroken(const std::string& impl) {
  return impl.find("brgconv_strided") != std::string::npos;
}

bool HasEpilogue(const DeconvParams& p) {
  return p.has_bias || p.has_res || p.act.kind != Act::kNone;
}

// The activation as a standalone in-place eltwise primitive on the plain output.
dnnl::eltwise_forward ActivationPrimitive(const Activation& act, const dnnl::memory::desc& md) {
  dnnl::post_ops ops;
  AppendActivation(act, &ops);
  dnnl::algorithm alg;
  float alpha = 0.f, beta = 0.f;
  ops.get_params_eltwise(0, alg, alpha, beta);
  dnnl::eltwise_forward::primitive_desc pd(Engine(), dnnl::prop_kind::forward_inference, alg, md,
                                           md, alpha, beta);
  return dnnl::eltwise_forward(pd);
}

// Default implementation. Measured on the shared 2-core Xeon (oneDNN's ISA there: avx2), one
// thread, ms, best of repeated calls (`python -m tvm_ollie.bench.native_choice deconv`):
//   GCN 1x21x32x32 -> 21 k4 s2 p1:       plain 0.49 (gemm:jit), blocked 0.46 (brgconv, nhwc)
//   1x64x16x16 -> 32 k4 s2 p1:           plain 0.39, blocked 0.25
//   DCGAN 1x512x4x4 -> 256 k4 s2 p1:     plain 1.9, blocked 8.4 (per-call weight reorder)
//   DCGAN 1x128x16x16 -> 3 k4 s2 p1:     plain 0.056, blocked 0.17
//   FSRCNN 1x56x32x32 -> 1 k9 s3 p4 op2: plain 0.26, blocked 1.4
//   1x64x28x28 g=64 k4 s2 p1:            plain 0.79, blocked 0.14 (jit_dw)
// Rule: blocked with groups; without groups plain when the weights are larger than data +
// output (as conv2d) or there are fewer output channels than one channel block (16; the blocked
// formats pad the channels to it), else blocked.
Fmt ChooseFormat(const DeconvParams& p, const DeconvShape& s) {
  if (p.groups > 1) return Fmt::kBlocked;
  const int64_t wsize = s.C * s.O * s.KH * s.KW;
  const int64_t asize = s.N * (s.C * s.H * s.W + s.O * s.OH * s.OW);
  if (wsize > asize || s.O < 16) return Fmt::kGemm;
  return Fmt::kBlocked;
}

dnnl::memory::desc AnyDesc(const dnnl::memory::desc& md) {
  return dnnl::memory::desc(md.get_dims(), dt::f32, dnnl::memory::format_tag::any);
}

std::shared_ptr<OneDNNDeconv> CreateDeconv(const DeconvParams& p, const DeconvShape& s,
                                           Fmt fmt) {
  auto e = std::make_shared<OneDNNDeconv>();
  e->user_src = ActivationDesc(p.src_nhwc, s.N, s.C, s.H, s.W);
  e->user_dst = ActivationDesc(p.dst_nhwc, s.N, s.O, s.OH, s.OW);
  e->user_wei = WeightDesc(p, s);
  const bool blocked = fmt == Fmt::kBlocked;
  dnnl::memory::desc src_any = e->user_src, dst_any = e->user_dst;
  const dnnl::memory::desc wei_any = AnyDesc(e->user_wei);
  if (blocked) {
    src_any = AnyDesc(e->user_src);
    dst_any = AnyDesc(e->user_dst);
  }
  // Output padding as a smaller right padding (see the file comment).
  dims strides{p.sh, p.sw}, dil{p.dh - 1, p.dw - 1}, pad_l{p.pt, p.pl},
      pad_r{p.pb - p.oph, p.pr - p.opw};
  // The residual is a sum post-op (ConvEpilogueAttr). Measured with binary_add instead:
  // 1x21x4x4 -> 21 k4 s2, 0.54 ms vs 0.05 ms without a residual. On the plain formats both
  // follow the deconvolution instead (SeparateEpilogue), and everything with bias does where
  // oneDNN's implementation gets it wrong (EpilogueBroken).
  e->separate = SeparateEpilogue(p, fmt);
  auto make = [&](bool fused_bias, const dnnl::primitive_attr& attr) {
    const auto prop = dnnl::prop_kind::forward_inference;
    const auto alg = dnnl::algorithm::deconvolution_direct;
    if (fused_bias) {
      e->bias_md = dnnl::memory::desc(dims{s.O}, dt::f32, dims{1});
      return dnnl::deconvolution_forward::primitive_desc(Engine(), prop, alg, src_any, wei_any,
                                                         e->bias_md, dst_any, strides, dil,
                                                         pad_l, pad_r, attr);
    }
    return dnnl::deconvolution_forward::primitive_desc(Engine(), prop, alg, src_any, wei_any,
                                                       dst_any, strides, dil, pad_l, pad_r, attr);
  };
  const dnnl::primitive_attr bare = ConvEpilogueAttr(false, Activation());
  dnnl::deconvolution_forward::primitive_desc pd =
      make(p.has_bias, e->separate ? bare : ConvEpilogueAttr(p.has_res, p.act));
  if (HasEpilogue(p) && EpilogueBroken(pd.impl_info_str())) {
    e->separate = true;
    e->separate_bias = p.has_bias;
    pd = make(false, bare);
  }
  e->src_md = pd.src_desc();
  e->wei_md = pd.weights_desc();
  e->dst_md = pd.dst_desc();
  e->scratch_md = pd.scratchpad_desc();
  e->impl = pd.impl_info_str();
  e->prim = dnnl::deconvolution_forward(pd);
  e->src_in.Init(e->user_src, e->src_md);
  e->wei_in.Init(e->user_wei, e->wei_md);
  e->dst_out.Init(e->dst_md, e->user_dst);
  if (p.has_res && !e->separate) e->res_in.Init(e->user_dst, e->dst_md);
  if (e->separate && p.act.kind != Act::kNone) {
    e->has_act = true;
    e->act = ActivationPrimitive(p.act, e->user_dst);
  }
  return e;
}

std::string DeconvKey(const DeconvParams& p, const DeconvShape& s, Fmt fmt) {
  return std::string(kName) + "|" + p.canonical + "|fmt=" + (fmt == Fmt::kBlocked ? "b" : "p") +
         "|" + std::to_string(s.N) + "," + std::to_string(s.C) + "," + std::to_string(s.H) + "," +
         std::to_string(s.W) + "|" + std::to_string(s.O) + "," + std::to_string(s.KH) + "," +
         std::to_string(s.KW);
}

ffi::TensorView TensorArg(ffi::PackedArgs args, int i, const char* what) {
  auto t = args[i].try_cast<ffi::TensorView>();
  if (!t.has_value()) TVM_FFI_THROW(TypeError) << kName << ": " << what << " must be a tensor";
  return t.value();
}

// The tensors of a call after the per-call checks (count, dtype, device, contiguity, rank).
struct DeconvTensors {
  ffi::TensorView X, Wt, Out;
  std::optional<ffi::TensorView> Bias, Res;
  float *x = nullptr, *w = nullptr, *bias = nullptr, *res = nullptr, *out = nullptr;
};

DeconvTensors CheckDeconvTensors(const DeconvParams& p, ffi::PackedArgs args) {
  const int want = 4 + (p.has_bias ? 1 : 0) + (p.has_res ? 1 : 0);
  if (args.size() != want) {
    TVM_FFI_THROW(TypeError) << kName << ": expected " << want << " arguments (attrs, data, weight"
                             << (p.has_bias ? ", bias" : "") << (p.has_res ? ", residual" : "")
                             << ", Out) for attrs \"" << p.canonical << "\", got "
                             << args.size();
  }
  DeconvTensors t{TensorArg(args, 1, "data"), TensorArg(args, 2, "weight"),
                  TensorArg(args, args.size() - 1, "Out")};
  t.x = CheckFloatTensor(t.X, kName, "data", 4);
  t.w = CheckFloatTensor(t.Wt, kName, "weight", 4);
  int i = 3;
  if (p.has_bias) {
    t.Bias = TensorArg(args, i++, "bias");
    t.bias = CheckFloatTensor(*t.Bias, kName, "bias", 1);
  }
  if (p.has_res) {
    t.Res = TensorArg(args, i++, "residual");
    t.res = CheckFloatTensor(*t.Res, kName, "residual", 0);
  }
  t.out = CheckFloatTensor(t.Out, kName, "Out", 4);
  return t;
}

// One thread's state of the calls made with one attribute string and one set of argument shapes
// (a call site, as a Relax module makes it on every run), as conv2d's ConvSite: the problem
// resolved once (shape checks, implementation, cache key) and, for oneDNN, the primitive for the
// thread count in effect and the dnnl::memory objects and argument maps of the call, whose data
// handles are reset when a pointer changes. A call on a kept site builds no string, takes no lock
// and allocates nothing of ours.
struct DeconvSite {
  DeconvShape s;
  Fmt fmt = Fmt::kAuto;
  double flops = 0;  // of one call: every input element meets O / groups * KH * KW weights
  // fmt=gemm: per kernel column kx, the data columns [w_lo, w_hi) that land inside Out
  std::vector<int64_t> w_lo, w_hi;
  // fmt=gemm with GELU's erf (GemmActivationByOneDNN): per thread of the call,
  // an eltwise primitive over that thread's range of Out, its memory and arguments, made for
  // act_nthr threads (0: not made)
  int act_nthr = 0;
  std::vector<dnnl::eltwise_forward> act_prims;
  std::vector<dnnl::memory> act_mems;
  std::vector<std::unordered_map<int, dnnl::memory>> act_args;
  // oneDNN
  std::string key;  // DeconvKey: the primitive cache's key
  int nthr = 0;     // the OpenMP thread count `e` was made for (0: not bound)
  int64_t best_ns = kNoBestNs;  // the fastest parallel run (stall.h)
  std::shared_ptr<OneDNNDeconv> e;
  dnnl::memory user_src, user_dst, user_res, src, wei, dst, bias, scratch;
  std::unordered_map<const void*, dnnl::memory> weights;  // by data pointer (bounded)
  std::unordered_map<int, dnnl::memory> args;             // the primitive's
  std::unordered_map<int, dnnl::memory> src_in, wei_in, res_in, dst_out, act;  // the reorders'
  size_t src_bytes = 0, wei_bytes = 0, dst_bytes = 0, out_bytes = 0, scratch_bytes = 0;
};

// The ParsedAttrs value: the attributes and, per argument shapes, the call sites.
struct DeconvCall {
  DeconvParams p;
  std::unordered_map<ShapeKey, std::unique_ptr<DeconvSite>, ShapeKeyHash> sites;
};

DeconvCall ParseDeconvCall(const std::string& text) {
  return DeconvCall{ParseDeconvAttrs(text), {}};
}

// fmt=gemm: the data columns w whose output column w * SW - LEFT + kx * DW lies in [0, OW).
void GemmColumns(const DeconvParams& p, DeconvSite* site) {
  const DeconvShape& s = site->s;
  site->w_lo.assign(s.KW, 0);
  site->w_hi.assign(s.KW, 0);
  for (int64_t kx = 0; kx < s.KW; ++kx) {
    const int64_t x0 = kx * p.dw - p.pl;  // the output column of data column 0
    const int64_t lo = x0 >= 0 ? 0 : (-x0 + p.sw - 1) / p.sw;
    const int64_t hi = s.OW - 1 - x0 < 0 ? 0 : std::min(s.W, (s.OW - 1 - x0) / p.sw + 1);
    site->w_lo[kx] = std::min(lo, hi);
    site->w_hi[kx] = hi;
  }
}

// Whether fmt=gemm needs RunGemmPositions: a channels-last destination with more than one
// output channel. RunGemm reads a channels-last source as stored (its GEMM takes the transpose),
// and a channels-last Out of one channel is the same memory as its NCHW form ([N, OH, OW, 1]
// and [N, 1, OH, OW]; the residual too), so it writes that as NCHW. RunGemm is the faster of the
// two: FSRCNN quick's 1x56x16x16 -> 1 k9 s2, one thread, 104.5 us in RunGemmPositions against
// 32.6 us in RunGemm from NCHW (per-call minima of 50 runs, docs/profiling.md).
bool PositionsNeeded(const DeconvParams& p, const DeconvShape& s) {
  return p.dst_nhwc && s.O > 1;
}

// The problem of a call from its shapes (every shape check), or nullopt when Out is empty.
std::optional<DeconvSite> ResolveSite(const DeconvParams& p, const DeconvTensors& t) {
  DeconvSite site;
  site.s = CheckDeconvShapes(p, Dims(t.X), Dims(t.Wt), Dims(t.Out));
  if (t.Bias.has_value() && (t.Bias->ndim() != 1 || t.Bias->shape()[0] != site.s.O)) {
    TVM_FFI_THROW(ValueError) << kName << ": bias has shape " << ShapeStr(*t.Bias)
                              << ", expected [" << site.s.O << "]";
  }
  if (t.Res.has_value() && Dims(*t.Res) != Dims(t.Out)) {
    TVM_FFI_THROW(ValueError) << kName << ": residual has shape " << ShapeStr(*t.Res)
                              << ", expected Out's shape " << ShapeStr(t.Out);
  }
  if (site.s.N == 0) return std::nullopt;
  const DeconvShape& s = site.s;
  site.flops = 2.0 * s.N * s.C * s.H * s.W * (s.O / p.groups) * s.KH * s.KW;
  site.fmt = p.fmt == Fmt::kAuto ? ChooseFormat(p, s) : p.fmt;
  // RunGemmPositions keeps every position's columns of an image at once (it does not block the
  // data rows as RunGemm does): past kPositionColFloats the default is oneDNN's instead.
  if (p.fmt == Fmt::kAuto && site.fmt == Fmt::kGemm && PositionsNeeded(p, s) &&
      s.H * s.W * s.O * s.KH * s.KW > kPositionColFloats) {
    site.fmt = Fmt::kBlocked;
  }
  if (site.fmt == Fmt::kGemm) {
    GemmColumns(p, &site);
  } else {
    site.key = DeconvKey(p, s, site.fmt);
  }
  return site;
}

// ---------------------------------------------------------------------------------------------
// oneDNN (fmt=plain|blocked) on a site.

// The site's primitive for the OpenMP thread count in effect (the cache keys by it), and fresh
// memory objects for its descriptors (no buffer until a call sets the handles).
void BindSite(const DeconvParams& p, DeconvSite* site, int nthr) {
  site->e = CachedGet<OneDNNDeconv>(site->key,
                                    [&]() { return CreateDeconv(p, site->s, site->fmt); });
  site->nthr = nthr;
  const OneDNNDeconv& e = *site->e;
  const dnnl::engine& eng = Engine();
  site->user_src = dnnl::memory(e.user_src, eng, DNNL_MEMORY_NONE);
  site->user_dst = dnnl::memory(e.user_dst, eng, DNNL_MEMORY_NONE);
  site->user_res = dnnl::memory(e.user_dst, eng, DNNL_MEMORY_NONE);
  site->src = e.src_in.needed ? dnnl::memory(e.src_md, eng, DNNL_MEMORY_NONE) : site->user_src;
  site->dst = e.dst_out.needed ? dnnl::memory(e.dst_md, eng, DNNL_MEMORY_NONE) : site->user_dst;
  site->wei = dnnl::memory(e.wei_md, eng, DNNL_MEMORY_NONE);
  site->bias = p.has_bias ? dnnl::memory(e.bias_md, eng, DNNL_MEMORY_NONE) : dnnl::memory();
  const bool scratch = e.scratch_md.get_size() > 0;
  site->scratch = scratch ? dnnl::memory(e.scratch_md, eng, DNNL_MEMORY_NONE) : dnnl::memory();
  site->weights.clear();
  site->args = {{DNNL_ARG_SRC, site->src}, {DNNL_ARG_DST, site->dst}};
  if (p.has_bias && !e.separate_bias) site->args[DNNL_ARG_BIAS] = site->bias;
  if (scratch) site->args[DNNL_ARG_SCRATCHPAD] = site->scratch;
  site->src_in = e.src_in.KeptArgs(site->user_src, site->src);
  site->wei_in = e.wei_in.KeptArgs(site->wei, site->wei);  // FROM: the call's weights
  site->res_in = e.res_in.KeptArgs(site->user_res, site->dst);
  site->dst_out = e.dst_out.KeptArgs(site->dst, site->user_dst);
  site->act = {{DNNL_ARG_SRC, site->user_dst}, {DNNL_ARG_DST, site->user_dst}};
  site->src_bytes = e.src_md.get_size();
  site->wei_bytes = e.wei_md.get_size();
  site->dst_bytes = e.dst_md.get_size();
  site->out_bytes = e.user_dst.get_size();
  site->scratch_bytes = e.scratch_md.get_size();
}

// The memory over the caller's weights at `data`, kept per pointer (bounded).
dnnl::memory SiteWeights(DeconvSite* site, const dnnl::memory::desc& md, void* data) {
  constexpr size_t kMaxWeights = 256;
  auto it = site->weights.find(data);
  if (it != site->weights.end()) return it->second;
  if (site->weights.size() >= kMaxWeights) site->weights.clear();
  return site->weights.emplace(data, dnnl::memory(md, Engine(), data)).first->second;
}

// Out += bias per output channel, Out in dst_fmt (NCHW or channels-last).
void AddBias(const DeconvParams& p, const DeconvShape& s, const float* bias, float* out) {
  const int64_t ohw = s.OH * s.OW;
  for (int64_t n = 0; n < s.N; ++n) {
    float* img = out + n * s.O * ohw;
    if (p.dst_nhwc) {
      for (int64_t i = 0; i < ohw; ++i) {
        for (int64_t o = 0; o < s.O; ++o) img[i * s.O + o] += bias[o];
      }
    } else {
      for (int64_t o = 0; o < s.O; ++o) {
        for (int64_t i = 0; i < ohw; ++i) img[o * ohw + i] += bias[o];
      }
    }
  }
}

// One oneDNN call on a bound site: reorders into the primitive's formats where they differ, the
// residual into dst (sum post-op) or kept for after, the deconvolution, the reorder out, and
// the separate epilogue (SeparateEpilogue).
void RunSite(const DeconvParams& p, DeconvSite* site, const DeconvTensors& t) {
  const OneDNNDeconv& e = *site->e;
  // Scratch slots: 0 primitive scratchpad, 1 src, 2 weights, 3 dst, 4 residual, 5 reorders.
  Point(site->user_src, t.x);
  Point(site->user_dst, t.out);
  if (e.src_in.needed) {
    Point(site->src, ScratchBuffer(1, site->src_bytes));
    e.src_in.RunKept(site->src_in, 5);
  }
  dnnl::memory wei = SiteWeights(site, e.user_wei, t.w);
  if (e.wei_in.needed) {
    Point(site->wei, ScratchBuffer(2, site->wei_bytes));
    site->wei_in[DNNL_ARG_FROM] = wei;
    e.wei_in.RunKept(site->wei_in, 5);
    wei = site->wei;
  }
  site->args[DNNL_ARG_WEIGHTS] = wei;
  if (e.dst_out.needed) Point(site->dst, ScratchBuffer(3, site->dst_bytes));
  if (p.has_bias && !e.separate_bias) Point(site->bias, t.bias);
  const float* res = t.res;
  if (p.has_res && e.separate && t.res == t.out) {  // the deconvolution overwrites it
    void* copy = ScratchBuffer(4, site->out_bytes);
    std::memcpy(copy, t.res, site->out_bytes);
    res = static_cast<const float*>(copy);
  }
  if (p.has_res && !e.separate) {  // the sum post-op adds what dst holds: the residual
    if (e.res_in.needed) {
      Point(site->user_res, t.res);
      e.res_in.RunKept(site->res_in, 5);
    } else if (t.res != t.out) {
      std::memcpy(t.out, t.res, site->out_bytes);
    }
  }
  if (site->scratch_bytes > 0) Point(site->scratch, ScratchBuffer(0, site->scratch_bytes));
  Execute(e.prim, site->args);
  if (e.dst_out.needed) e.dst_out.RunKept(site->dst_out, 5);
  if (e.separate) {  // Out += bias (EpilogueBroken) + residual, then Out = act(Out)
    Stream().wait();
    if (e.separate_bias) AddBias(p, site->s, t.bias, t.out);
    if (p.has_res) {
      const size_t n = site->out_bytes / sizeof(float);
      for (size_t i = 0; i < n; ++i) t.out[i] += res[i];
    }
    if (e.has_act) Execute(e.act, site->act);
  }
  Stream().wait();
}

// ---------------------------------------------------------------------------------------------
// fmt=gemm on a site.

// Floats of one thread's column block: 1 MiB, which stay in cache (half of this machine's 2 MiB
// L2 per core) between the GEMM that writes them and the scatter that reads them (the data rows
// are cut into blocks to fit; at least one). Fewer, wider GEMMs: 256 KiB cut DCGAN's
// 1x128x16x16 -> 64 k4 s2 into four 1024x64x128 GEMMs at one thread, 1016 us per call against
// 885 us in one (per-call minima, 3 x 150 calls in fresh processes, load 4.8-6.1; the other
// paper layers within 4 %, docs/profiling.md, dcgan11).
constexpr int64_t kColFloats = 1 << 18;

// orow[x0 + w * sw] += c[w * es] for w in [lo, hi).
void AddStrided(float* orow, int64_t x0, int64_t sw, const float* c, int64_t es, int64_t lo,
                int64_t hi) {
  for (int64_t w = lo; w < hi; ++w) orow[w * sw + x0] += c[w * es];
}

// o[2w] += a[w], o[2w + 1] += b[w] for w in [0, n): two column rows of stride 2 whose outputs
// interleave into one contiguous run (the compiler vectorizes it: unpack and add).
void AddInterleaved(float* __restrict o, const float* __restrict a, const float* __restrict b,
                    int64_t n) {
  for (int64_t w = 0; w < n; ++w) {
    o[2 * w] += a[w];
    o[2 * w + 1] += b[w];
  }
}

// One data row's column rows of kernel row ky (kx = 0 .. KW-1, `crow` at kx = 0, `stride`
// floats between them, `es` between a row's data columns) added into output row `orow`: data
// column w of kernel column kx lands at x = w * SW - LEFT + kx * DW. With SW = 2, DW = 1 and
// unit `es` the kernel columns kx, kx + 1 fill alternate output columns, so they are added in
// pairs (AddInterleaved) on the columns both reach, one by one elsewhere.
void AddRow(const DeconvParams& p, const DeconvSite& site, float* orow, const float* crow,
            int64_t stride, int64_t es) {
  const int64_t kw = site.s.KW;
  int64_t kx = 0;
  if (p.sw == 2 && p.dw == 1 && es == 1) {
    for (; kx + 1 < kw; kx += 2) {
      const int64_t x0 = kx - p.pl, lo_a = site.w_lo[kx], hi_a = site.w_hi[kx];
      const int64_t lo_b = site.w_lo[kx + 1], hi_b = site.w_hi[kx + 1];
      const float* ca = crow + kx * stride;
      const float* cb = ca + stride;
      const int64_t lo = std::max(lo_a, lo_b), hi = std::max(lo, std::min(hi_a, hi_b));
      if (hi > lo) AddInterleaved(orow + 2 * lo + x0, ca + lo, cb + lo, hi - lo);
      AddStrided(orow, x0, 2, ca, 1, lo_a, std::min(lo, hi_a));
      AddStrided(orow, x0, 2, ca, 1, std::max(hi, lo_a), hi_a);
      AddStrided(orow, x0 + 1, 2, cb, 1, lo_b, std::min(lo, hi_b));
      AddStrided(orow, x0 + 1, 2, cb, 1, std::max(hi, lo_b), hi_b);
    }
  }
  for (; kx < kw; ++kx) {
    AddStrided(orow, kx * p.dw - p.pl, p.sw, crow + kx * stride, es, site.w_lo[kx],
               site.w_hi[kx]);
  }
}

// Out += the column rows of `channels` output channels for the block of data rows
// [h0, h0 + nh): column row (o, ky, kx) of data (h, w) lands at
// (h * SH - TOP + ky * DH, w * SW - LEFT + kx * DW) when inside Out. The columns are
// [rows, ncols] (element (r, j) at r * ncols + j), or transposed [ncols, rows].
void ScatterColumns(const DeconvParams& p, const DeconvSite& site, const float* cols,
                    int64_t ncols, int64_t h0, int64_t nh, int64_t channels, bool transposed,
                    float* out) {
  const DeconvShape& s = site.s;
  const int64_t ohw = s.OH * s.OW, rows = channels * s.KH * s.KW;
  const int64_t rs = transposed ? 1 : ncols, cs = transposed ? rows : 1;  // row, column strides
  for (int64_t o = 0; o < channels; ++o) {
    for (int64_t ky = 0; ky < s.KH; ++ky) {
      const float* krow = cols + (o * s.KH + ky) * s.KW * rs;
      for (int64_t h = h0; h < h0 + nh; ++h) {
        const int64_t y = h * p.sh - p.pt + ky * p.dh;
        if (y < 0 || y >= s.OH) continue;
        AddRow(p, site, out + o * ohw + y * s.OW, krow + (h - h0) * s.W * cs, rs, cs);
      }
    }
  }
}

// Whether a block's GEMM computes the columns transposed, cols^T = data^T @ weight: with few
// data columns (small inputs) oneDNN's sgemm runs that orientation faster (one thread, us,
// weight^T @ data vs data^T @ weight: 512 rows x 16 columns x 64 deep 15.4 vs 10.4; 48 x 1024
// x 8: 10.7 vs 9.1; 128 x 256 x 16: 11.3 vs 12.0), and the transposed columns still fit in L1.
constexpr int64_t kTransposedColumns = 16;

// Out channels [oa, ob) of group g of image n: filled with bias + residual, then per block of
// data rows one GEMM (cols = weight^T @ data) and its scatter (the activation follows, over the
// thread's whole range: GemmActivate).
void GemmChannels(const DeconvParams& p, const DeconvSite& site, const DeconvTensors& t,
                  int64_t n, int64_t g, int64_t oa, int64_t ob) {
  const DeconvShape& s = site.s;
  const int64_t og = s.O / p.groups, ig = s.C / p.groups, kk = s.KH * s.KW;
  const int64_t hw = s.H * s.W, ohw = s.OH * s.OW, channels = ob - oa, rows = channels * kk;
  const int64_t first = (n * s.O + g * og + oa) * ohw;
  float* out = t.out + first;
  for (int64_t o = 0; o < channels; ++o) {
    const float b = p.has_bias ? t.bias[g * og + oa + o] : 0.f;
    float* dst = out + o * ohw;
    if (p.has_res) {  // elementwise, so a residual that is Out itself is read before written
      const float* r = t.res + first + o * ohw;
      for (int64_t i = 0; i < ohw; ++i) dst[i] = r[i] + b;
    } else {
      std::fill(dst, dst + ohw, b);
    }
  }
  const int64_t hb = std::max<int64_t>(1, std::min(s.H, kColFloats / (rows * s.W)));
  float* cols = static_cast<float*>(ScratchBuffer(6, sizeof(float) * rows * hb * s.W));
  // the group's IOHW weight is the row-major [ig, og * kk] matrix; its columns from oa * kk
  const float* wg = t.w + g * ig * og * kk + oa * kk;
  // the group's data as [ig, H*W] (NCHW: leading dimension H*W) or its transpose [H*W, ig]
  // (channels-last: leading dimension C), read by the GEMM as stored
  const bool nhwc = p.src_nhwc;
  const float* xg = nhwc ? t.x + n * hw * s.C + g * ig : t.x + (n * s.C + g * ig) * hw;
  const int64_t ldx = nhwc ? s.C : hw, row_step = nhwc ? s.W * s.C : s.W;
  for (int64_t h0 = 0; h0 < s.H; h0 += hb) {
    const int64_t nh = std::min(hb, s.H - h0), ncols = nh * s.W;
    const bool transposed = ncols <= kTransposedColumns;
    const float* xb = xg + h0 * row_step;
    const dnnl_status_t st =
        transposed ? dnnl_sgemm(nhwc ? 'N' : 'T', 'N', ncols, rows, ig, 1.f, xb, ldx, wg,
                                og * kk, 0.f, cols, rows)
                   : dnnl_sgemm('T', nhwc ? 'T' : 'N', rows, ncols, ig, 1.f, wg, og * kk, xb,
                                ldx, 0.f, cols, ncols);
    if (st != dnnl_success) {
      TVM_FFI_THROW(RuntimeError) << kName << ": dnnl_sgemm failed (status "
                                  << static_cast<int>(st) << ")";
    }
    ScatterColumns(p, site, cols, ncols, h0, nh, channels, transposed, out);
  }
}

// Whether fmt=gemm applies the activation with oneDNN's eltwise primitive rather than
// ApplyActivation's loops (activation.cc): only for GELU's erf, which those call per element.
// DCGAN quick's last layer, 3x64x64 outputs with tanh, one thread: libm's tanh per element made
// the call 176 us, oneDNN's eltwise tanh 71 us (its AVX2 tanh gathers table coefficients), the
// vector loops 41 us, the deconvolution without an epilogue 32 us (docs/profiling.md, "gap15").
bool GemmActivationByOneDNN(const Activation& act) { return act.kind == Act::kGelu; }

// The per-thread eltwise primitives of a fmt=gemm site for `nthr` threads splitting `units`
// output channels (RunGemm's ranges), made once per site and thread count.
void BindGemmActivation(const DeconvParams& p, DeconvSite* site, int nthr, int64_t units) {
  const int64_t ohw = site->s.OH * site->s.OW;
  site->act_prims.clear();
  site->act_mems.clear();
  site->act_args.clear();
  for (int64_t i = 0; i < nthr; ++i) {
    const int64_t count = (units * (i + 1) / nthr - units * i / nthr) * ohw;
    const dnnl::memory::desc md(dims{count}, dt::f32, dims{1});
    site->act_prims.push_back(ActivationPrimitive(p.act, md));
    site->act_mems.push_back(dnnl::memory(md, Engine(), DNNL_MEMORY_NONE));
    site->act_args.push_back(
        {{DNNL_ARG_SRC, site->act_mems.back()}, {DNNL_ARG_DST, site->act_mems.back()}});
  }
  site->act_nthr = nthr;
}

// The activation over Out's output channels [u0, u1) (contiguous: channel unit u of image n,
// group g is n * O + g * O/G + o) on thread `i` of the call.
void GemmActivate(const DeconvParams& p, DeconvSite* site, const DeconvTensors& t, int64_t u0,
                  int64_t u1, int i, bool nested) {
  const int64_t ohw = site->s.OH * site->s.OW;
  float* out = t.out + u0 * ohw;
  if (!GemmActivationByOneDNN(p.act)) {
    ApplyActivation(p.act, out, (u1 - u0) * ohw, !nested);
    return;
  }
  Point(site->act_mems[i], out);
  Execute(site->act_prims[i], site->act_args[i]);
  Stream().wait();
}

// fmt=gemm on a channels-last source or destination (file comment): per image, one GEMM per
// group into cols[H*W, O/G*KH*KW] (row r: data position r; column o*KH*KW + ky*KW + kx), then
// output row y, filled with bias + residual, gathers the columns of the data rows
// h = (y + TOP - ky*DH) / SH that land in it. Each output row is written by one thread, so the
// rows are split over the OpenMP threads without locks; the activation follows over all of Out.
void RunGemmPositions(const DeconvParams& p, DeconvSite* site, const DeconvTensors& t) {
  const DeconvShape& s = site->s;
  const int64_t og = s.O / p.groups, ig = s.C / p.groups, kk = s.KH * s.KW, hw = s.H * s.W;
  const int64_t ncol = og * kk, gcols = hw * ncol;
  const dims xs = ActivationStrides(p.src_nhwc, s.C, s.H, s.W);
  const dims os = ActivationStrides(p.dst_nhwc, s.O, s.OH, s.OW);
  float* cols = static_cast<float*>(ScratchBuffer(6, sizeof(float) * p.groups * gcols));
  const int nthr = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), s.OH));
  for (int64_t n = 0; n < s.N; ++n) {
    for (int64_t g = 0; g < p.groups; ++g) {
      const float* xg = t.x + n * xs[0] + g * ig * xs[1];
      const float* wg = t.w + g * ig * ncol;  // the group's IOHW weight: [ig, og * kk]
      const dnnl_status_t st =
          p.src_nhwc ? dnnl_sgemm('N', 'N', hw, ncol, ig, 1.f, xg, s.C, wg, ncol, 0.f,
                                  cols + g * gcols, ncol)
                     : dnnl_sgemm('T', 'N', hw, ncol, ig, 1.f, xg, hw, wg, ncol, 0.f,
                                  cols + g * gcols, ncol);
      if (st != dnnl_success) {
        TVM_FFI_THROW(RuntimeError) << kName << ": dnnl_sgemm failed (status "
                                    << static_cast<int>(st) << ")";
      }
    }
    float* out = t.out + n * os[0];
    const float* res = p.has_res ? t.res + n * os[0] : nullptr;
    auto row = [&](int64_t y) {
      for (int64_t x = 0; x < s.OW; ++x) {  // bias + residual (read before written: may be Out)
        for (int64_t o = 0; o < s.O; ++o) {
          const int64_t i = y * os[2] + x * os[3] + o * os[1];
          out[i] = (res ? res[i] : 0.f) + (p.has_bias ? t.bias[o] : 0.f);
        }
      }
      for (int64_t ky = 0; ky < s.KH; ++ky) {
        const int64_t num = y + p.pt - ky * p.dh;
        if (num < 0 || num % p.sh != 0 || num / p.sh >= s.H) continue;
        const int64_t h = num / p.sh;
        for (int64_t w = 0; w < s.W; ++w) {
          for (int64_t kx = 0; kx < s.KW; ++kx) {
            const int64_t x = w * p.sw - p.pl + kx * p.dw;
            if (x < 0 || x >= s.OW) continue;
            const float* c = cols + (h * s.W + w) * ncol + ky * s.KW + kx;
            float* dst = out + y * os[2] + x * os[3];
            for (int64_t g = 0; g < p.groups; ++g) {
              for (int64_t o = 0; o < og; ++o) dst[(g * og + o) * os[1]] += c[g * gcols + o * kk];
            }
          }
        }
      }
    };
    if (nthr <= 1) {
      for (int64_t y = 0; y < s.OH; ++y) row(y);
    } else {
#pragma omp parallel for num_threads(nthr) schedule(static)
      for (int64_t y = 0; y < s.OH; ++y) row(y);
    }
  }
  if (p.act.kind == Act::kNone) return;
  const int64_t units = s.N * s.O;  // Out holds units * OH * OW floats in either format
  if (!GemmActivationByOneDNN(p.act)) {
    ApplyActivation(p.act, t.out, units * s.OH * s.OW);
    return;
  }
  if (site->act_nthr != 1) BindGemmActivation(p, site, 1, units);
  GemmActivate(p, site, t, 0, units, 0, false);
}

// fmt=gemm: the output channels of every image and group, split into one contiguous range per
// OpenMP thread (one parallel region); with one range (one thread, or a single output channel)
// on the calling thread, where dnnl_sgemm may use the threads itself.
void RunGemm(const DeconvParams& p, DeconvSite* site, const DeconvTensors& t) {
  const DeconvShape& s = site->s;
  const int64_t og = s.O / p.groups, units = s.N * p.groups * og;
  const int nthr = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), units));
  if (GemmActivationByOneDNN(p.act) && site->act_nthr != std::max(nthr, 1)) {
    BindGemmActivation(p, site, std::max(nthr, 1), units);
  }
  auto run = [&](int64_t u0, int64_t u1, int i, bool nested) {
    for (int64_t u = u0; u < u1;) {  // cut at image and group boundaries
      const int64_t ng = u / og, oa = u % og, ob = std::min(og, oa + (u1 - u));
      GemmChannels(p, *site, t, ng / p.groups, ng % p.groups, oa, ob);
      u += ob - oa;
    }
    GemmActivate(p, site, t, u0, u1, i, nested);
  };
  if (nthr <= 1) {
    run(0, units, 0, false);
    return;
  }
  std::string error;
#pragma omp parallel num_threads(nthr)
  {
    // nthr ranges whatever the team's size (BindGemmActivation made one primitive per range)
    const int team = omp_get_num_threads();
    try {
      for (int i = omp_get_thread_num(); i < nthr; i += team) {
        run(units * i / nthr, units * (i + 1) / nthr, i, true);
      }
    } catch (const std::exception& ex) {  // no exception may leave a parallel region
#pragma omp critical(tvm_ollie_deconv_error)
      error = ex.what();
    } catch (...) {
#pragma omp critical(tvm_ollie_deconv_error)
      error = "unknown error";
    }
  }
  if (!error.empty()) TVM_FFI_THROW(RuntimeError) << kName << ": " << error;
}

void Conv2dTranspose(ffi::PackedArgs args, ffi::Any* rv) {
  constexpr size_t kMaxSites = 256;  // per attribute string and thread
  ThreadScope threads;
  std::optional<ffi::String> holder;
  DeconvCall& call = ParsedAttrs<DeconvCall>(AttrsView(args, kName, &holder), ParseDeconvCall);
  const DeconvParams& p = call.p;
  const DeconvTensors t = CheckDeconvTensors(p, args);
  ShapeKey key;
  const bool keyed = key.Add(t.X) && key.Add(t.Wt) && (!t.Bias || key.Add(*t.Bias)) &&
                     (!t.Res || key.Add(*t.Res)) && key.Add(t.Out);
  auto it = keyed ? call.sites.find(key) : call.sites.end();
  DeconvSite* site;
  std::optional<DeconvSite> unkept;
  if (it != call.sites.end()) {
    site = it->second.get();
  } else {
    std::optional<DeconvSite> resolved = ResolveSite(p, t);
    if (!resolved.has_value()) return;  // empty Out (N == 0)
    if (keyed) {
      if (call.sites.size() >= kMaxSites) call.sites.clear();
      site = call.sites.emplace(key, std::make_unique<DeconvSite>(std::move(*resolved)))
                 .first->second.get();
    } else {
      unkept = std::move(resolved);
      site = &*unkept;
    }
  }
  threads.SerialBelow(site->flops, &site->best_ns);
  if (site->fmt == Fmt::kGemm) {
    if (PositionsNeeded(p, site->s)) {
      RunGemmPositions(p, site, t);
    } else {
      RunGemm(p, site, t);
    }
    return;
  }
  const int nthr = omp_get_max_threads();
  if (site->nthr != nthr) BindSite(p, site, nthr);
  RunSite(p, site, t);
}

}  // namespace

std::string Conv2dTransposeInfo() {
  return "conv2d_transpose default: oneDNN deconvolution on its blocked formats with reorders "
         "inside the call, except without groups when the weights are larger than data + output "
         "or there are fewer than 16 output channels: a GEMM and a scatter of its columns "
         "(fmt=gemm), bias, residual and activation fused";
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef().def_packed(kName, Conv2dTranspose);
}

}  // namespace tvm_ollie
