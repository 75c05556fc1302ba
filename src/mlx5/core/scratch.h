// A zeroed scratch buffer from the HAL's kernel memory, freed at scope exit (command images that
// are too large for a kernel stack).
#pragma once

#include "mlx5/core/hal.h"

namespace melon::mlx5::core {

class Scratch {
 public:
  Scratch(Hal& hal, size_t size) : hal_(hal), size_(size), p_(static_cast<uint8_t*>(hal.mem_alloc(size))) {}
  ~Scratch() {
    if (p_) hal_.mem_free(p_, size_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  uint8_t* get() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  Hal& hal_;
  size_t size_;
  uint8_t* p_;
};

}  // namespace melon::mlx5::core
