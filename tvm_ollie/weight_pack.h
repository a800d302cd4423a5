// Weights packed once into a oneDNN primitive's own format, with a header that says for which
// problem, format and machine they were made (the float matmul's packed B, the float
// convolution's packed weights). A call reads a pack
// as it is when the header's hash is its own primitive's; otherwise it reorders the pack from
// the oneDNN format tag in the header, every call, so a module built with packed weights still
// runs on another CPU (at the unpacked speed there). Under another thread count the call runs
// at the pack's own count instead (PackThreads): oneDNN picks a weight format per thread count
// (e.g. Acdb16a at two threads, Acdb24a at one for a 64-channel 3x3 conv on AVX2), and the
// reorder between them took 3.3 ms per call, 100x the convolution (docs/threads.md).
#ifndef TVM_OLLIE_WEIGHT_PACK_H_
#define TVM_OLLIE_WEIGHT_PACK_H_

#include <array>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <unordered_map>

#include "common.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace tvm_ollie {
namespace weight_pack {

// The header: 64 bytes (16 float32 elements) before the packed weights. Each kernel family
// has its own magic (a matmul's pack is not a convolution's).
constexpr int64_t kHeaderFloats = 16;
constexpr uint64_t kMagic = 0x324b5045494c4c4fULL;      // "OLLIEPK2": the float matmul's
constexpr uint64_t kConvMagic = 0x314b5045494c4c4fULL;  // "OLLIEPK1": the float conv2d's

struct Header {
  uint64_t magic = 0, hash = 0, tag = 0, bytes = 0, dims = 0;
  uint64_t threads = 0;  // the OpenMP thread count the pack was made under (0: older packs)
};

// A hash of a primitive's cache key, its weight descriptor (dims, strides, blocks) and the
// CPU ISA: equal hashes mean the pack is the primitive's weight memory as it is.
uint64_t Hash(const std::string& key, const dnnl::memory::desc& md);
// A hash of the logical weight dims (the header's check that the pack holds these weights).
uint64_t DimsHash(const dnnl::memory::dims& dims);
// The format tag whose descriptor equals md (md's dims and data type), 0 when no tag does.
uint64_t TagOf(const dnnl::memory::desc& md);
// The header of the packed weights of primitive key `key` in format md, made under the calling
// thread's OpenMP count.
Header MakeHeader(const std::string& key, const dnnl::memory::desc& md, uint64_t magic = kMagic);
// The header at the start of a pack of `numel` float32 elements (zeros when it is shorter).
Header ReadHeader(const float* data, int64_t numel);
void WriteHeader(const Header& h, float* data);
// Float32 elements of a pack whose weights take `bytes` bytes.
int64_t PackedFloats(uint64_t bytes);

// A reorder from a pack's format (its header's tag) into a primitive's weight format. oneDNN has
// no JIT reorder between some pairs of blocked formats: Acdb16a to Acdb24a (a 64x64x3x3 weight,
// the one- and two-thread formats of one conv on AVX2) runs its reference `simple:any` reorder,
// 3.3 ms, where each format to or from the plain one takes 0.03 ms (jit:uni). Such pairs go
// through the plain format (dense in the weight's logical dims) in scratch slot 7.
struct PackReorder {
  bool needed = false;
  bool via_plain = false;
  dnnl::memory::desc to, plain;
  Reorder direct, to_plain, from_plain;

  void Init(const dnnl::memory::desc& from, const dnnl::memory::desc& to);
  // Reorders `from` into a memory of the target format over `dst` (scratch slot 5 for the
  // reorders' own scratchpads); waits for the stream.
  dnnl::memory Run(const dnnl::memory& from, void* dst) const;
};

// Packs reordered into a call's primitive's format (another CPU, or a pack made under another
// thread count inside a stall window): the cache_stats counter `pack_reorders`. Since
// RelaidPacks, once per call site, target format and pack, not per call.
void CountReorder();
int64_t Reorders();

// Which call sites' packs were made under another thread count: a call at `nthr` threads whose
// primitive's hash is not its pack's remembers the pack's count (Note), and the next calls at
// `nthr` run at that count from the start (Threads) instead of binding twice per call.
struct PackThreads {
  int mismatch_nthr = 0;  // the count whose primitive did not fit the pack (0: none seen)
  int pack_nthr = 0;      // the pack's count

  // The count to run a call resolved at `nthr` threads with (nthr itself unless Note saw it).
  int Threads(int nthr) const { return nthr == mismatch_nthr ? pack_nthr : nthr; }
  // After binding at `nthr`: the count the call must run at instead to read the pack `h` as it
  // is (0: none: the pack fits, was made under `nthr`, or its count is unknown), remembered.
  int Note(const Header& h, uint64_t magic, uint64_t hash, int nthr);
};

// Packs re-laid out once into the format of a primitive that does not read them as they are, and
// kept. A call site in a stall window runs on one thread, and oneDNN's one-thread primitive may
// want another weight format than the pack's (Acdb24a against a two-thread pack's Acdb16a, a
// 64-channel 3x3 conv on AVX2): reordering the pack on every such call (two jit:uni reorders
// through the plain format, PackReorder) tripled the convolution's time, 45 us against 15 us
// (docs/profiling.md, session ort13). A site's packs are constants made by the build, so each is
// re-laid once per target format and read from the copy after. The copy is kept per pack
// address while the pack there is unchanged: its header and a sample of its floats are compared
// on every use, and a changed pack is re-laid again. One object per call site and thread (the
// sites are per thread), so no lock.
class RelaidPacks {
 public:
  // Aligned storage of `bytes` bytes for the pack at `pack` (`numel` float32 elements, header
  // first) re-laid into the format `variant` names (a Hash of the target primitive); `*fill` is
  // true when the caller must (re)write it: a new entry, or the pack there changed.
  void* Slot(const float* pack, int64_t numel, uint64_t variant, size_t bytes, bool* fill);

 private:
  static constexpr int kSample = 48;  // sampled floats besides the header
  static constexpr size_t kMaxEntries = 16;
  using Print = std::array<uint32_t, kHeaderFloats + kSample>;
  struct Key {
    const void* pack;
    uint64_t variant;
    bool operator==(const Key& o) const { return pack == o.pack && variant == o.variant; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<const void*>()(k.pack) ^ (k.variant * 0x9e3779b97f4a7c15ULL);
    }
  };
  struct Entry {
    Print print;
    int64_t numel = 0;
    size_t bytes = 0;
    std::unique_ptr<void, decltype(&std::free)> data{nullptr, &std::free};
  };
  static Print Fingerprint(const float* pack, int64_t numel);
  std::unordered_map<Key, Entry, KeyHash> entries_;
};

}  // namespace weight_pack
}  // namespace tvm_ollie

#endif  // TVM_OLLIE_WEIGHT_PACK_H_
