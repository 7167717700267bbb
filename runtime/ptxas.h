// ptxas, when it is installed (linac does not need it: the driver compiles PTX): finding it, and its
// resource report of a PTX module, for `Compiled` (linac/runtime.h) and `linac dump`.
#pragma once
#include <optional>
#include <string>

#include "runtime/cuda_module.h"

namespace linac {

/// $PTXAS (when that file exists), else ptxas on PATH, else /usr/local/cuda/bin/ptxas; "" when there is none.
std::string find_ptxas();

/// `ptxas -v` of `ptx` for `arch` ("sm_80", "sm_90a"): what it reports about function `entry`
/// (registers, spills, stack), or nullopt when there is no ptxas. UserError when ptxas rejects the PTX
/// (its log in the message). `log` receives ptxas's output; with `cubin` set the cubin is kept there.
std::optional<cuda::PtxasFunctionStats> ptxas_resources(const std::string& ptx, const std::string& arch,
                                                        const std::string& entry, std::string* log = nullptr,
                                                        const std::string& cubin = "");

}  // namespace linac
