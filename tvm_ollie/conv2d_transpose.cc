// tvm_ollie.cpu.conv2d_transpose: Out = act(conv2d_transpose(data, weight) + bias + residual),
// float32, oneDNN deconvolution_forward.
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
//        fmt=plain|blocked (oneDNN on the caller's formats, or on oneDNN's preferred formats with
//        reorders inside the call; default: see ChooseFormat).
// The residual is a sum post-op (Out prefilled with it), not binary_add: see CreateDeconv.
// oneDNN has no output padding: it is expressed as a smaller right padding (BOTTOM - OPH), which
// oneDNN accepts while it is > -stride, hence the requirement OPH < SH (OPW < SW).
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "kernels.h"

namespace tvm_ollie {

namespace ffi = tvm::ffi;

namespace {

constexpr const char* kName = "tvm_ollie.cpu.conv2d_transpose";

enum class Fmt { kAuto, kPlain, kBlocked };

struct DeconvParams {
  int64_t sh = 1, sw = 1, pt = 0, pl = 0, pb = 0, pr = 0, oph = 0, opw = 0, dh = 1, dw = 1;
  int64_t groups = 1;
  bool has_bias = false, has_res = false;
  Activation act;
  Fmt fmt = Fmt::kAuto;
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
  std::string fmt = attrs.GetStr("fmt", "auto", {"auto", "plain", "blocked"});
  p.fmt = fmt == "plain" ? Fmt::kPlain : (fmt == "blocked" ? Fmt::kBlocked : Fmt::kAuto);
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
  DeconvShape s{x[0], x[1], x[2], x[3], w[1] * p.groups, w[2], w[3], 0, 0};
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
  std::vector<int64_t> want{s.N, s.O, s.OH, s.OW};
  if (out != want) {
    TVM_FFI_THROW(ValueError) << kName << ": Out has shape " << DimsStr(out) << ", expected "
                              << DimsStr(want) << " for data " << DimsStr(x) << " and weight "
                              << DimsStr(w) << " with \"" << p.canonical << "\"";
  }
  return s;
}

using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;

dnnl::memory::desc NchwDesc(int64_t n, int64_t c, int64_t h, int64_t w) {
  return dnnl::memory::desc(dims{n, c, h, w}, dt::f32, dims{c * h * w, h * w, w, 1});
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
  if (wsize > asize || s.O < 16) return Fmt::kPlain;
  return Fmt::kBlocked;
}

dnnl::memory::desc AnyDesc(const dnnl::memory::desc& md) {
  return dnnl::memory::desc(md.get_dims(), dt::f32, dnnl::memory::format_tag::any);
}

std::shared_ptr<OneDNNDeconv> CreateDeconv(const DeconvParams& p, const DeconvShape& s,
                                           Fmt fmt) {
  auto e = std::make_shared<OneDNNDeconv>();
  e->user_src = NchwDesc(s.N, s.C, s.H, s.W);
  e->user_dst = NchwDesc(s.N, s.O, s.OH, s.OW);
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
  // follow the deconvolution instead (SeparateEpilogue).
  e->separate = SeparateEpilogue(p, fmt);
  const dnnl::primitive_attr attr =
      e->separate ? ConvEpilogueAttr(false, Activation()) : ConvEpilogueAttr(p.has_res, p.act);
  const auto prop = dnnl::prop_kind::forward_inference;
  const auto alg = dnnl::algorithm::deconvolution_direct;
  dnnl::deconvolution_forward::primitive_desc pd;
  if (p.has_bias) {
    e->bias_md = dnnl::memory::desc(dims{s.O}, dt::f32, dims{1});
    pd = dnnl::deconvolution_forward::primitive_desc(Engine(), prop, alg, src_any, wei_any,
                                                     e->bias_md, dst_any, strides, dil, pad_l,
                                                     pad_r, attr);
  } else {
    pd = dnnl::deconvolution_forward::primitive_desc(Engine(), prop, alg, src_any, wei_any,
                                                     dst_any, strides, dil, pad_l, pad_r, attr);
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

// Out += residual, then Out = act(Out): the epilogue of a SeparateEpilogue deconvolution.
// ``res`` is the residual (a copy when it was Out itself, which the deconvolution overwrote).
void RunSeparateEpilogue(const OneDNNDeconv& e, const float* res, const dnnl::memory& out) {
  Stream().wait();
  float* o = static_cast<float*>(out.get_data_handle());
  if (res != nullptr) {
    const size_t n = e.user_dst.get_size() / sizeof(float);
    for (size_t i = 0; i < n; ++i) o[i] += res[i];
  }
  if (e.has_act) e.act.execute(Stream(), {{DNNL_ARG_SRC, out}, {DNNL_ARG_DST, out}});
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

// The operands of one call, checked.
struct DeconvArgs {
  DeconvParams p;
  DeconvShape s;
  float *x = nullptr, *w = nullptr, *bias = nullptr, *res = nullptr, *out = nullptr;
};

DeconvArgs ParseArgs(ffi::PackedArgs args) {
  if (args.size() < 1) TVM_FFI_THROW(TypeError) << kName << ": missing attrs";
  auto attrs_opt = args[0].try_cast<ffi::String>();
  if (!attrs_opt.has_value()) {
    TVM_FFI_THROW(TypeError) << kName << ": first argument must be the attrs string";
  }
  DeconvArgs a;
  a.p = ParsedAttrs<DeconvParams>(std::string(attrs_opt.value()), ParseDeconvAttrs);
  const DeconvParams& p = a.p;
  const int want = 4 + (p.has_bias ? 1 : 0) + (p.has_res ? 1 : 0);
  if (args.size() != want) {
    TVM_FFI_THROW(TypeError) << kName << ": expected " << want << " arguments (attrs, data, weight"
                             << (p.has_bias ? ", bias" : "") << (p.has_res ? ", residual" : "")
                             << ", Out) for attrs \"" << p.canonical << "\", got "
                             << args.size();
  }
  int i = 1;
  ffi::TensorView X = TensorArg(args, i++, "data");
  ffi::TensorView Wt = TensorArg(args, i++, "weight");
  a.x = CheckFloatTensor(X, kName, "data", 4);
  a.w = CheckFloatTensor(Wt, kName, "weight", 4);
  std::optional<ffi::TensorView> Bias, Res;
  if (p.has_bias) {
    Bias = TensorArg(args, i++, "bias");
    a.bias = CheckFloatTensor(*Bias, kName, "bias", 1);
  }
  if (p.has_res) {
    Res = TensorArg(args, i++, "residual");
    a.res = CheckFloatTensor(*Res, kName, "residual", 0);
  }
  ffi::TensorView Out = TensorArg(args, i++, "Out");
  a.out = CheckFloatTensor(Out, kName, "Out", 4);
  a.s = CheckDeconvShapes(p, Dims(X), Dims(Wt), Dims(Out));
  if (Bias.has_value() && (Bias->ndim() != 1 || Bias->shape()[0] != a.s.O)) {
    TVM_FFI_THROW(ValueError) << kName << ": bias has shape " << ShapeStr(*Bias) << ", expected ["
                              << a.s.O << "]";
  }
  if (Res.has_value() && Dims(*Res) != Dims(Out)) {
    TVM_FFI_THROW(ValueError) << kName << ": residual has shape " << ShapeStr(*Res)
                              << ", expected Out's shape " << ShapeStr(Out);
  }
  return a;
}

void Conv2dTranspose(ffi::PackedArgs args, ffi::Any* rv) {
  ThreadScope threads;
  DeconvArgs a = ParseArgs(args);
  const DeconvParams& p = a.p;
  if (a.s.N == 0) return;
  // every input element meets O / groups * KH * KW weights (multiply and add each)
  const double flops = 2.0 * a.s.N * a.s.C * a.s.H * a.s.W * (a.s.O / p.groups) * a.s.KH * a.s.KW;
  threads.SerialBelow(flops);
  const Fmt fmt = p.fmt == Fmt::kAuto ? ChooseFormat(p, a.s) : p.fmt;
  auto e = CachedGet<OneDNNDeconv>(DeconvKey(p, a.s, fmt),
                                   [&]() { return CreateDeconv(p, a.s, fmt); });
  const dnnl::engine& eng = Engine();
  dnnl::memory user_src(e->user_src, eng, a.x), user_dst(e->user_dst, eng, a.out);
  dnnl::memory src = user_src, dst = user_dst, wei(e->user_wei, eng, a.w);
  // Scratch slots: 0 primitive scratchpad, 1 src, 2 weights, 3 dst, 4 residual, 5 reorders.
  if (e->src_in.needed) {
    src = dnnl::memory(e->src_md, eng, ScratchBuffer(1, e->src_md.get_size()));
    e->src_in.Run(user_src, src, 5);
  }
  if (e->wei_in.needed) {
    dnnl::memory user_wei = wei;
    wei = dnnl::memory(e->wei_md, eng, ScratchBuffer(2, e->wei_md.get_size()));
    e->wei_in.Run(user_wei, wei, 5);
  }
  if (e->dst_out.needed) dst = dnnl::memory(e->dst_md, eng, ScratchBuffer(3, e->dst_md.get_size()));
  std::unordered_map<int, dnnl::memory> cargs{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei},
                                              {DNNL_ARG_DST, dst}};
  if (p.has_bias) cargs[DNNL_ARG_BIAS] = dnnl::memory(e->bias_md, eng, a.bias);
  const float* res = a.res;
  if (p.has_res && e->separate && a.res == a.out) {  // the deconvolution overwrites it
    void* copy = ScratchBuffer(4, e->user_dst.get_size());
    std::memcpy(copy, a.res, e->user_dst.get_size());
    res = static_cast<const float*>(copy);
  }
  if (p.has_res && !e->separate) {  // the sum post-op adds what dst holds: the residual
    if (e->res_in.needed) {
      e->res_in.Run(dnnl::memory(e->user_dst, eng, a.res), dst, 5);
    } else if (a.res != a.out) {
      std::memcpy(a.out, a.res, e->user_dst.get_size());
    }
  }
  const size_t scratch = e->scratch_md.get_size();
  if (scratch > 0) {
    cargs[DNNL_ARG_SCRATCHPAD] = dnnl::memory(e->scratch_md, eng, ScratchBuffer(0, scratch));
  }
  e->prim.execute(Stream(), cargs);
  if (e->dst_out.needed) e->dst_out.Run(dst, user_dst, 5);
  if (e->separate) RunSeparateEpilogue(*e, p.has_res ? res : nullptr, user_dst);
  Stream().wait();
}

}  // namespace

std::string Conv2dTransposeInfo() {
  return "conv2d_transpose default: oneDNN deconvolution on its blocked formats with reorders "
         "inside the call, except without groups when the weights are larger than data + output "
         "or there are fewer than 16 output channels: oneDNN on plain formats, with the residual "
         "and activation applied after it (not as post-ops)";
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef().def_packed(kName, Conv2dTranspose);
}

}  // namespace tvm_ollie
