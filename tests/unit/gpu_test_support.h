// What the unit tests that run kernels on a GPU share: on a machine without one, their test cases are
// visible skips (doctest::skip(no_gpu())), not passes.
#pragma once
#include "linac/runtime.h"

namespace linac::test {

/// Whether this machine has no GPU the runtime can use (asked once).
inline bool no_gpu() {
  static const bool none = !runtime::gpu_available();
  return none;
}

}  // namespace linac::test
