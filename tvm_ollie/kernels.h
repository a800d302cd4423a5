// Descriptions of the kernel families for tvm_ollie.cpu.info().
#ifndef TVM_OLLIE_KERNELS_H_
#define TVM_OLLIE_KERNELS_H_

#include <string>

namespace tvm_ollie {

// One line each: the implementation choices of the kernel family.
std::string MatmulInfo();
std::string Conv2dInfo();
std::string Conv2dTransposeInfo();
std::string BandInfo();
std::string Int8Info();

}  // namespace tvm_ollie

#endif  // TVM_OLLIE_KERNELS_H_
