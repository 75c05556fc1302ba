// The driver core against a device whose every answer comes from the fuzz input: each command's
// status, syndrome and output bytes (counts, page addresses, object numbers, capabilities). The
// core must fail cleanly wherever the answers lead, then tear down with every DMA buffer and every
// byte of kernel memory back (checked here; ASan/UBSan catch the rest). The device is the small
// fake of tests/mlx5/core (polled, no events: commands in event mode end on their short timeout).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mlx5/core/fake_hal.h"
#include "mlx5/core/hca.h"
#include "mlx5/prm/prm.h"

namespace core = melon::mlx5::core;
namespace p = melon::mlx5::prm;

namespace {

struct Input {
  const uint8_t* data;
  size_t size, at = 0;
  uint8_t byte() { return at < size ? data[at++] : 0; }
  uint32_t u32() { return uint32_t(byte()) << 24 | uint32_t(byte()) << 16 | uint32_t(byte()) << 8 | byte(); }
};

constexpr uint8_t kStatuses[] = {p::cmd_status::BAD_PARAM_ERR, p::cmd_status::BAD_RES_ERR, p::cmd_status::LIM_ERR,
                                 p::cmd_status::INT_ERR, p::cmd_status::BAD_SYS_STATE_ERR};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  core::test::FakeHal hal;
  hal.respond = [&](const std::vector<uint8_t>&, std::vector<uint8_t>& out) {
    uint8_t sel = in.byte();
    // Mostly OK, so the input reaches the later stages.
    uint8_t status = sel < 224 ? 0 : kStatuses[sel % sizeof kStatuses];
    uint32_t syndrome = status ? in.u32() : 0;
    // Output: a run of bytes from the input, the rest zero.
    size_t n = in.byte();
    for (size_t i = 8; i < out.size() && i < 8 + n * 4; ++i) out[i] = in.byte();
    p::cmd_set_result(out.data(), status, syndrome);
  };
  core::HcaConfig cfg;
  cfg.cmd_timeout_ms = 2;
  cfg.fw_init_timeout_ms = 2;
  cfg.max_fw_pages = 128;
  {
    static core::Hca hca;  // large; reused across runs (attach/detach each time)
    hca.attach(&hal, cfg);
    if (hca.bring_up() == core::Err::ok) {
      core::Pd* pd = nullptr;
      hca.alloc_pd(&pd);
      core::Uar* uar = nullptr;
      hca.alloc_uar(&uar);
      core::GidEntry g;
      hca.set_gid(in.byte(), g);
      bool reset = false;
      hca.reinit(&reset);
    }
    hca.teardown();
    hca.detach();
  }
  if (hal.dma_live != 0 || hal.mem_bytes != 0) {
    fprintf(stderr, "fuzz_core_firmware: leaked %lld DMA buffers, %lld bytes of kernel memory\n",
            (long long)hal.dma_live, (long long)hal.mem_bytes);
    abort();
  }
  return 0;
}
