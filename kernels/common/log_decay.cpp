#include "kernels/common/log_decay.h"

namespace linac {

using namespace dsl;

Tile floor_log_decay(const Tile& g) {
  return where(g < kLogDecayFloor, kLogDecayFloor, g);
}

}  // namespace linac
