// tvm_ollie.cpu.conv2d: Out = act(conv2d(data, weight) + bias + residual), float32, oneDNN.
//
// Calling convention (destination-passing style, Out last):
//   tvm_ollie.cpu.conv2d(attrs: str, data, weight, [bias], [residual], Out)
// attrs: layout=NCHW|NHWC, klayout=OIHW|HWIO|OHWI, stride=SH,SW, pad=TOP,LEFT,BOTTOM,RIGHT,
//        dil=DH,DW, groups=G, bias=0|1, res=0|1, act=... (as matmul),
//        fmt=plain|blocked (implementation: oneDNN on the user's formats, or on the formats
//        oneDNN prefers with reorders inside the call; default: see ChooseFormat),
//        src_fmt=F;[src_c=C] / dst_fmt=F;[dst_c=O] (layout=NCHW only): the format of data /
//        Out (and residual), F one of nchw (default), nhwc (4-D [N, H, W, C]), nChw4c,
//        nChw8c, nChw16c (5-D [N, ceil(C/B), H, W, B], the channel count given by src_c/dst_c,
//        padding channels zero: the kernel writes zeros there). Chains of convolutions keep
//        their activations in the format oneDNN prefers (tvm_ollie.cpu.conv2d_preferred_format)
//        and skip the reorders of every call (docs/layouts.md).
//
//   tvm_ollie.cpu.conv2d_preferred_format(attrs, data_shape, weight_shape) -> [src, dst]: the
//   formats oneDNN picks for src and dst with format_tag::any for this problem on this CPU, as
//   src_fmt values, or "other".
//
// Per call: each thread keeps, with the parsed attrs and per argument shapes, a call site
// (ConvSite: the resolved problem, the primitive, the pack hash and the call's dnnl::memory
// objects with their handles reset per call), so that a model's repeated call builds no string,
// takes no lock and allocates nothing of ours (docs/native-library.md, "Per call").
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "kernels.h"
#include "weight_pack.h"

namespace tvm_ollie {

namespace ffi = tvm::ffi;

namespace {

constexpr const char* kName = "tvm_ollie.cpu.conv2d";

enum class Fmt { kAuto, kPlain, kBlocked };

struct ConvParams {
  bool nhwc = false;
  std::string klayout = "OIHW";
  int64_t sh = 1, sw = 1, pt = 0, pl = 0, pb = 0, pr = 0, dh = 1, dw = 1, groups = 1;
  bool has_bias = false, has_res = false;
  Activation act;
  Fmt fmt = Fmt::kAuto;
  bool wpacked = false;        // weight given as the output of conv2d_pack_weight
  int64_t pkh = 0, pkw = 0;    // kernel size (attrs "kernel=KH,KW"), required with wpacked=1
  int64_t src_blk = 0, src_c = 0, dst_blk = 0, dst_c = 0;  // src_fmt/dst_fmt (FormatBlock)
  std::string canonical;       // every key but fmt/wpacked/kernel (cache and pack key)
};

// The activation formats of src_fmt/dst_fmt as a block: 0 plain NCHW, -1 channels-last (NHWC),
// B > 0 nChw{B}c.
constexpr int64_t kChannelsLast = -1;

int64_t FormatBlock(const std::string& fmt) {
  if (fmt == "nchw") return 0;
  if (fmt == "nhwc") return kChannelsLast;
  return std::stoll(fmt.substr(4, fmt.size() - 5));  // nChw{B}c
}

std::string BlockFormat(int64_t blk) {
  if (blk == 0) return "nchw";
  if (blk == kChannelsLast) return "nhwc";
  return "nChw" + std::to_string(blk) + "c";
}

// "<side>_fmt=F;<side>_c=C": the format of an activation, and its channel count C when blocked.
void ParseBlock(Attrs* attrs, const std::string& side, int64_t* blk, int64_t* c) {
  *blk = FormatBlock(attrs->GetStr(side + "_fmt", "nchw",
                                   {"nchw", "nhwc", "nChw4c", "nChw8c", "nChw16c"}));
  *c = attrs->GetInt(side + "_c", 0);
  if (*blk > 0 && *c < 1) {
    TVM_FFI_THROW(ValueError) << kName << ": " << side << "_fmt=" << BlockFormat(*blk)
                              << " needs " << side << "_c >= 1 (the channel count)";
  }
  if (*blk <= 0 && *c != 0) {
    TVM_FFI_THROW(ValueError) << kName << ": " << side << "_c is only for blocked " << side
                              << "_fmt (nChw{B}c)";
  }
}

ConvParams ParseConvAttrs(const std::string& text) {
  Attrs attrs(kName, text);
  ConvParams p;
  p.nhwc = attrs.GetStr("layout", "NCHW", {"NCHW", "NHWC"}) == "NHWC";
  p.klayout = attrs.GetStr("klayout", "OIHW", {"OIHW", "HWIO", "OHWI"});
  auto s = attrs.GetInts("stride", 2, {1, 1});
  auto pad = attrs.GetInts("pad", 4, {0, 0, 0, 0});
  auto d = attrs.GetInts("dil", 2, {1, 1});
  p.groups = attrs.GetInt("groups", 1);
  p.has_bias = attrs.GetBool("bias", false);
  p.has_res = attrs.GetBool("res", false);
  p.act = ParseActivation(attrs, attrs.GetRaw("act", "none"));
  std::string fmt = attrs.GetStr("fmt", "auto", {"auto", "plain", "blocked"});
  p.fmt = fmt == "plain" ? Fmt::kPlain : (fmt == "blocked" ? Fmt::kBlocked : Fmt::kAuto);
  p.wpacked = attrs.GetBool("wpacked", false);
  ParseBlock(&attrs, "src", &p.src_blk, &p.src_c);
  ParseBlock(&attrs, "dst", &p.dst_blk, &p.dst_c);
  if ((p.src_blk || p.dst_blk) && p.nhwc) {
    TVM_FFI_THROW(ValueError) << kName << ": src_fmt/dst_fmt need layout=NCHW";
  }
  if ((p.src_blk || p.dst_blk) && p.fmt == Fmt::kPlain) {
    TVM_FFI_THROW(ValueError) << kName << ": src_fmt/dst_fmt cannot be combined with fmt=plain";
  }
  if (attrs.Has("kernel")) {
    auto kk = attrs.GetInts("kernel", 2, {0, 0});
    p.pkh = kk[0];
    p.pkw = kk[1];
    if (p.pkh < 1 || p.pkw < 1) TVM_FFI_THROW(ValueError) << kName << ": kernel must be >= 1";
  }
  if (p.wpacked && p.pkh == 0) {
    TVM_FFI_THROW(ValueError) << kName << ": wpacked=1 needs kernel=KH,KW";
  }
  if (p.wpacked && p.fmt == Fmt::kPlain) {
    TVM_FFI_THROW(ValueError) << kName << ": wpacked=1 cannot be combined with fmt=plain";
  }
  attrs.CheckAllUsed();
  p.sh = s[0];
  p.sw = s[1];
  p.pt = pad[0];
  p.pl = pad[1];
  p.pb = pad[2];
  p.pr = pad[3];
  p.dh = d[0];
  p.dw = d[1];
  if (p.sh < 1 || p.sw < 1) TVM_FFI_THROW(ValueError) << kName << ": stride must be >= 1";
  if (p.dh < 1 || p.dw < 1) TVM_FFI_THROW(ValueError) << kName << ": dil must be >= 1";
  if (p.pt < 0 || p.pl < 0 || p.pb < 0 || p.pr < 0) {
    TVM_FFI_THROW(ValueError) << kName << ": pad must be >= 0";
  }
  if (p.groups < 1) TVM_FFI_THROW(ValueError) << kName << ": groups must be >= 1";
  p.canonical = std::string("layout=") + (p.nhwc ? "NHWC" : "NCHW") + ";klayout=" + p.klayout +
                ";stride=" + std::to_string(p.sh) + "," + std::to_string(p.sw) +
                ";pad=" + std::to_string(p.pt) + "," + std::to_string(p.pl) + "," +
                std::to_string(p.pb) + "," + std::to_string(p.pr) + ";dil=" +
                std::to_string(p.dh) + "," + std::to_string(p.dw) +
                ";groups=" + std::to_string(p.groups) + ";bias=" + (p.has_bias ? "1" : "0") +
                ";res=" + (p.has_res ? "1" : "0") + ";act=" + p.act.text;
  if (p.src_blk) {
    p.canonical += ";src_fmt=" + BlockFormat(p.src_blk) + ":" + std::to_string(p.src_c);
  }
  if (p.dst_blk) {
    p.canonical += ";dst_fmt=" + BlockFormat(p.dst_blk) + ":" + std::to_string(p.dst_c);
  }
  return p;
}

struct ConvShape {
  int64_t N, C, H, W, O, I, KH, KW, OH, OW;
};

std::string DimsStr(const std::vector<int64_t>& d) {
  std::string out = "[";
  for (size_t i = 0; i < d.size(); ++i) out += (i ? ", " : "") + std::to_string(d[i]);
  return out + "]";
}

// The logical NCHW dims of an activation given as `d`: itself when plain (blk 0), [N, H, W, C]
// when channels-last, else the blocked [N, ceil(C/B), H, W, B] checked against the channel
// count c.
std::vector<int64_t> LogicalDims(const std::vector<int64_t>& d, int64_t blk, int64_t c,
                                 const char* what) {
  if (blk == 0) return d;
  if (blk == kChannelsLast) {
    if (d.size() != 4) {
      TVM_FFI_THROW(ValueError) << kName << ": " << what << " has shape " << DimsStr(d)
                                << ", expected the 4-D [N, H, W, C] of nhwc";
    }
    return {d[0], d[3], d[1], d[2]};
  }
  if (d.size() != 5 || d[1] != (c + blk - 1) / blk || d[4] != blk) {
    TVM_FFI_THROW(ValueError) << kName << ": " << what << " has shape " << DimsStr(d)
                              << ", expected the blocked [N, " << (c + blk - 1) / blk
                              << ", H, W, " << blk << "] of " << c << " channels";
  }
  return {d[0], c, d[2], d[3]};
}

// Shapes given as dims (data, weight in klayout order, Out); `out` may be null (pack_weight).
ConvShape CheckConvShapes(const ConvParams& p, const std::vector<int64_t>& x,
                          const std::vector<int64_t>& w, const std::vector<int64_t>* out) {
  if (x.size() != 4 || w.size() != 4 || (out && out->size() != 4)) {
    TVM_FFI_THROW(ValueError) << kName << ": data, weight and Out must be 4-D, got data "
                              << DimsStr(x) << ", weight " << DimsStr(w)
                              << (out ? ", Out " + DimsStr(*out) : std::string());
  }
  ConvShape s;
  s.N = x[0];
  s.C = p.nhwc ? x[3] : x[1];
  s.H = p.nhwc ? x[1] : x[2];
  s.W = p.nhwc ? x[2] : x[3];
  if (p.klayout == "OIHW") {
    s.O = w[0], s.I = w[1], s.KH = w[2], s.KW = w[3];
  } else if (p.klayout == "HWIO") {
    s.KH = w[0], s.KW = w[1], s.I = w[2], s.O = w[3];
  } else {  // OHWI
    s.O = w[0], s.KH = w[1], s.KW = w[2], s.I = w[3];
  }
  if (s.I * p.groups != s.C || s.O % p.groups != 0 || s.O == 0) {
    TVM_FFI_THROW(ValueError) << kName << ": weight " << DimsStr(w) << " (" << p.klayout
                              << ") does not fit data " << DimsStr(x) << " with groups="
                              << p.groups << " (need I * groups == C and O % groups == 0)";
  }
  if (s.KH < 1 || s.KW < 1) TVM_FFI_THROW(ValueError) << kName << ": empty kernel";
  const int64_t ekh = (s.KH - 1) * p.dh + 1, ekw = (s.KW - 1) * p.dw + 1;
  const int64_t hp = s.H + p.pt + p.pb, wp = s.W + p.pl + p.pr;
  if (hp < ekh || wp < ekw) {
    TVM_FFI_THROW(ValueError) << kName << ": the (dilated) kernel " << ekh << "x" << ekw
                              << " is larger than the padded input " << hp << "x" << wp;
  }
  s.OH = (hp - ekh) / p.sh + 1;
  s.OW = (wp - ekw) / p.sw + 1;
  std::vector<int64_t> want = p.nhwc ? std::vector<int64_t>{s.N, s.OH, s.OW, s.O}
                                     : std::vector<int64_t>{s.N, s.O, s.OH, s.OW};
  if (out && *out != want) {
    TVM_FFI_THROW(ValueError) << kName << ": Out has shape " << DimsStr(*out) << ", expected "
                              << DimsStr(want) << " for data " << DimsStr(x) << " and weight "
                              << DimsStr(w) << " with \"" << p.canonical << "\"";
  }
  return s;
}

using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;

dnnl::memory::desc ActivationDesc(bool nhwc, int64_t n, int64_t c, int64_t h, int64_t w,
                                  int64_t blk = 0) {
  dims d{n, c, h, w};
  if (blk == kChannelsLast) nhwc = true;
  if (blk > 0) {
    using tag = dnnl::memory::format_tag;
    return dnnl::memory::desc(d, dt::f32,
                              blk == 16 ? tag::nChw16c : (blk == 8 ? tag::nChw8c : tag::nChw4c));
  }
  dims st = nhwc ? dims{h * w * c, 1, w * c, c} : dims{c * h * w, h * w, w, 1};
  return dnnl::memory::desc(d, dt::f32, st);
}

// The user's weight as oneDNN dims {O, I, KH, KW} (or {G, O/G, I, KH, KW}) with the strides of
// its layout.
dnnl::memory::desc WeightDesc(const ConvParams& p, const ConvShape& s) {
  int64_t so, si, sh, sw;  // element strides of o, i, kh, kw
  if (p.klayout == "OIHW") {
    so = s.I * s.KH * s.KW, si = s.KH * s.KW, sh = s.KW, sw = 1;
  } else if (p.klayout == "HWIO") {
    so = 1, si = s.O, sh = s.KW * s.I * s.O, sw = s.I * s.O;
  } else {  // OHWI
    so = s.KH * s.KW * s.I, si = 1, sh = s.KW * s.I, sw = s.I;
  }
  if (p.groups == 1) {
    return dnnl::memory::desc(dims{s.O, s.I, s.KH, s.KW}, dt::f32, dims{so, si, sh, sw});
  }
  const int64_t og = s.O / p.groups;
  return dnnl::memory::desc(dims{p.groups, og, s.I, s.KH, s.KW}, dt::f32,
                            dims{og * so, so, si, sh, sw});
}

struct OneDNNConv {
  dnnl::convolution_forward prim;
  dnnl::memory::desc user_src, user_wei, user_dst, bias_md;
  dnnl::memory::desc src_md, wei_md, dst_md, scratch_md;
  Reorder src_in, wei_in, res_in, dst_out;
  // src_md / dst_md differ from the user's descriptor but address the same bytes (SameBytes):
  // the primitive reads or writes the user's buffer through its own descriptor, no reorder
  bool src_alias = false, dst_alias = false;
  size_t wei_bytes = 0;  // wei_md.get_size(), read by every packed call (not recomputed there)
  std::string impl;  // the oneDNN implementation name (for info/benchmarks)
};

// The strides of a blocked descriptor as if it were plain: a format with one inner block as wide
// as its dimension (nChw16c with 16 channels) puts that dimension's elements next to each other,
// exactly as channels-last does. Empty when the descriptor has other blocks or padding.
dims PlainStrides(const dnnl::memory::desc& m) {
  if (m.get_format_kind() != dnnl::memory::format_kind::blocked ||
      m.get_padded_dims() != m.get_dims() || m.get_submemory_offset() != 0) {
    return {};
  }
  dims strides = m.get_strides();
  const int nblks = m.get_inner_nblks();
  if (nblks == 0) return strides;
  const int64_t axis = m.get_inner_idxs()[0];
  if (nblks > 1 || m.get_inner_blks()[0] != m.get_dims()[axis]) return {};
  strides[axis] = 1;
  return strides;
}

// Whether two descriptors put every element at the same offset, so that a reorder between them
// would copy a tensor onto itself: the 3-channel stem of YOLOX (a 6x6 stride-2 convolution from
// NCHW) gets nChw16c from oneDNN for its 16 output channels, which are channels-last already.
bool SameBytes(const dnnl::memory::desc& a, const dnnl::memory::desc& b) {
  if (a == b) return true;
  if (a.get_dims() != b.get_dims() || a.get_data_type() != b.get_data_type()) return false;
  const dims sa = PlainStrides(a);
  return !sa.empty() && sa == PlainStrides(b);
}

// Default implementation. Measured on the shared 2-core AVX-512 Xeon, one thread, ms (best of
// repeated calls; plain = oneDNN on the user's formats, blocked = oneDNN's preferred formats with
// reorders inside the call):
//   W1 1x512x7x7 -> 512 3x3:   NCHW plain 4.4 (gemm:jit), blocked 5.5 (brgconv 4.7 + weight
//                               reorder 3.6); NHWC plain 13.6, blocked 13.5
//   ResNet 1x64x56x56 -> 64:    NCHW plain 4.8, blocked 3.1; NHWC plain 2.2, blocked 2.3
//   depthwise 1x96x56x56 3x3:   NCHW plain 3.8, blocked 0.9; NHWC plain 3.6, blocked 0.28
// Rule: blocked, except NCHW without groups when the weights are larger than data + output
// (there the per-call weight reorder costs more than the im2col GEMM saves).
Fmt ChooseFormat(const ConvParams& p, const ConvShape& s) {
  const int64_t wsize = s.O * s.I * s.KH * s.KW;
  const int64_t asize = s.N * (s.C * s.H * s.W + s.O * s.OH * s.OW);
  if (!p.nhwc && p.groups == 1 && wsize > asize) return Fmt::kPlain;
  return Fmt::kBlocked;
}

std::shared_ptr<OneDNNConv> CreateConv(const ConvParams& p, const ConvShape& s, Fmt fmt) {
  auto e = std::make_shared<OneDNNConv>();
  e->user_src = ActivationDesc(p.nhwc, s.N, s.C, s.H, s.W, p.src_blk);
  e->user_dst = ActivationDesc(p.nhwc, s.N, s.O, s.OH, s.OW, p.dst_blk);
  e->user_wei = WeightDesc(p, s);
  const bool blocked = fmt == Fmt::kBlocked;
  dnnl::memory::desc src_any = e->user_src, wei_any = e->user_wei, dst_any = e->user_dst;
  if (blocked) {
    src_any = dnnl::memory::desc(e->user_src.get_dims(), dt::f32, dnnl::memory::format_tag::any);
    wei_any = dnnl::memory::desc(e->user_wei.get_dims(), dt::f32, dnnl::memory::format_tag::any);
    dst_any = dnnl::memory::desc(e->user_dst.get_dims(), dt::f32, dnnl::memory::format_tag::any);
  }
  dims strides{p.sh, p.sw}, dil{p.dh - 1, p.dw - 1}, pad_l{p.pt, p.pl}, pad_r{p.pb, p.pr};
  // The residual is a sum post-op (ConvEpilogueAttr). Measured with binary_add instead:
  // 1x21x8x8 -> 21 3x3 NCHW plain fell back to ref:any, ~25 ms vs 0.07 ms.
  const dnnl::primitive_attr attr = ConvEpilogueAttr(p.has_res, p.act);
  const auto prop = dnnl::prop_kind::forward_inference;
  const auto alg = dnnl::algorithm::convolution_direct;
  dnnl::convolution_forward::primitive_desc pd;
  if (p.has_bias) {
    e->bias_md = dnnl::memory::desc(dims{s.O}, dt::f32, dims{1});
    pd = dnnl::convolution_forward::primitive_desc(Engine(), prop, alg, src_any, wei_any,
                                                   e->bias_md, dst_any, strides, dil, pad_l,
                                                   pad_r, attr);
  } else {
    pd = dnnl::convolution_forward::primitive_desc(Engine(), prop, alg, src_any, wei_any, dst_any,
                                                   strides, dil, pad_l, pad_r, attr);
  }
  e->src_md = pd.src_desc();
  e->wei_md = pd.weights_desc();
  e->dst_md = pd.dst_desc();
  e->scratch_md = pd.scratchpad_desc();
  e->wei_bytes = e->wei_md.get_size();
  e->impl = pd.impl_info_str();
  e->prim = dnnl::convolution_forward(pd);
  e->src_alias = e->src_md != e->user_src && SameBytes(e->src_md, e->user_src);
  e->dst_alias = e->dst_md != e->user_dst && SameBytes(e->dst_md, e->user_dst);
  if (!e->src_alias) e->src_in.Init(e->user_src, e->src_md);
  e->wei_in.Init(e->user_wei, e->wei_md);
  if (!e->dst_alias) e->dst_out.Init(e->dst_md, e->user_dst);
  if (p.has_res && !e->dst_alias) e->res_in.Init(e->user_dst, e->dst_md);
  return e;
}

// Packed weights (conv2d_pack_weight): a 64-byte header, then the weights in the blocked format
// of the cached primitive. The header holds a magic number, a hash of the problem, the weight
// format and the CPU ISA (the fast path: the packed weights are read as they are), the oneDNN
// format tag of the packed weights, their size in bytes and a hash of the logical weight dims.
// A call under another thread count than the pack's runs at the pack's count (Conv2d,
// weight_pack::PackThreads), except inside a stall window. Where the hash still differs (another
// CPU, another problem over the same weights, a stall window), the call reorders the packed
// weights from their tag into the format its primitive wants, every call, as it does unpacked
// weights: a module built with packed weights runs anywhere, at the unpacked speed where the
// machine differs. Without a tag (a format that no tag names) or with other logical dims it is
// rejected instead of read in the wrong layout.
// The header is weight_pack.h's, with the convolution's magic.
constexpr int64_t kPackHeaderFloats = weight_pack::kHeaderFloats;
constexpr uint64_t kPackMagic = weight_pack::kConvMagic;

// Floating-point operations of one call (multiply and add per weight tap per output element).
double ConvFlops(const ConvShape& s) {
  return 2.0 * s.N * s.O * s.OH * s.OW * s.I * s.KH * s.KW;
}

std::string ConvKey(const ConvParams& p, const ConvShape& s, Fmt fmt) {
  return std::string(kName) + "|" + p.canonical + "|fmt=" + (fmt == Fmt::kBlocked ? "b" : "p") +
         "|" + std::to_string(s.N) + "," + std::to_string(s.C) + "," + std::to_string(s.H) + "," +
         std::to_string(s.W) + "|" + std::to_string(s.O) + "," + std::to_string(s.KH) + "," +
         std::to_string(s.KW);
}

int64_t PackedFloats(const OneDNNConv& e) {
  return kPackHeaderFloats + static_cast<int64_t>((e.wei_bytes + 3) / 4);
}

// A reorder from the packed weights' tag into the primitive's weight format (cached).
struct PortableWeights {
  dnnl::memory::desc from;
  weight_pack::PackReorder reorder;
};

// The weights of a wpacked call: the packed tensor itself when it was made for this problem on
// this machine and thread count (`hash`: PackHash of the call's key and e.wei_md, computed once
// per call site; `as_is` wraps the pointer in a memory of e.wei_md); else reordered from its
// format tag, once, into the site's kept copy (`relaid`, weight_pack::RelaidPacks: another
// CPU's pack, or a pack made under another thread count read in a stall window).
dnnl::memory PackedWeights(const ffi::TensorView& Wt, float* w, const std::string& key,
                           uint64_t hash, const OneDNNConv& e,
                           const std::function<dnnl::memory(void*)>& as_is,
                           weight_pack::RelaidPacks* relaid) {
  const weight_pack::Header h = weight_pack::ReadHeader(w, Wt.numel());
  const dnnl::engine& eng = Engine();
  if (h.magic == kPackMagic && h.hash == hash) {
    if (Wt.numel() != PackedFloats(e)) {
      TVM_FFI_THROW(ValueError) << kName << ": packed weight has " << Wt.numel()
                                << " elements, expected " << PackedFloats(e)
                                << " (pack it with tvm_ollie.cpu.conv2d_pack_weight and the "
                                << "same attrs and shapes)";
    }
    return as_is(w + kPackHeaderFloats);
  }
  const int64_t want = kPackHeaderFloats + static_cast<int64_t>((h.bytes + 3) / 4);
  if (h.magic != kPackMagic || h.tag == 0 ||
      h.dims != weight_pack::DimsHash(e.wei_md.get_dims())) {
    TVM_FFI_THROW(ValueError) << kName << ": packed weight was made for other weights or in a "
                              << "format without a oneDNN tag (header mismatch); repack it "
                              << "with tvm_ollie.cpu.conv2d_pack_weight";
  }
  if (Wt.numel() != want) {
    TVM_FFI_THROW(ValueError) << kName << ": packed weight has " << Wt.numel()
                              << " elements, its header says " << want;
  }
  auto port = CachedGet<PortableWeights>(key + "|from_tag=" + std::to_string(h.tag), [&]() {
    auto r = std::make_shared<PortableWeights>();
    r->from = dnnl::memory::desc(e.wei_md.get_dims(), e.wei_md.get_data_type(),
                                 static_cast<dnnl::memory::format_tag>(h.tag));
    if (r->from.get_size() != h.bytes) {
      TVM_FFI_THROW(ValueError) << kName << ": packed weight header names " << h.bytes
                                << " bytes, its format " << r->from.get_size();
    }
    r->reorder.Init(r->from, e.wei_md);
    return r;
  });
  dnnl::memory from(port->from, eng, w + kPackHeaderFloats);
  if (!port->reorder.needed) return from;
  bool fill = false;
  void* kept = relaid->Slot(w, Wt.numel(), hash, e.wei_md.get_size(), &fill);
  if (fill) {
    weight_pack::CountReorder();
    port->reorder.Run(from, kept);
  }
  return as_is(kept);
}

// The weight dims in klayout order for a packed call: O from Out, I = C / groups, kernel=KH,KW.
std::vector<int64_t> PackedWeightDims(const ConvParams& p, const std::vector<int64_t>& x,
                                      int64_t o) {
  if (x.size() != 4) TVM_FFI_THROW(ValueError) << kName << ": data must be 4-D";
  const int64_t c = p.nhwc ? x[3] : x[1];
  if (c % p.groups != 0) {
    TVM_FFI_THROW(ValueError) << kName << ": data channels " << c << " not divisible by groups="
                              << p.groups;
  }
  const int64_t i = c / p.groups;
  if (p.klayout == "OIHW") return {o, i, p.pkh, p.pkw};
  if (p.klayout == "HWIO") return {p.pkh, p.pkw, i, o};
  return {o, p.pkh, p.pkw, i};
}

// One thread's state of the conv2d calls made with one attribute string and one set of argument
// shapes (a call site, as a Relax module makes it on every run): the problem resolved once (its
// checks, the implementation, the primitive cache's key and entry, the pack hash) and the
// dnnl::memory objects of the call, whose data handles are reset when they change. Measured on
// YOLOX's small convolutions (docs/native-library.md, "Per call"): building the cache key and
// the pack hash (strings), the cache's mutex and map, and creating ~5 dnnl::memory objects and
// the argument map at every call cost several microseconds of CPU per call, more than the
// arithmetic of a 4x4 1x1 64 -> 64 convolution.
struct ConvSite {
  ConvShape s;
  Fmt fmt = Fmt::kAuto;
  std::string key;                 // ConvKey: the primitive cache's key
  int nthr = 0;                    // the OpenMP thread count `e` was made for (0: not bound)
  int64_t best_ns = kNoBestNs;     // the fastest parallel run (stall.h)
  std::shared_ptr<OneDNNConv> e;
  uint64_t pack_hash = 0;          // weight_pack::Hash(key, e->wei_md) (wpacked calls)
  weight_pack::PackThreads pack_threads;  // packs made under another thread count (wpacked)
  dnnl::memory user_src, user_dst, user_res, src, wei, dst, bias, scratch;
  // weights by data pointer (a site's weights are constants: the same few pointers every run):
  // a memory over blocked weights is zero-padded whenever it is made or its handle changes
  std::unordered_map<const void*, dnnl::memory> weights;
  // packs re-laid for a primitive of another thread count (kept across bindings, wpacked)
  weight_pack::RelaidPacks relaid;
  std::unordered_map<int, dnnl::memory> args;  // the primitive's arguments (handles above)
  // the reorders' arguments (over the memories above; the weights' source set per call)
  std::unordered_map<int, dnnl::memory> src_in, wei_in, res_in, dst_out;
  size_t src_bytes = 0, wei_bytes = 0, dst_bytes = 0, out_bytes = 0, scratch_bytes = 0;
};

// The ParsedAttrs value of conv2d: the attributes and, per argument shapes, the call sites.
struct ConvCall {
  ConvParams p;
  std::unordered_map<ShapeKey, std::unique_ptr<ConvSite>, ShapeKeyHash> sites;
};

ConvCall ParseConvCall(const std::string& text) { return ConvCall{ParseConvAttrs(text), {}}; }

ConvCall& ParseArgsCall(ffi::PackedArgs args, const char* fname) {
  std::optional<ffi::String> holder;
  return ParsedAttrs<ConvCall>(AttrsView(args, fname, &holder), ParseConvCall);
}

const ConvParams& ParseArgsAttrs(ffi::PackedArgs args, const char* fname) {
  return ParseArgsCall(args, fname).p;
}

ffi::TensorView TensorArg(ffi::PackedArgs args, int i, const char* fname, const char* what) {
  auto t = args[i].try_cast<ffi::TensorView>();
  if (!t.has_value()) TVM_FFI_THROW(TypeError) << fname << ": " << what << " must be a tensor";
  return t.value();
}

// Zeros the padding channels [c, ceil(c/blk)*blk) of a blocked [n, ceil(c/blk), hw, blk] tensor:
// an activation epilogue maps the conv's zero there to act(0) (0.5 for a sigmoid), and the
// layout's contract is zero padding (a consumer such as a channel sum may read it).
void ZeroChannelPadding(float* out, int64_t n, int64_t c, int64_t hw, int64_t blk) {
  const int64_t rem = c % blk, cb = (c + blk - 1) / blk;
  if (rem == 0) return;
  for (int64_t b = 0; b < n; ++b) {
    float* last = out + ((b * cb + cb - 1) * hw) * blk;
    for (int64_t i = 0; i < hw; ++i) {
      std::memset(last + i * blk + rem, 0, sizeof(float) * (blk - rem));
    }
  }
}

// The tensors of a conv2d call after the per-call checks (dtype, device, contiguity, rank).
struct ConvTensors {
  ffi::TensorView X, Wt, Out;
  std::optional<ffi::TensorView> Bias, Res;
  float *x = nullptr, *w = nullptr, *bias = nullptr, *res = nullptr, *out = nullptr;
};

ConvTensors CheckConvTensors(const ConvParams& p, ffi::PackedArgs args) {
  const int want = 4 + (p.has_bias ? 1 : 0) + (p.has_res ? 1 : 0);
  if (args.size() != want) {
    TVM_FFI_THROW(TypeError) << kName << ": expected " << want << " arguments (attrs, data, weight"
                             << (p.has_bias ? ", bias" : "") << (p.has_res ? ", residual" : "")
                             << ", Out) for attrs \"" << p.canonical << "\", got "
                             << args.size();
  }
  int i = 1;
  ConvTensors t{TensorArg(args, i, kName, "data"), TensorArg(args, i + 1, kName, "weight"),
                TensorArg(args, args.size() - 1, kName, "Out")};
  i += 2;
  t.x = CheckFloatTensor(t.X, kName, "data", 4);
  t.w = CheckFloatTensor(t.Wt, kName, "weight", p.wpacked ? 1 : 4);
  if (p.has_bias) {
    t.Bias = TensorArg(args, i++, kName, "bias");
    t.bias = CheckFloatTensor(*t.Bias, kName, "bias", 1);
  }
  if (p.has_res) {
    t.Res = TensorArg(args, i++, kName, "residual");
    t.res = CheckFloatTensor(*t.Res, kName, "residual", 0);
  }
  t.out = CheckFloatTensor(t.Out, kName, "Out", 4);
  return t;
}

// The problem of a call from its shapes (every shape check), or nullopt when Out is empty.
std::optional<ConvSite> ResolveSite(const ConvParams& p, const ConvTensors& t) {
  const std::vector<int64_t> out_dims = LogicalDims(Dims(t.Out), p.dst_blk, p.dst_c, "Out");
  const std::vector<int64_t> x_dims = LogicalDims(Dims(t.X), p.src_blk, p.src_c, "data");
  const int64_t o = p.nhwc ? out_dims[3] : out_dims[1];
  const std::vector<int64_t> w_dims = p.wpacked ? PackedWeightDims(p, x_dims, o) : Dims(t.Wt);
  if (p.wpacked && t.Wt.ndim() != 1) {
    TVM_FFI_THROW(ValueError) << kName << ": with wpacked=1 the weight must be the 1-D output of "
                              << "tvm_ollie.cpu.conv2d_pack_weight, got " << ShapeStr(t.Wt);
  }
  ConvSite site;
  site.s = CheckConvShapes(p, x_dims, w_dims, &out_dims);
  if (t.Bias.has_value() && (t.Bias->ndim() != 1 || t.Bias->shape()[0] != site.s.O)) {
    TVM_FFI_THROW(ValueError) << kName << ": bias has shape " << ShapeStr(*t.Bias)
                              << ", expected [" << site.s.O << "]";
  }
  if (t.Res.has_value() && Dims(*t.Res) != Dims(t.Out)) {
    TVM_FFI_THROW(ValueError) << kName << ": residual has shape " << ShapeStr(*t.Res)
                              << ", expected Out's shape " << ShapeStr(t.Out);
  }
  if (t.Out.numel() == 0) return std::nullopt;
  if (t.X.numel() == 0) {
    TVM_FFI_THROW(ValueError) << kName << ": data " << ShapeStr(t.X) << " is empty";
  }
  site.fmt = p.wpacked || p.src_blk || p.dst_blk
                 ? Fmt::kBlocked
                 : (p.fmt == Fmt::kAuto ? ChooseFormat(p, site.s) : p.fmt);
  site.key = ConvKey(p, site.s, site.fmt);
  return site;
}

// The site's primitive for the OpenMP thread count in effect (the cache keys by it), and fresh
// memory objects for its descriptors (no buffer until a call sets the handles).
void BindSite(const ConvParams& p, ConvSite* site, int nthr) {
  site->e = CachedGet<OneDNNConv>(site->key, [&]() { return CreateConv(p, site->s, site->fmt); });
  site->nthr = nthr;
  const OneDNNConv& e = *site->e;
  site->pack_hash = p.wpacked ? weight_pack::Hash(site->key, e.wei_md) : 0;
  const dnnl::engine& eng = Engine();
  site->user_src = dnnl::memory(e.user_src, eng, DNNL_MEMORY_NONE);
  site->user_dst = dnnl::memory(e.user_dst, eng, DNNL_MEMORY_NONE);
  site->user_res = dnnl::memory(e.user_dst, eng, DNNL_MEMORY_NONE);
  const bool own_src = e.src_in.needed || e.src_alias, own_dst = e.dst_out.needed || e.dst_alias;
  site->src = own_src ? dnnl::memory(e.src_md, eng, DNNL_MEMORY_NONE) : site->user_src;
  site->dst = own_dst ? dnnl::memory(e.dst_md, eng, DNNL_MEMORY_NONE) : site->user_dst;
  site->wei = dnnl::memory(e.wei_md, eng, DNNL_MEMORY_NONE);
  site->bias = p.has_bias ? dnnl::memory(e.bias_md, eng, DNNL_MEMORY_NONE) : dnnl::memory();
  const bool scratch = e.scratch_md.get_size() > 0;
  site->scratch = scratch ? dnnl::memory(e.scratch_md, eng, DNNL_MEMORY_NONE) : dnnl::memory();
  site->weights.clear();
  site->args = {{DNNL_ARG_SRC, site->src}, {DNNL_ARG_DST, site->dst}};
  if (p.has_bias) site->args[DNNL_ARG_BIAS] = site->bias;
  if (scratch) site->args[DNNL_ARG_SCRATCHPAD] = site->scratch;
  site->src_in = e.src_in.KeptArgs(site->user_src, site->src);
  site->wei_in = e.wei_in.KeptArgs(site->wei, site->wei);  // FROM: the call's weights
  site->res_in = e.res_in.KeptArgs(site->user_res, site->dst);
  site->dst_out = e.dst_out.KeptArgs(site->dst, site->user_dst);
  site->src_bytes = e.src_md.get_size();
  site->wei_bytes = e.wei_md.get_size();
  site->dst_bytes = e.dst_md.get_size();
  site->out_bytes = e.user_dst.get_size();
  site->scratch_bytes = e.scratch_md.get_size();
}

// The memory over weights at `data` in the site's format `md`, kept per pointer (bounded).
dnnl::memory SiteWeights(ConvSite* site, const dnnl::memory::desc& md, void* data) {
  constexpr size_t kMaxWeights = 256;
  auto it = site->weights.find(data);
  if (it != site->weights.end()) return it->second;
  if (site->weights.size() >= kMaxWeights) site->weights.clear();
  return site->weights.emplace(data, dnnl::memory(md, Engine(), data)).first->second;
}

// One call on a bound site: reorders into the primitive's formats where they differ, the
// residual into dst (sum post-op), the convolution, the reorder out, the padding channels.
void RunSite(const ConvParams& p, ConvSite* site, const ConvTensors& t) {
  const OneDNNConv& e = *site->e;
  // Scratch slots: 0 conv scratchpad, 1 src, 2 weights, 3 dst, 4 residual, 5 reorder scratch
  // (7: a pack reordered through the plain format, weight_pack.h).
  Point(site->user_src, t.x);
  Point(site->user_dst, t.out);
  if (e.src_alias) Point(site->src, t.x);
  if (e.dst_alias) Point(site->dst, t.out);
  if (e.src_in.needed) {
    Point(site->src, ScratchBuffer(1, site->src_bytes));
    e.src_in.RunKept(site->src_in, 5);
  }
  dnnl::memory wei;
  if (p.wpacked) {
    wei = PackedWeights(t.Wt, t.w, site->key, site->pack_hash, e,
                        [&](void* data) { return SiteWeights(site, e.wei_md, data); },
                        &site->relaid);
  } else {
    wei = SiteWeights(site, e.user_wei, t.w);
    if (e.wei_in.needed) {
      Point(site->wei, ScratchBuffer(2, site->wei_bytes));
      site->wei_in[DNNL_ARG_FROM] = wei;
      e.wei_in.RunKept(site->wei_in, 5);
      wei = site->wei;
    }
  }
  site->args[DNNL_ARG_WEIGHTS] = wei;
  if (e.dst_out.needed) Point(site->dst, ScratchBuffer(3, site->dst_bytes));
  if (p.has_bias) Point(site->bias, t.bias);
  if (p.has_res) {  // the sum post-op adds what dst holds: the residual
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
  Stream().wait();
  if (p.dst_blk > 0) ZeroChannelPadding(t.out, site->s.N, site->s.O, site->s.OH * site->s.OW,
                                        p.dst_blk);
}

void Conv2d(ffi::PackedArgs args, ffi::Any* rv) {
  constexpr size_t kMaxSites = 256;  // per attribute string and thread
  ThreadScope threads;
  ConvCall& call = ParseArgsCall(args, kName);
  const ConvParams& p = call.p;
  const ConvTensors t = CheckConvTensors(p, args);
  ShapeKey key;
  bool keyed = key.Add(t.X) && key.Add(t.Wt) && (!t.Bias || key.Add(*t.Bias)) &&
               (!t.Res || key.Add(*t.Res)) && key.Add(t.Out);
  auto it = keyed ? call.sites.find(key) : call.sites.end();
  ConvSite* site;
  std::optional<ConvSite> unkept;
  if (it != call.sites.end()) {
    site = it->second.get();
  } else {
    std::optional<ConvSite> resolved = ResolveSite(p, t);
    if (!resolved.has_value()) return;  // empty Out
    if (keyed) {
      if (call.sites.size() >= kMaxSites) call.sites.clear();
      site = call.sites.emplace(key, std::make_unique<ConvSite>(std::move(*resolved)))
                 .first->second.get();
    } else {
      unkept = std::move(resolved);
      site = &*unkept;
    }
  }
  threads.SerialBelow(ConvFlops(site->s), &site->best_ns);
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
    const int n = site->pack_threads.Note(weight_pack::ReadHeader(t.w, t.Wt.numel()), kPackMagic,
                                          site->pack_hash, nthr);
    if (n > 0) {
      threads.Fix(n);
      BindSite(p, site, n);
    }
  }
  RunSite(p, site, t);
}

constexpr const char* kPackName = "tvm_ollie.cpu.conv2d_pack_weight";
constexpr const char* kPackSizeName = "tvm_ollie.cpu.conv2d_packed_size";

// The packed problem for (attrs, data dims, weight dims in klayout): the cached blocked conv.
std::shared_ptr<OneDNNConv> PackedEntry(const char* fname, const ConvParams& p,
                                        const std::vector<int64_t>& x,
                                        const std::vector<int64_t>& w, std::string* key,
                                        ThreadScope* threads) {
  if (p.wpacked || p.fmt == Fmt::kPlain) {
    TVM_FFI_THROW(ValueError) << fname << ": give the conv2d attrs without wpacked/fmt=plain";
  }
  ConvShape s = CheckConvShapes(p, x, w, nullptr);
  // The entry that conv2d will run with this weight: the threshold's count, not a passing stall
  // window's (a pack outlives the window, and the size and the pack must agree).
  threads->SerialBelowThreshold(ConvFlops(s));
  *key = ConvKey(p, s, Fmt::kBlocked);
  return CachedGet<OneDNNConv>(*key, [&]() { return CreateConv(p, s, Fmt::kBlocked); });
}

// conv2d_packed_size(attrs, data_shape, weight_shape) -> number of float32 elements.
int64_t PackedSize(const std::string& attrs, const ffi::Array<int64_t>& x,
                   const ffi::Array<int64_t>& w) {
  ThreadScope threads;
  ConvParams p = ParseConvAttrs(attrs);
  std::string key;
  auto e = PackedEntry(kPackSizeName, p, std::vector<int64_t>(x.begin(), x.end()),
                       std::vector<int64_t>(w.begin(), w.end()), &key, &threads);
  return PackedFloats(*e);
}

// conv2d_pack_weight(attrs, data, weight, Packed): data only gives its shape.
void PackWeight(ffi::PackedArgs args, ffi::Any* rv) {
  ThreadScope threads;
  const ConvParams& p = ParseArgsAttrs(args, kPackName);
  if (args.size() != 4) {
    TVM_FFI_THROW(TypeError) << kPackName << ": expected 4 arguments (attrs, data, weight, "
                             << "Packed), got " << args.size();
  }
  ffi::TensorView X = TensorArg(args, 1, kPackName, "data");
  ffi::TensorView Wt = TensorArg(args, 2, kPackName, "weight");
  ffi::TensorView P = TensorArg(args, 3, kPackName, "Packed");
  CheckFloatTensor(X, kPackName, "data", 4);
  float* w = CheckFloatTensor(Wt, kPackName, "weight", 4);
  float* packed = CheckFloatTensor(P, kPackName, "Packed", 1);
  std::string key;
  auto e = PackedEntry(kPackName, p, LogicalDims(Dims(X), p.src_blk, p.src_c, "data"), Dims(Wt),
                       &key, &threads);
  if (P.ndim() != 1 || P.numel() != PackedFloats(*e)) {
    TVM_FFI_THROW(ValueError) << kPackName << ": Packed has shape " << ShapeStr(P)
                              << ", expected [" << PackedFloats(*e)
                              << "] (tvm_ollie.cpu.conv2d_packed_size)";
  }
  weight_pack::WriteHeader(weight_pack::MakeHeader(key, e->wei_md, kPackMagic), packed);
  dnnl::memory user_wei(e->user_wei, Engine(), w);
  dnnl::memory dst(e->wei_md, Engine(), packed + kPackHeaderFloats);
  if (e->wei_in.needed) {
    e->wei_in.Run(user_wei, dst, 5);
    Stream().wait();
  } else {
    std::memcpy(packed + kPackHeaderFloats, w, e->wei_md.get_size());
  }
}

constexpr const char* kBlockName = "tvm_ollie.cpu.conv2d_preferred_format";

// The activation format of a memory descriptor as a src_fmt/dst_fmt value ("nchw", "nhwc",
// "nChw{B}c": blocked on channels only, B innermost, outer dims in n, C/B, h, w order), or
// "other".
std::string FormatOf(const dnnl::memory::desc& md) {
  const dims d = md.get_dims(), st = md.get_strides();
  const dims blks = md.get_inner_blks(), idxs = md.get_inner_idxs();
  if (d.size() != 4 || st.size() != 4) return "other";
  if (blks.empty()) {
    if (st[3] == 1 && st[2] == d[3] && st[1] == d[2] * d[3]) return "nchw";
    if (st[1] == 1 && st[3] == d[1] && st[2] == d[3] * d[1]) return "nhwc";
    return "other";
  }
  if (blks.size() != 1 || idxs[0] != 1) return "other";
  const int64_t b = blks[0];
  const bool nchwc = st[3] == b && st[2] == d[3] * b && st[1] == d[2] * d[3] * b;
  return nchwc && (b == 4 || b == 8 || b == 16) ? BlockFormat(b) : "other";
}

// conv2d_preferred_format(attrs, data_shape, weight_shape) -> [src format, dst format]; the
// attrs of the call itself (src_fmt/dst_fmt ignored: the answer is for format_tag::any).
ffi::Array<ffi::String> PreferredFormat(const std::string& attrs, const ffi::Array<int64_t>& x,
                                        const ffi::Array<int64_t>& w) {
  ThreadScope threads;
  ConvParams p = ParseConvAttrs(attrs);
  if (p.wpacked) TVM_FFI_THROW(ValueError) << kBlockName << ": give the attrs without wpacked";
  if (p.nhwc) TVM_FFI_THROW(ValueError) << kBlockName << ": give the attrs with layout=NCHW";
  p.src_blk = p.src_c = p.dst_blk = p.dst_c = 0;
  ConvShape s = CheckConvShapes(p, std::vector<int64_t>(x.begin(), x.end()),
                                std::vector<int64_t>(w.begin(), w.end()), nullptr);
  threads.SerialBelow(ConvFlops(s));  // the thread count the call itself will run with
  auto e = CachedGet<OneDNNConv>(ConvKey(p, s, Fmt::kBlocked) + "|query",
                                 [&]() { return CreateConv(p, s, Fmt::kBlocked); });
  return {ffi::String(FormatOf(e->src_md)), ffi::String(FormatOf(e->dst_md))};
}

}  // namespace

std::string Conv2dInfo() {
  return "conv2d default: oneDNN on its blocked formats with reorders inside the call, except "
         "NCHW without groups with weights larger than data + output: oneDNN on plain formats";
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def_packed(kName, Conv2d)
      .def_packed(kPackName, PackWeight)
      .def(kPackSizeName, PackedSize)
      .def(kBlockName, PreferredFormat);
}

}  // namespace tvm_ollie
