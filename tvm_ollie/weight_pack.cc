// Headers of packed weights (weight_pack.h).
#include "weight_pack.h"

#include <omp.h>

#include <atomic>
#include <cstring>
#include <string>

namespace tvm_ollie {
namespace weight_pack {

namespace {

std::atomic<int64_t> g_reorders{0};

uint64_t Fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

void AddDims(std::string* text, const char* what, const dnnl::memory::dims& d) {
  *text += std::string("|") + what;
  for (int64_t v : d) *text += "," + std::to_string(v);
}

}  // namespace

uint64_t Hash(const std::string& key, const dnnl::memory::desc& md) {
  const int isa = static_cast<int>(dnnl::get_effective_cpu_isa());
  std::string text = key + "|isa=" + std::to_string(isa);
  AddDims(&text, "dims", md.get_dims());
  AddDims(&text, "strides", md.get_strides());
  AddDims(&text, "blks", md.get_inner_blks());
  AddDims(&text, "idxs", md.get_inner_idxs());
  text += "|size=" + std::to_string(md.get_size());
  return Fnv1a(text);
}

uint64_t DimsHash(const dnnl::memory::dims& dims) {
  std::string text = "dims";
  for (int64_t v : dims) text += "," + std::to_string(v);
  return Fnv1a(text);
}

uint64_t TagOf(const dnnl::memory::desc& md) {
  for (int t = dnnl_format_tag_any + 1; t < dnnl_format_tag_last; ++t) {
    try {
      dnnl::memory::desc cand(md.get_dims(), md.get_data_type(),
                              static_cast<dnnl::memory::format_tag>(t));
      if (cand == md) return static_cast<uint64_t>(t);
    } catch (const dnnl::error&) {
      continue;  // a tag of another rank
    }
  }
  return 0;
}

Header MakeHeader(const std::string& key, const dnnl::memory::desc& md, uint64_t magic) {
  return Header{magic, Hash(key, md), TagOf(md), md.get_size(), DimsHash(md.get_dims()),
                static_cast<uint64_t>(omp_get_max_threads())};
}

Header ReadHeader(const float* data, int64_t numel) {
  Header h;
  if (numel < kHeaderFloats) return h;
  uint64_t v[6];
  std::memcpy(v, data, sizeof(v));
  return Header{v[0], v[1], v[2], v[3], v[4], v[5]};
}

void WriteHeader(const Header& h, float* data) {
  std::memset(data, 0, kHeaderFloats * sizeof(float));
  const uint64_t v[6] = {h.magic, h.hash, h.tag, h.bytes, h.dims, h.threads};
  std::memcpy(data, v, sizeof(v));
}

int64_t PackedFloats(uint64_t bytes) {
  return kHeaderFloats + static_cast<int64_t>((bytes + 3) / 4);
}

void PackReorder::Init(const dnnl::memory::desc& from, const dnnl::memory::desc& target) {
  to = target;
  needed = from != target;
  if (!needed) return;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::reorder::primitive_desc pd(Engine(), from, Engine(), target, attr);
  via_plain = std::string(pd.impl_info_str()).rfind("simple", 0) == 0;
  if (!via_plain) {
    direct.Init(from, target);
    return;
  }
  const dnnl::memory::dims dims = target.get_dims();
  dnnl::memory::dims strides(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * dims[i + 1];
  }
  plain = dnnl::memory::desc(dims, target.get_data_type(), strides);
  to_plain.Init(from, plain);
  from_plain.Init(plain, target);
}

dnnl::memory PackReorder::Run(const dnnl::memory& from, void* dst) const {
  dnnl::memory out(to, Engine(), dst);
  if (!via_plain) {
    direct.Run(from, out, 5);
  } else {
    dnnl::memory mid(plain, Engine(), ScratchBuffer(7, plain.get_size()));
    to_plain.Run(from, mid, 5);
    from_plain.Run(mid, out, 5);
  }
  Stream().wait();
  return out;
}

void CountReorder() { g_reorders.fetch_add(1, std::memory_order_relaxed); }

int64_t Reorders() { return g_reorders.load(std::memory_order_relaxed); }

RelaidPacks::Print RelaidPacks::Fingerprint(const float* pack, int64_t numel) {
  Print p{};
  std::memcpy(p.data(), pack, sizeof(uint32_t) * kHeaderFloats);
  const int64_t body = numel - kHeaderFloats;
  for (int i = 0; i < kSample && body > 0; ++i) {
    const int64_t at = kHeaderFloats + (body - 1) * i / (kSample - 1);
    std::memcpy(&p[kHeaderFloats + i], pack + at, sizeof(uint32_t));
  }
  return p;
}

void* RelaidPacks::Slot(const float* pack, int64_t numel, uint64_t variant, size_t bytes,
                        bool* fill) {
  const Print print = Fingerprint(pack, numel);
  const Key key{pack, variant};
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.numel == numel && it->second.bytes == bytes) {
    *fill = it->second.print != print;
    it->second.print = print;
    return it->second.data.get();
  }
  if (it == entries_.end() && entries_.size() >= kMaxEntries) entries_.clear();
  Entry& e = entries_[key];
  const size_t padded = (bytes + 63) / 64 * 64;
  e.data.reset(std::aligned_alloc(64, padded > 0 ? padded : 64));
  if (!e.data) throw std::bad_alloc();
  e.print = print;
  e.numel = numel;
  e.bytes = bytes;
  *fill = true;
  return e.data.get();
}

int PackThreads::Note(const Header& h, uint64_t magic, uint64_t hash, int nthr) {
  if (h.magic != magic || h.hash == hash || h.threads == 0 ||
      h.threads == static_cast<uint64_t>(nthr)) {
    return 0;
  }
  mismatch_nthr = nthr;
  pack_nthr = static_cast<int>(h.threads);
  return pack_nthr;
}

}  // namespace weight_pack
}  // namespace tvm_ollie
