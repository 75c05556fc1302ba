// The bench tools' RC connection: one QP of a soft device moved through INIT, RTR and RTS towards
// QP `dest` at the IPv4 address 127.0.<net>.<host> (as a v4-mapped GID), PSNs 0, timeout 14, seven
// retries, one READ/atomic outstanding.
#pragma once

#include <infiniband/verbs.h>
#include <string.h>

#include <cstdint>

// nullptr when connected, else the state whose transition failed.
inline const char* bench_connect_rc(ibv_qp* qp, uint32_t dest, uint8_t net, uint8_t host, ibv_mtu mtu,
                                    unsigned access) {
  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_INIT;
  at.port_num = 1;
  at.qp_access_flags = access;
  if (ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return "INIT";
  at.qp_state = IBV_QPS_RTR;
  at.path_mtu = mtu;
  at.dest_qp_num = dest;
  at.max_dest_rd_atomic = 1;
  at.min_rnr_timer = 1;
  at.ah_attr.is_global = 1;
  at.ah_attr.port_num = 1;
  const uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, net, host};
  memcpy(at.ah_attr.grh.dgid.raw, gid, 16);
  if (ibv_modify_qp(qp, &at,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return "RTR";
  at.qp_state = IBV_QPS_RTS;
  at.timeout = 14;
  at.retry_cnt = 7;
  at.rnr_retry = 7;
  at.max_rd_atomic = 1;
  if (ibv_modify_qp(qp, &at,
                    IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_MAX_QP_RD_ATOMIC))
    return "RTS";
  return nullptr;
}
