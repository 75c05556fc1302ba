// Reliable UC (MELON_UC_RELIABLE; docs/verbs.md "Reliable UC"): a UC QP that runs as RC on the wire,
// so a SEND that arrives before its receive is posted is RNR-NAKed and sent again instead of being
// dropped. For peers that both run MelonDMA: the verbs still see UC (its opcodes, its modify_qp
// attributes, its query_qp answers); a spec UC peer (rxe, a ConnectX with stock drivers) sees RC
// opcodes on a UC QP and drops them, so the sender ends with IBV_WC_RETRY_EXC_ERR.
#pragma once

#include <infiniband/verbs.h>

namespace melon::verbs {

// True when the environment asks for reliable UC on `device`: MELON_UC_RELIABLE=1 (every device)
// or a comma-separated list of device names. `device_option` is the device's own setting (the soft
// provider's config file), which MELON_UC_RELIABLE=0 overrides.
bool reliable_uc_wanted(const char* device, bool device_option);

// The RC attributes IBA 10.3.1 (Table 91) requires for INIT->RTR and RTR->RTS, which a UC modify
// never carries, as a reliable-UC QP runs them: no RDMA READ or atomics (UC has neither), the
// shortest RNR timer, and RNR retries for ever. Adds them to *attr and returns the mask to use.
int reliable_uc_complete(ibv_qp_state current, ibv_qp_attr* attr, int mask);

// What query_qp reports of those attributes for a UC QP: nothing (zero), as for any UC QP.
void reliable_uc_hide(ibv_qp_attr* attr);

constexpr uint8_t kReliableUcMinRnrTimer = 1;  // IBA Table 45: 0.01 ms
// 4.096 us * 2^18 = 1.07 s, NCCL's default for its RC QPs: a collective moves windows of large
// messages, and a peer that is slow to answer (a loaded host, melon-emud) should not draw spurious
// retransmissions of the whole window. A packet really lost on a LAN costs about a second.
constexpr uint8_t kReliableUcTimeout = 18;
constexpr uint8_t kReliableUcRetryCnt = 7;
constexpr uint8_t kReliableUcRnrRetry = 7;  // an RNR retry count of 7 means for ever (IBA)

}  // namespace melon::verbs
