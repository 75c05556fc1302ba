// Reliable UC: when it is on, and the RC attributes its QPs run with (declared in provider.h).
#include "verbs/provider.h"

#include <cstdlib>
#include <cstring>

namespace melon::verbs {

bool reliable_uc_wanted(const char* device, bool device_option) {
  const char* e = std::getenv("MELON_UC_RELIABLE");
  if (!e || !*e) return device_option;
  if (!std::strcmp(e, "0")) return false;
  if (!std::strcmp(e, "1")) return true;
  const size_t n = std::strlen(device);
  for (const char* p = e; *p;) {
    const char* end = std::strchr(p, ',');
    const size_t len = end ? size_t(end - p) : std::strlen(p);
    if (len == n && !std::strncmp(p, device, n)) return true;
    if (!end) break;
    p = end + 1;
  }
  return device_option;
}

int reliable_uc_complete(ibv_qp_state current, ibv_qp_attr* attr, int mask) {
  if (!(mask & IBV_QP_STATE)) return mask;
  if (current == IBV_QPS_INIT && attr->qp_state == IBV_QPS_RTR) {
    attr->max_dest_rd_atomic = 0;
    attr->min_rnr_timer = kReliableUcMinRnrTimer;
    return mask | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  }
  if (current == IBV_QPS_RTR && attr->qp_state == IBV_QPS_RTS) {
    attr->max_rd_atomic = 0;
    attr->timeout = kReliableUcTimeout;
    attr->retry_cnt = kReliableUcRetryCnt;
    attr->rnr_retry = kReliableUcRnrRetry;
    return mask | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY;
  }
  return mask;
}

void reliable_uc_hide(ibv_qp_attr* attr) {
  attr->max_rd_atomic = attr->max_dest_rd_atomic = 0;
  attr->min_rnr_timer = attr->timeout = attr->retry_cnt = attr->rnr_retry = 0;
}

}  // namespace melon::verbs
