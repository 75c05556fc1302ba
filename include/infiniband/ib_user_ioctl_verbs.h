/*
 * MelonDMA public API: the few uverbs enumerations that <infiniband/verbs.h> re-exports under
 * ibv_* names. Values are the Linux uverbs ABI's (so programs built against rdma-core agree with
 * us bit for bit); there is no kernel behind them here.
 */
#ifndef MELON_INFINIBAND_IB_USER_IOCTL_VERBS_H
#define MELON_INFINIBAND_IB_USER_IOCTL_VERBS_H

#include <stdint.h>

#if defined(__linux__)
#include <linux/types.h>
#else
/* Non-Linux hosts have no <linux/types.h>; these are the same fixed-width integers. */
typedef uint8_t __u8;
typedef uint16_t __u16;
typedef uint32_t __u32;
typedef uint64_t __u64;
typedef uint16_t __be16;
typedef uint32_t __be32;
typedef uint64_t __be64;
#ifndef __aligned_u64
#define __aligned_u64 __u64 __attribute__((aligned(8)))
#endif
#endif

#ifndef RDMA_UAPI_PTR /* normally defined by <infiniband/verbs_api.h>; 64-bit form */
#define RDMA_UAPI_PTR(_type, _name) \
  union {                           \
    _type _name;                    \
    __aligned_u64 _name##_data_u64; \
  }
#endif

/* Memory access bits. Bits 20..29 are "optional": a device that does not know one ignores it. */
#define IB_UVERBS_ACCESS_OPTIONAL_FIRST (1 << 20)
#define IB_UVERBS_ACCESS_OPTIONAL_LAST (1 << 29)

enum ib_uverbs_access_flags {
  IB_UVERBS_ACCESS_LOCAL_WRITE = 1 << 0,
  IB_UVERBS_ACCESS_REMOTE_WRITE = 1 << 1,
  IB_UVERBS_ACCESS_REMOTE_READ = 1 << 2,
  IB_UVERBS_ACCESS_REMOTE_ATOMIC = 1 << 3,
  IB_UVERBS_ACCESS_MW_BIND = 1 << 4,
  IB_UVERBS_ACCESS_ZERO_BASED = 1 << 5,
  IB_UVERBS_ACCESS_ON_DEMAND = 1 << 6,
  IB_UVERBS_ACCESS_HUGETLB = 1 << 7,
  IB_UVERBS_ACCESS_RELAXED_ORDERING = IB_UVERBS_ACCESS_OPTIONAL_FIRST,
  /* bits OPTIONAL_FIRST..OPTIONAL_LAST inclusive: 0x3ff00000 */
  IB_UVERBS_ACCESS_OPTIONAL_RANGE =
      ((IB_UVERBS_ACCESS_OPTIONAL_LAST << 1) - 1) & ~(IB_UVERBS_ACCESS_OPTIONAL_FIRST - 1),
};

enum ib_uverbs_srq_type {
  IB_UVERBS_SRQT_BASIC,
  IB_UVERBS_SRQT_XRC,
  IB_UVERBS_SRQT_TM,
};

enum ib_uverbs_wq_type {
  IB_UVERBS_WQT_RQ,
};

enum ib_uverbs_query_port_flags {
  IB_UVERBS_QPF_GRH_REQUIRED = 1 << 0,
};

enum ib_uverbs_flow_action_esp_keymat {
  IB_UVERBS_FLOW_ACTION_ESP_KEYMAT_AES_GCM,
};

enum ib_uverbs_flow_action_esp_keymat_aes_gcm_iv_algo {
  IB_UVERBS_FLOW_ACTION_IV_ALGO_SEQ,
};

struct ib_uverbs_flow_action_esp_keymat_aes_gcm {
  __aligned_u64 iv;
  __u32 iv_algo;
  __u32 salt;
  __u32 icv_len;
  __u32 key_len;
  __u32 aes_key[8];
};

enum ib_uverbs_flow_action_esp_replay {
  IB_UVERBS_FLOW_ACTION_ESP_REPLAY_NONE,
  IB_UVERBS_FLOW_ACTION_ESP_REPLAY_BMP,
};

struct ib_uverbs_flow_action_esp_replay_bmp {
  __u32 size;
};

/* Each pair of flags shares a bit: the zero value is the default of the pair. */
enum ib_uverbs_flow_action_esp_flags {
  IB_UVERBS_FLOW_ACTION_ESP_FLAGS_INLINE_CRYPTO = 0UL << 0,
  IB_UVERBS_FLOW_ACTION_ESP_FLAGS_FULL_OFFLOAD = 1UL << 0,
  IB_UVERBS_FLOW_ACTION_ESP_FLAGS_TUNNEL = 0UL << 1,
  IB_UVERBS_FLOW_ACTION_ESP_FLAGS_TRANSPORT = 1UL << 1,
  IB_UVERBS_FLOW_ACTION_ESP_FLAGS_DECRYPT = 0UL << 2,
  IB_UVERBS_FLOW_ACTION_ESP_FLAGS_ENCRYPT = 1UL << 2,
  IB_UVERBS_FLOW_ACTION_ESP_FLAGS_ESN_NEW_WINDOW = 1UL << 3,
};

struct ib_uverbs_flow_action_esp_encap {
  RDMA_UAPI_PTR(void*, val_ptr);
  RDMA_UAPI_PTR(struct ib_uverbs_flow_action_esp_encap*, next_ptr);
  __u16 len;
  __u16 type;
};

struct ib_uverbs_flow_action_esp {
  __u32 spi;
  __u32 seq;
  __u32 tfc_pad;
  __u32 flags;
  __aligned_u64 hard_limit_pkts;
};

enum ib_uverbs_read_counters_flags {
  IB_UVERBS_READ_COUNTERS_PREFER_CACHED = 1 << 0,
};

enum ib_uverbs_advise_mr_advice {
  IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH,
  IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE,
  IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT,
};

enum ib_uverbs_advise_mr_flag {
  IB_UVERBS_ADVISE_MR_FLAG_FLUSH = 1 << 0,
};

#endif /* MELON_INFINIBAND_IB_USER_IOCTL_VERBS_H */
