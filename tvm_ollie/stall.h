// The stall fallback: parallel kernel calls that wait for a descheduled worker send the calls
// that follow to the calling thread for a while (docs/threads.md, "Stalled workers").
#ifndef TVM_OLLIE_STALL_H_
#define TVM_OLLIE_STALL_H_

#include <cstdint>
#include <limits>

namespace tvm_ollie {

// No fastest time known yet (a site's `best_ns` before its first parallel run).
constexpr int64_t kNoBestNs = std::numeric_limits<int64_t>::max();

// Monotonic clock, nanoseconds.
int64_t NowNs();

// Whether a parallel call of `elapsed_ns` stalled, given the fastest parallel run of the same
// call site, `best_ns`: more than kStallFactor times it and more than kStallExtraNs above it.
bool IsStall(int64_t elapsed_ns, int64_t best_ns);

// True while a recent stall holds parallel calls on the calling thread (counts the call).
bool SerialForStall(int64_t now_ns);

// IsStall, or, for a call of `flops` > 0 floating-point operations, slower than a rate no
// core runs them at (stall.cc): a stall even when the site's fastest run is one.
bool IsStallForWork(int64_t elapsed_ns, int64_t best_ns, double flops);

// After a parallel call: a stall (IsStallForWork; `flops` 0: work unknown) opens (or lengthens)
// the serial window; a clean run lowers the site's fastest time and shortens the next window.
// `best_ns` may be null (no site).
void NoteParallelRun(int64_t elapsed_ns, int64_t* best_ns, double flops = 0);

}  // namespace tvm_ollie

#endif  // TVM_OLLIE_STALL_H_
