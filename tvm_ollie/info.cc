// tvm_ollie.cpu.info / set_num_threads / get_num_threads / set_serial_flops /
// get_serial_flops / cache_stats.
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <cstdlib>
#include <sstream>
#include <string>

#include "common.h"
#include "kernels.h"
#include "weight_pack.h"

namespace tvm_ollie {
namespace {

std::string Info() {
  InitThreadsOnce();
  const dnnl_version_t* v = dnnl_version();
  std::ostringstream os;
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  os << "tvm-ollie native library\n"
     << "onednn: " << v->major << "." << v->minor << "." << v->patch << " (" << v->hash
     << ", cpu runtime " << (v->cpu_runtime == DNNL_RUNTIME_OMP ? "omp" : "other") << ")\n"
     << "openblas: " << BlasConfig() << "\n"
     << "threads: " << GetNumThreads() << " (OMP_WAIT_POLICY=" << (wait ? wait : "unset")
     << "), single-threaded below " << SerialFlops() << " flops per call\n"
     << MatmulInfo() << "\n"
     << Conv2dInfo() << "\n"
     << Conv2dTransposeInfo() << "\n"
     << BandInfo() << "\n"
     << Int8Info() << "\n"
     << "cached primitives: " << PrimitiveCache::Global().size() << "\n";
  return os.str();
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def("tvm_ollie.cpu.info", []() -> std::string { return Info(); })
      .def("tvm_ollie.cpu.set_num_threads", [](int64_t n) { SetNumThreads(static_cast<int>(n)); })
      .def("tvm_ollie.cpu.get_num_threads", []() -> int64_t { return GetNumThreads(); })
      .def("tvm_ollie.cpu.set_serial_flops", [](int64_t f) { SetSerialFlops(f); })
      .def("tvm_ollie.cpu.get_serial_flops", []() -> int64_t { return SerialFlops(); })
      .def("tvm_ollie.cpu.cache_stats", []() -> std::string {
        PrimitiveCache& c = PrimitiveCache::Global();
        return "size=" + std::to_string(c.size()) + ";hits=" + std::to_string(c.hits()) +
               ";misses=" + std::to_string(c.misses()) +
               ";pack_reorders=" + std::to_string(weight_pack::Reorders());
      });
}

}  // namespace tvm_ollie
