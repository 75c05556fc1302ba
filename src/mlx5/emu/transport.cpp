// The transport behind QPs: until the data path lands (src/rc host seam), QPs keep their PRM state
// here and send doorbells are counted as ignored.
#include "mlx5/emu/hca.h"

namespace melon::mlx5::emu {

bool Hca::tp_create_qp(Qp& qp, uint32_t* qpn) {
  uint32_t n = qp_cursor_;
  while (qps_.count(n)) n = (n + 1) & 0xffffff ? (n + 1) & 0xffffff : 0x11;
  qp_cursor_ = n + 1;
  *qpn = n;
  return true;
}
bool Hca::tp_modify_qp(Qp& qp, uint8_t to_state) { return true; }
void Hca::tp_query_qp(Qp& qp, uint8_t* qpc_out) {}
void Hca::tp_destroy_qp(Qp& qp) {}
bool Hca::tp_create_srq(Srq& s) { return true; }
void Hca::tp_arm_srq(Srq& s) {}
void Hca::tp_destroy_srq(Srq& s) {}
void Hca::send_doorbell(const Doorbell& db) { ++stats_.doorbells_ignored; }

}  // namespace melon::mlx5::emu
