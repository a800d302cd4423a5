/*
 * The device bundle's runner: runs every compiled model of a bundle with the TVM runtime alone
 * (libtvm_ffi.so + libtvm_runtime.so, no Python, no compiler), checks its outputs against the
 * CPU reference outputs stored beside it, and prints a latency table.
 *
 *   runner [BUNDLE_DIR] [--repeat N] [--warmup N] [--model NAME] [--load-only]
 *
 * --load-only loads every library and its VM executable (CUDA kernels included) without
 * touching the device: a check that the bundle is complete, possible on a machine without one.
 * BUNDLE_DIR (default: the runner's own directory) holds manifest.txt (written by
 * tvm_ollie.bundle.manifest; one record a line, fields separated by spaces):
 *
 *   ollie-bundle 1                      format and version
 *   device cuda 0                       where to run (cpu | cuda) and the device index
 *   preload lib/libtvm_runtime_cuda.so  libraries to load first, in order (RTLD_GLOBAL)
 *   model NAME RTOL ATOL                a model; its inputs and reference outputs follow
 *   input FILE DTYPE D0,D1,...          raw little-endian, row-major ("-" for a scalar)
 *   random DTYPE D0,D1,...              an input made here: uniform in [-1, 1) from a fixed seed
 *                                       (integers: 0), the same for every system of the model
 *   output FILE DTYPE D0,D1,...         a reference output of main (flattened tuples)
 *   reference first                     the reference outputs are the first system's own
 *   system NAME LIBRARY                 an executable of the model (Executable.export_library)
 *
 * An output is correct when |out - ref| <= ATOL * max|ref| + RTOL * |ref| everywhere (the
 * benchmark's check). "random" inputs and "reference first" serve the candidate kernels a
 * bundle times for the pass (tvm_ollie.bundle.candidates): nothing is carried but the kernels,
 * and each derived program is checked on the device against the original it replaces.
 * On CUDA the run ends with a line "bandwidth GBPS": a device-to-device copy of 256 MiB (read
 * + write), the roof of the analytic cost's calibration. Latency: the median of --repeat calls of main (after --warmup calls),
 * each ended by a device synchronization. Exit status 0 when every system loaded, ran and
 * matched; 1 otherwise; 2 for a bad manifest or usage.
 */
#include <dlfcn.h>
#include <tvm/ffi/any.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ffi = tvm::ffi;

namespace {

struct TensorFile {
  std::string file;  // empty: a random input
  std::string dtype;
  std::vector<int64_t> shape;
};

struct System {
  std::string name;
  std::string library;
};

struct Model {
  std::string name;
  double rtol = 1e-3;
  double atol = 1e-3;
  std::vector<TensorFile> inputs;
  std::vector<TensorFile> outputs;
  std::vector<System> systems;
  bool reference_first = false;
};

/*! \brief An output held in memory: raw data, its type and shape. */
struct Buffer {
  std::vector<char> data;
  DLDataType dtype;
  std::vector<int64_t> shape;
};

struct Manifest {
  std::string device = "cpu";
  int device_id = 0;
  std::vector<std::string> preload;
  std::vector<Model> models;
};

[[noreturn]] void Fail(const std::string& what) { throw std::runtime_error(what); }

std::vector<int64_t> ParseShape(const std::string& text) {
  std::vector<int64_t> shape;
  if (text == "-") return shape;
  std::stringstream ss(text);
  std::string dim;
  while (std::getline(ss, dim, ',')) shape.push_back(std::stoll(dim));
  return shape;
}

Manifest ReadManifest(const std::string& path) {
  std::ifstream in(path);
  if (!in) Fail("cannot open " + path);
  Manifest m;
  std::string line;
  bool header = false;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string kind;
    if (!(ls >> kind) || kind[0] == '#') continue;
    if (kind == "ollie-bundle") {
      int version = 0;
      ls >> version;
      if (version != 1) Fail("unsupported manifest version " + std::to_string(version));
      header = true;
    } else if (kind == "device") {
      ls >> m.device >> m.device_id;
    } else if (kind == "preload") {
      std::string lib;
      ls >> lib;
      m.preload.push_back(lib);
    } else if (kind == "model") {
      Model model;
      ls >> model.name >> model.rtol >> model.atol;
      m.models.push_back(model);
    } else if (kind == "input" || kind == "output") {
      if (m.models.empty()) Fail("manifest: " + kind + " before any model");
      TensorFile t;
      std::string shape;
      ls >> t.file >> t.dtype >> shape;
      t.shape = ParseShape(shape);
      (kind == "input" ? m.models.back().inputs : m.models.back().outputs).push_back(t);
    } else if (kind == "random") {
      if (m.models.empty()) Fail("manifest: random before any model");
      TensorFile t;
      std::string shape;
      ls >> t.dtype >> shape;
      t.shape = ParseShape(shape);
      m.models.back().inputs.push_back(t);
    } else if (kind == "reference") {
      if (m.models.empty()) Fail("manifest: reference before any model");
      std::string which;
      ls >> which;
      if (which != "first") Fail("manifest: unknown reference '" + which + "'");
      m.models.back().reference_first = true;
    } else if (kind == "system") {
      if (m.models.empty()) Fail("manifest: system before any model");
      System s;
      ls >> s.name >> s.library;
      m.models.back().systems.push_back(s);
    } else {
      Fail("manifest: unknown record '" + kind + "'");
    }
    if (ls.fail()) Fail("manifest: bad line: " + line);
  }
  if (!header) Fail(path + " is not an ollie bundle manifest");
  return m;
}

std::vector<char> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail("cannot open " + path);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t ElementBytes(DLDataType t) { return (static_cast<size_t>(t.bits) * t.lanes + 7) / 8; }

/*! \brief `nbytes` of an input made here: float32 uniform in [-1, 1) from a 64-bit LCG
 * (advancing `seed`), any other type zeros (valid as indices). */
std::vector<char> RandomData(DLDataType t, size_t nbytes, uint64_t* seed) {
  std::vector<char> data(nbytes, 0);
  if (t.code == kDLFloat && t.bits == 32) {
    float* f = reinterpret_cast<float*>(data.data());
    for (size_t k = 0; k < nbytes / 4; ++k) {
      *seed = *seed * 6364136223846793005ULL + 1442695040888963407ULL;
      f[k] = static_cast<float>(static_cast<double>(*seed >> 40) / double(1 << 23) - 1.0);
    }
  }
  return data;
}

/*! \brief Element k of raw data of type t as a double (the types the zoo produces). */
double ElementAt(const char* data, DLDataType t, int64_t k) {
  if (t.code == kDLFloat && t.bits == 32) return reinterpret_cast<const float*>(data)[k];
  if (t.code == kDLFloat && t.bits == 64) return reinterpret_cast<const double*>(data)[k];
  if (t.code == kDLInt && t.bits == 64) return double(reinterpret_cast<const int64_t*>(data)[k]);
  if (t.code == kDLInt && t.bits == 32) return reinterpret_cast<const int32_t*>(data)[k];
  if (t.code == kDLInt && t.bits == 8) return reinterpret_cast<const int8_t*>(data)[k];
  if ((t.code == kDLUInt || t.code == kDLBool) && t.bits == 8) {
    return reinterpret_cast<const uint8_t*>(data)[k];
  }
  Fail("cannot compare outputs of type " + std::string(ffi::DLDataTypeToString(t)));
}

class Runtime {
 public:
  explicit Runtime(DLDevice dev)
      : dev_(dev),
        alloc_(ffi::Function::GetGlobalRequired("runtime.TVMTensorAllocWithScope")),
        from_bytes_(ffi::Function::GetGlobalRequired("runtime.TVMTensorCopyFromBytes")),
        to_bytes_(ffi::Function::GetGlobalRequired("runtime.TVMTensorCopyToBytes")),
        sync_(ffi::Function::GetGlobalRequired("runtime.Device_StreamSync")) {}

  /*! \brief A tensor on the device holding the contents of a raw file. */
  ffi::Tensor Upload(const std::string& dir, const TensorFile& f, uint64_t* seed) const {
    DLDataType dtype = ffi::StringToDLDataType(f.dtype);
    size_t nbytes = static_cast<size_t>(NumElements(f.shape)) * ElementBytes(dtype);
    std::vector<char> data = f.file.empty() ? RandomData(dtype, nbytes, seed)
                                            : ReadFile(dir + "/" + f.file);
    if (data.size() != nbytes) {
      Fail(f.file + ": " + std::to_string(data.size()) + " bytes, expected " +
           std::to_string(nbytes));
    }
    ffi::Tensor t = alloc_(ffi::Shape(f.shape), dtype, dev_, nullptr).cast<ffi::Tensor>();
    from_bytes_(t, static_cast<void*>(data.data()), static_cast<int64_t>(nbytes));
    return t;
  }

  std::vector<char> Download(const ffi::Tensor& t) const {
    std::vector<char> data(static_cast<size_t>(t.numel()) * ElementBytes(t.dtype()));
    to_bytes_(t, static_cast<void*>(data.data()), static_cast<int64_t>(data.size()));
    return data;
  }

  void Sync() const { sync_(dev_, static_cast<int64_t>(0)); }

  /*! \brief Bytes per second of a device-to-device copy of `mib` MiB (read + write), the
   * fastest of `repeat`. */
  double CopyBandwidth(int64_t mib, int repeat) const {
    auto copy = ffi::Function::GetGlobalRequired("runtime.TVMTensorCopyFromTo");
    int64_t count = mib * (int64_t{1} << 20) / 4;
    DLDataType f32{kDLFloat, 32, 1};
    ffi::Tensor src = alloc_(ffi::Shape({count}), f32, dev_, nullptr).cast<ffi::Tensor>();
    ffi::Tensor dst = alloc_(ffi::Shape({count}), f32, dev_, nullptr).cast<ffi::Tensor>();
    copy(src, dst);
    Sync();
    double best = 1e30;
    for (int i = 0; i < repeat; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      copy(src, dst);
      Sync();
      auto t1 = std::chrono::steady_clock::now();
      best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    }
    return 2.0 * static_cast<double>(count) * 4.0 / best;
  }

  /*! \brief The Relax VM of a compiled library, initialized for the device (and the CPU, for
   * shape computations), as tvm.relax.VirtualMachine does; pooled allocators. */
  ffi::Function LoadMain(const std::string& path) const {
    ffi::Module lib = ffi::Module::LoadFromFile(path);
    auto load = lib->GetFunction("vm_load_executable", true);
    if (!load.has_value()) Fail(path + " holds no Relax VM executable");
    ffi::Module vm = (*load)().cast<ffi::Module>();
    constexpr int kPooled = 2;
    auto init = vm->GetFunction("vm_initialization", false);
    if (dev_.device_type == kDLCPU) {
      (*init)(static_cast<int>(dev_.device_type), dev_.device_id, kPooled);
    } else {
      (*init)(static_cast<int>(dev_.device_type), dev_.device_id, kPooled,
              static_cast<int>(kDLCPU), 0, kPooled);
    }
    auto main = vm->GetFunction("main", false);
    if (!main.has_value()) Fail(path + " has no function main");
    return *main;
  }

 private:
  DLDevice dev_;
  ffi::Function alloc_, from_bytes_, to_bytes_, sync_;
};

void Flatten(const ffi::Any& value, std::vector<ffi::Tensor>* out) {
  if (auto t = value.as<ffi::Tensor>()) {
    out->push_back(*t);
  } else if (auto arr = value.as<ffi::Array<ffi::Any>>()) {
    for (const ffi::Any& v : *arr) Flatten(v, out);
  } else {
    Fail("main returned something other than tensors and tuples of them");
  }
}

struct Check {
  bool ok = true;
  double max_abs = 0.0;
  double rel = 0.0;
  std::string why;
};

/*! \brief The outputs of main as raw buffers (downloaded from the device). */
std::vector<Buffer> Outputs(const Runtime& rt, const std::vector<ffi::Tensor>& got) {
  std::vector<Buffer> out;
  for (const ffi::Tensor& t : got) {
    out.push_back({rt.Download(t), t.dtype(), {t.shape().begin(), t.shape().end()}});
  }
  return out;
}

/*! \brief The reference outputs stored in the bundle. */
std::vector<Buffer> StoredReference(const std::string& dir, const Model& model) {
  std::vector<Buffer> refs;
  for (const TensorFile& f : model.outputs) {
    Buffer b{ReadFile(dir + "/" + f.file), ffi::StringToDLDataType(f.dtype), f.shape};
    if (b.data.size() != static_cast<size_t>(NumElements(f.shape)) * ElementBytes(b.dtype)) {
      Fail(f.file + " does not hold " + std::to_string(NumElements(f.shape)) + " elements");
    }
    refs.push_back(std::move(b));
  }
  return refs;
}

Check Compare(const Model& model, const std::vector<Buffer>& refs,
              const std::vector<Buffer>& outs) {
  Check c;
  if (outs.size() != refs.size()) {
    c.ok = false;
    c.why = std::to_string(outs.size()) + " outputs, expected " + std::to_string(refs.size());
    return c;
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    const std::vector<int64_t>& shape = outs[i].shape;
    if (shape != refs[i].shape) {
      c.ok = false;
      c.why = "output " + std::to_string(i) + " has another shape";
      return c;
    }
    const std::vector<char>& ref = refs[i].data;
    const std::vector<char>& out = outs[i].data;
    DLDataType ref_type = refs[i].dtype;
    int64_t n = NumElements(shape);
    double scale = 0.0;
    for (int64_t k = 0; k < n; ++k) {
      scale = std::max(scale, std::fabs(ElementAt(ref.data(), ref_type, k)));
    }
    scale = scale > 0.0 ? scale : 1.0;
    for (int64_t k = 0; k < n; ++k) {
      double r = ElementAt(ref.data(), ref_type, k);
      double err = std::fabs(ElementAt(out.data(), outs[i].dtype, k) - r);
      if (!(err <= model.atol * scale + model.rtol * std::fabs(r))) c.ok = false;
      c.max_abs = std::isnan(err) ? NAN : std::max(c.max_abs, err);
      c.rel = std::max(c.rel, err / scale);
    }
    if (!c.ok && c.why.empty()) c.why = "output " + std::to_string(i) + " differs";
  }
  return c;
}

/*! \brief Median and fastest milliseconds of one call of main (synchronized). */
std::pair<double, double> Time(const Runtime& rt, const ffi::Function& main,
                               const std::vector<ffi::AnyView>& args, int warmup, int repeat) {
  ffi::Any rv;
  for (int i = 0; i < warmup; ++i) main.CallPacked(args.data(), args.size(), &rv);
  rt.Sync();
  std::vector<double> ms;
  for (int i = 0; i < repeat; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    main.CallPacked(args.data(), args.size(), &rv);
    rt.Sync();
    auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  size_t n = ms.size();
  double median = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  return {median, ms.front()};
}

std::string SelfDir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

/*!
 * \brief When a preloaded library is tvm-ollie's native library, run TVM's parallel loops on its
 * OpenMP pool as the Python package does (TVM_OLLIE_PARALLEL_RUNTIME, default openmp; see
 * docs/threads.md): set before any executable loads, since a library keeps the launch it got.
 */
void SetParallelRuntime() {
  auto set = ffi::Function::GetGlobal("tvm_ollie.cpu.set_parallel_runtime");
  if (!set.has_value()) return;
  const char* env = std::getenv("TVM_OLLIE_PARALLEL_RUNTIME");
  (*set)(std::string(env != nullptr && *env ? env : "openmp"));
}

void Preload(const std::string& dir, const std::vector<std::string>& libs) {
  for (const std::string& lib : libs) {
    std::string path = lib[0] == '/' ? lib : dir + "/" + lib;
    if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      Fail("cannot load " + path + ": " + dlerror());
    }
  }
}

std::string OneLine(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  return line.size() > 160 ? line.substr(0, 160) : line;
}

/*! \brief Load every library and its executable; no device is used. */
int LoadOnly(const std::string& dir, const Manifest& m, const std::string& only) {
  int failures = 0;
  for (const Model& model : m.models) {
    if (!only.empty() && model.name != only) continue;
    for (const System& sys : model.systems) {
      try {
        ffi::Module lib = ffi::Module::LoadFromFile(dir + "/" + sys.library);
        auto load = lib->GetFunction("vm_load_executable", true);
        if (!load.has_value()) Fail("no Relax VM executable");
        (*load)();
        std::printf("%-22s %-8s loaded\n", model.name.c_str(), sys.name.c_str());
      } catch (const std::exception& err) {
        ++failures;
        std::printf("%-22s %-8s FAILED: %s\n", model.name.c_str(), sys.name.c_str(),
                    OneLine(err.what()).c_str());
      }
    }
  }
  std::printf("%s\n", failures ? "bundle load: FAILED" : "bundle load: all ok");
  return failures ? 1 : 0;
}

int Run(int argc, char** argv) {
  std::string dir = SelfDir(), only;
  int repeat = 20, warmup = 3;
  bool load_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--load-only") {
      load_only = true;
    } else if ((a == "--repeat" || a == "--warmup" || a == "--model") && i + 1 < argc) {
      std::string v = argv[++i];
      if (a == "--model") {
        only = v;
      } else {
        (a == "--repeat" ? repeat : warmup) = std::stoi(v);
      }
    } else if (!a.empty() && a[0] != '-') {
      dir = a;
    } else {
      std::cerr << "usage: runner [BUNDLE_DIR] [--repeat N] [--warmup N] [--model NAME] "
                   "[--load-only]\n";
      return 2;
    }
  }
  Manifest m = ReadManifest(dir + "/manifest.txt");
  Preload(dir, m.preload);
  SetParallelRuntime();
  DLDevice dev{m.device == "cuda" ? kDLCUDA : kDLCPU, m.device_id};
  if (m.device != "cuda" && m.device != "cpu") Fail("unknown device " + m.device);
  if (load_only) return LoadOnly(dir, m, only);
  Runtime rt(dev);
  std::printf("%-22s %-8s %10s %10s %10s %10s  %s\n", "model", "system", "median_ms", "min_ms",
              "max_abs", "rel_err", "status");
  int failures = 0;
  for (const Model& model : m.models) {
    if (!only.empty() && model.name != only) continue;
    std::vector<ffi::Tensor> inputs;
    uint64_t seed = 20261204;
    for (const TensorFile& f : model.inputs) inputs.push_back(rt.Upload(dir, f, &seed));
    std::vector<ffi::AnyView> args(inputs.begin(), inputs.end());
    std::vector<Buffer> refs;
    bool have_refs = !model.reference_first;
    if (have_refs) refs = StoredReference(dir, model);
    for (const System& sys : model.systems) {
      try {
        ffi::Function main = rt.LoadMain(dir + "/" + sys.library);
        ffi::Any out;
        main.CallPacked(args.data(), args.size(), &out);
        rt.Sync();
        std::vector<ffi::Tensor> got;
        Flatten(out, &got);
        std::vector<Buffer> outs = Outputs(rt, got);
        if (!have_refs) {  // the first system is the reference of the others
          refs = outs;
          have_refs = true;
        }
        Check c = Compare(model, refs, outs);
        auto [median, fastest] = Time(rt, main, args, warmup, repeat);
        failures += c.ok ? 0 : 1;
        std::printf("%-22s %-8s %10.4f %10.4f %10.3g %10.3g  %s\n", model.name.c_str(),
                    sys.name.c_str(), median, fastest, c.max_abs, c.rel,
                    c.ok ? "ok" : ("MISMATCH: " + c.why).c_str());
      } catch (const std::exception& err) {
        ++failures;
        std::printf("%-22s %-8s %10s %10s %10s %10s  FAILED: %s\n", model.name.c_str(),
                    sys.name.c_str(), "-", "-", "-", "-", OneLine(err.what()).c_str());
      }
      std::fflush(stdout);
    }
  }
  if (dev.device_type == kDLCUDA && only.empty()) {
    std::printf("bandwidth %.1f GB/s\n", rt.CopyBandwidth(256, 5) * 1e-9);
  }
  std::printf("%s\n", failures ? "bundle run: FAILED" : "bundle run: all ok");
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& err) {
    std::cerr << "runner: " << err.what() << "\n";
    return 2;
  }
}
