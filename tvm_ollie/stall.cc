// tvm_ollie.cpu.stall_stats / set_stall_fallback / hold_serial / is_stall /
// is_stall_for_work: the fallback of
// parallel calls to the calling thread after a stalled one.
//
// Why: a parallel region (a oneDNN call above the serial threshold, a TVM kernel on OpenMP)
// splits its work statically over the team, and the calling thread waits at the region's end
// for every worker. When the cores are busy with other processes, a worker is often not on a
// core when the region starts, and the caller waits for the scheduler to run it: a slice of
// milliseconds for a call of microseconds. ResNet-18 quick took 7-170 ms per call that way on
// the 2-core machine at load 7, against 0.7 ms with every call serial (docs/threads.md). A
// call that takes far longer than its call site's fastest parallel run is such a stall; after
// one, parallel calls run on the calling thread for a window that doubles while stalls go on
// (2 ms to 1 s) and shrinks while parallel runs are clean. On cores that are the program's
// own no call stalls and nothing changes. TVM_OLLIE_STALL_FALLBACK=0 turns it off.
#include "stall.h"

#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>

#include "common.h"

namespace tvm_ollie {
namespace {

constexpr int64_t kStallFactor = 4;
constexpr int64_t kStallExtraNs = 500000;       // 0.5 ms: above a page fault or an interrupt
constexpr int64_t kMinWindowNs = 2000000;       // 2 ms
constexpr int64_t kMaxWindowNs = 1000000000;    // 1 s: one probe per second on a busy machine
// A call of known work slower than 0.5 GFLOP/s (plus kStallExtraNs) stalled, whatever its site's
// fastest run: that rate is far below one core of any machine this runs on (a 2-core Xeon here
// runs these convolutions at 10-60 GFLOP/s per core). Without it a site whose first parallel
// runs all stalled (every run, at load 7-9 on 2 cores) takes a stall as its fastest run and
// never falls back: FSRCNN quick's calls took 8-20 ms against 0.1 ms serial (docs/profiling.md).
constexpr double kSlowestNsPerFlop = 2.0;

std::atomic<int64_t> g_until_ns{0};    // parallel calls are serial until then
std::atomic<int64_t> g_window_ns{0};   // the last window's length
std::atomic<int64_t> g_stalls{0};
std::atomic<int64_t> g_serial_calls{0};
std::atomic<int> g_enabled{-1};        // -1: not read from the environment yet

bool Enabled() {
  int v = g_enabled.load(std::memory_order_relaxed);
  if (v >= 0) return v != 0;
  const char* env = std::getenv("TVM_OLLIE_STALL_FALLBACK");
  v = (env != nullptr && std::string(env) == "0") ? 0 : 1;
  int unset = -1;
  g_enabled.compare_exchange_strong(unset, v);  // a concurrent setter wins
  return g_enabled.load() != 0;
}

void OpenWindow(int64_t window_ns) {
  g_window_ns.store(window_ns, std::memory_order_relaxed);
  g_until_ns.store(NowNs() + window_ns, std::memory_order_relaxed);
}

}  // namespace

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool IsStall(int64_t elapsed_ns, int64_t best_ns) {
  if (best_ns <= 0 || best_ns == kNoBestNs) return false;
  return elapsed_ns / kStallFactor > best_ns && elapsed_ns - best_ns > kStallExtraNs;
}

bool IsStallForWork(int64_t elapsed_ns, int64_t best_ns, double flops) {
  if (IsStall(elapsed_ns, best_ns)) return true;
  if (flops <= 0) return false;
  return static_cast<double>(elapsed_ns - kStallExtraNs) > flops * kSlowestNsPerFlop;
}

bool SerialForStall(int64_t now_ns) {
  if (now_ns >= g_until_ns.load(std::memory_order_relaxed) || !Enabled()) return false;
  g_serial_calls.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void NoteParallelRun(int64_t elapsed_ns, int64_t* best_ns, double flops) {
  if (best_ns == nullptr) return;
  if (IsStallForWork(elapsed_ns, *best_ns, flops)) {
    g_stalls.fetch_add(1, std::memory_order_relaxed);
    if (Enabled()) {
      const int64_t last = g_window_ns.load(std::memory_order_relaxed);
      OpenWindow(std::clamp<int64_t>(2 * last, kMinWindowNs, kMaxWindowNs));
    }
    return;
  }
  *best_ns = std::min(*best_ns, elapsed_ns);
  const int64_t last = g_window_ns.load(std::memory_order_relaxed);
  if (last > 0) g_window_ns.store(last < kMinWindowNs ? 0 : last - last / 16,
                                  std::memory_order_relaxed);
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def("tvm_ollie.cpu.stall_stats", []() -> std::string {
        const int64_t left = g_until_ns.load() - NowNs();
        return "stalls=" + std::to_string(g_stalls.load()) +
               ";serial_calls=" + std::to_string(g_serial_calls.load()) +
               ";window_us=" + std::to_string(g_window_ns.load() / 1000) +
               ";left_us=" + std::to_string(std::max<int64_t>(left, 0) / 1000) +
               ";enabled=" + std::to_string(Enabled() ? 1 : 0);
      })
      .def("tvm_ollie.cpu.set_stall_fallback",
           [](bool on) {
             g_enabled.store(on ? 1 : 0);
             if (!on) g_until_ns.store(0);
           })
      .def("tvm_ollie.cpu.hold_serial",
           [](int64_t us) {
             if (us < 0) TVM_FFI_THROW(ValueError) << "hold_serial: expected us >= 0, got " << us;
             OpenWindow(us * 1000);
           })
      .def("tvm_ollie.cpu.is_stall", [](int64_t elapsed_ns, int64_t best_ns) -> bool {
        return IsStall(elapsed_ns, best_ns);
      })
      .def("tvm_ollie.cpu.is_stall_for_work",
           [](int64_t elapsed_ns, int64_t best_ns, double flops) -> bool {
             return IsStallForWork(elapsed_ns, best_ns, flops);
           });
}

}  // namespace tvm_ollie
