// Exported helpers that need no provider: strings, static-rate conversions, fork support, the
// synthesised sysfs, and the kernel-ABI conversions librdmacm uses.
#include "verbs/internal.h"

#include <infiniband/sa.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>

namespace {

// The integer behind an enum argument, read without an enum load: C callers may pass any value,
// and loading an out-of-range enum is undefined in C++.
template <class E>
int raw(const E& e) {
  static_assert(sizeof(E) == sizeof(int));
  int v;
  std::memcpy(&v, &e, sizeof(v));
  return v;
}

}  // namespace

// ---- strings --------------------------------------------------------------------------------------

MELON_EXPORT const char* ibv_wc_status_str(enum ibv_wc_status status) {
  static const char* const names[] = {
      "success",
      "local length error",
      "local QP operation error",
      "local EE context operation error",
      "local protection error",
      "Work Request Flushed Error",
      "memory management operation error",
      "bad response error",
      "local access error",
      "remote invalid request error",
      "remote access error",
      "remote operation error",
      "transport retry counter exceeded",
      "RNR retry counter exceeded",
      "local RDD violation error",
      "remote invalid RD request",
      "aborted error",
      "invalid EE context number",
      "invalid EE context state",
      "fatal error",
      "response timeout error",
      "general error",
      "TM error",
      "TM software rendezvous",
  };
  unsigned i = static_cast<unsigned>(raw(status));
  return i < sizeof(names) / sizeof(names[0]) ? names[i] : "unknown";
}

MELON_EXPORT const char* ibv_node_type_str(enum ibv_node_type node_type) {
  switch (raw(node_type)) {
    case IBV_NODE_CA: return "InfiniBand channel adapter";
    case IBV_NODE_SWITCH: return "InfiniBand switch";
    case IBV_NODE_ROUTER: return "InfiniBand router";
    case IBV_NODE_RNIC: return "iWARP NIC";
    case IBV_NODE_USNIC: return "usNIC";
    case IBV_NODE_USNIC_UDP: return "usNIC UDP";
    case IBV_NODE_UNSPECIFIED: return "unspecified";
    default: return "unknown";
  }
}

MELON_EXPORT const char* ibv_port_state_str(enum ibv_port_state port_state) {
  static const char* const names[] = {"PORT_NOP",   "PORT_DOWN",   "PORT_INIT",
                                      "PORT_ARMED", "PORT_ACTIVE", "PORT_ACTIVE_DEFER"};
  unsigned i = static_cast<unsigned>(raw(port_state));
  return i < sizeof(names) / sizeof(names[0]) ? names[i] : "unknown";
}

MELON_EXPORT const char* ibv_event_type_str(enum ibv_event_type event) {
  static const char* const names[] = {
      "CQ error",
      "local work queue catastrophic error",
      "invalid request local work queue error",
      "local access violation work queue error",
      "communication established",
      "send queue drained",
      "path migrated",
      "path migration request error",
      "local catastrophic error",
      "port active",
      "port error",
      "LID change",
      "P_Key change",
      "SM change",
      "SRQ catastrophic error",
      "SRQ limit reached",
      "last WQE reached",
      "client reregistration",
      "GID table change",
      "WQ fatal",
  };
  unsigned i = static_cast<unsigned>(raw(event));
  return i < sizeof(names) / sizeof(names[0]) ? names[i] : "unknown";
}

// ---- static rates (IBA 9.11 / PortInfo) -----------------------------------------------------------

namespace {

struct RateRow {
  ibv_rate rate;
  int mult;  // multiple of 2.5 Gb/s, 0 if the rate is not one
  int mbps;
};

// Every enum ibv_rate value with its exact signalling rate.
constexpr RateRow kRates[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},   {IBV_RATE_5_GBPS, 2, 5000},       {IBV_RATE_10_GBPS, 4, 10000},
    {IBV_RATE_20_GBPS, 8, 20000},   {IBV_RATE_30_GBPS, 12, 30000},    {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},  {IBV_RATE_80_GBPS, 32, 80000},    {IBV_RATE_120_GBPS, 48, 120000},
    {IBV_RATE_14_GBPS, 0, 14062},   {IBV_RATE_56_GBPS, 0, 56250},     {IBV_RATE_112_GBPS, 0, 112500},
    {IBV_RATE_168_GBPS, 0, 168750}, {IBV_RATE_25_GBPS, 0, 25781},     {IBV_RATE_100_GBPS, 0, 103125},
    {IBV_RATE_200_GBPS, 0, 206250}, {IBV_RATE_300_GBPS, 0, 309375},   {IBV_RATE_28_GBPS, 0, 28125},
    {IBV_RATE_50_GBPS, 0, 53125},   {IBV_RATE_400_GBPS, 0, 425000},   {IBV_RATE_600_GBPS, 0, 637500},
    {IBV_RATE_800_GBPS, 0, 850000}, {IBV_RATE_1200_GBPS, 0, 1275000},
};

}  // namespace

MELON_EXPORT int ibv_rate_to_mult(enum ibv_rate rate) {
  for (const RateRow& r : kRates)
    if (r.rate == raw(rate) && r.mult) return r.mult;
  return -1;
}

MELON_EXPORT enum ibv_rate mult_to_ibv_rate(int mult) {
  for (const RateRow& r : kRates)
    if (r.mult && r.mult == mult) return r.rate;
  return IBV_RATE_MAX;
}

MELON_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate) {
  for (const RateRow& r : kRates)
    if (r.rate == raw(rate)) return r.mbps;
  return -1;
}

MELON_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps) {
  for (const RateRow& r : kRates)
    if (r.mbps == mbps) return r.rate;
  return IBV_RATE_MAX;
}

// ---- fork support ---------------------------------------------------------------------------------

// Registered memory is never pinned or remapped by this library (the soft transport copies through
// the socket layer), so a child after fork() sees ordinary copy-on-write memory: nothing to do.
MELON_EXPORT int ibv_fork_init(void) { return 0; }
MELON_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }
MELON_EXPORT int ibv_dontfork_range(void*, size_t) { return 0; }
MELON_EXPORT int ibv_dofork_range(void*, size_t) { return 0; }

// ---- sysfs ----------------------------------------------------------------------------------------

namespace melon::verbs {

// No file lives under this root: ibv_read_sysfs_file answers for it from the devices themselves,
// so applications that read sysfs through libibverbs work without an RDMA kernel (or on macOS).
const char kSysfsRoot[] = "/melondma/sysfs";

Device* device_by_name(const char* name);  // device.cpp

namespace {

std::string guid_text(__be64 be) {
  uint64_t g = 0;
  const auto* b = reinterpret_cast<const uint8_t*>(&be);
  for (int i = 0; i < 8; i++) g = (g << 8) | b[i];
  char s[24];
  std::snprintf(s, sizeof(s), "%04x:%04x:%04x:%04x", unsigned(g >> 48) & 0xffff, unsigned(g >> 32) & 0xffff,
                unsigned(g >> 16) & 0xffff, unsigned(g) & 0xffff);
  return s;
}

// Content of one attribute file of device `dev`, path relative to its directory. false: no such
// file.
bool device_attribute(Device* dev, const std::string& rel, std::string* out) {
  if (rel == "node_guid" || rel == "sys_image_guid") {
    *out = guid_text(dev->node_guid());
    return true;
  }
  if (rel == "board_id") {
    *out = dev->board_id();
    return true;
  }
  if (rel == "node_type") {
    *out = "1: CA";
    return true;
  }
  if (rel == "node_desc") {
    *out = std::string("MelonDMA ") + dev->name();
    return true;
  }
  if (rel != "fw_ver" && rel != "hw_rev" && rel != "hca_type" && rel.rfind("ports/", 0) != 0) return false;

  // The rest comes from a short-lived context.
  ContextBase* base = dev->open();
  if (!base) return false;
  ContextOps* ops = base->ops;
  bool ok = false;
  ibv_device_attr_ex da{};
  if (ops->query_device_ex(&da) == 0) {
    char s[128];
    if (rel == "fw_ver") {
      *out = da.orig_attr.fw_ver;
      ok = true;
    } else if (rel == "hw_rev") {
      std::snprintf(s, sizeof(s), "0x%x", da.orig_attr.hw_ver);
      *out = s;
      ok = true;
    } else if (rel == "hca_type") {
      std::snprintf(s, sizeof(s), "0x%x", da.orig_attr.vendor_part_id);
      *out = s;
      ok = true;
    } else {
      unsigned port = 0;
      char tail[64] = "";
      unsigned idx = 0;
      ibv_port_attr pa{};
      if (std::sscanf(rel.c_str(), "ports/%u/%63s", &port, tail) == 2 && port <= 255 &&
          ops->query_port(static_cast<uint8_t>(port), &pa) == 0) {
        std::string t = tail;
        ibv_gid_entry e{};
        if (t == "state") {
          std::snprintf(s, sizeof(s), "%d: %s", pa.state, ibv_port_state_str(pa.state) + 5);
          *out = s;
          ok = true;
        } else if (t == "phys_state") {
          *out = pa.phys_state == 5 ? "5: LinkUp" : "3: Disabled";
          ok = true;
        } else if (t == "link_layer") {
          *out = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand";
          ok = true;
        } else if (t == "lid") {
          std::snprintf(s, sizeof(s), "0x%x", pa.lid);
          *out = s;
          ok = true;
        } else if (std::sscanf(t.c_str(), "gids/%u", &idx) == 1 && t == "gids/" + std::to_string(idx)) {
          if (ops->query_gid_entry(port, idx, &e) != 0) std::memset(&e, 0, sizeof(e));
          const uint8_t* r = e.gid.raw;
          std::snprintf(s, sizeof(s),
                        "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:"
                        "%02x%02x:%02x%02x:%02x%02x",
                        r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13], r[14],
                        r[15]);
          *out = s;
          ok = idx < static_cast<unsigned>(pa.gid_tbl_len);
        } else if (std::sscanf(t.c_str(), "gid_attrs/types/%u", &idx) == 1 &&
                   ops->query_gid_entry(port, idx, &e) == 0) {
          *out = e.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : "IB/RoCE v1";
          ok = true;
        }
      }
    }
  }
  ibv_close_device(base->ibv());
  return ok;
}

}  // namespace

int synth_sysfs_file(const char* path, char* buf, size_t size) {
  std::string p = path;
  std::string prefix = std::string(kSysfsRoot) + "/class/infiniband/";
  std::string content;
  bool found = false;
  if (p.rfind(prefix, 0) == 0) {
    std::string rest = p.substr(prefix.size());
    size_t slash = rest.find('/');
    if (slash != std::string::npos) {
      if (Device* dev = device_by_name(rest.substr(0, slash).c_str()))
        found = device_attribute(dev, rest.substr(slash + 1), &content);
    }
  }
  if (!found) {
    errno = ENOENT;
    return -1;
  }
  content += '\n';
  size_t n = std::min(content.size(), size);
  std::memcpy(buf, content.data(), n);
  return static_cast<int>(n);
}

}  // namespace melon::verbs

using namespace melon::verbs;

// rdma-core v44 (libibverbs/driver.h): `const char *ibv_get_sysfs_path(void)`, never NULL ("/sys"
// there). Ours is the root of the synthesised sysfs, so that what a caller builds from it (librdmacm
// reads <root>/class/misc/rdma_cm/abi_version) resolves like the devices' ibdev_path: a device
// attribute is found, anything else is ENOENT.
MELON_EXPORT const char* ibv_get_sysfs_path(void) { return kSysfsRoot; }

// Reads <dir>/<file>: up to `size` bytes, a trailing newline replaced by NUL. Returns the length
// (without the newline), or -1 with errno. Content that would not fit with its terminator fails.
MELON_EXPORT int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size) {
  if (!dir || !file || !buf || !size) {
    errno = EINVAL;
    return -1;
  }
  std::string path = std::string(dir) + "/" + file;
  int len;
  if (path.rfind(kSysfsRoot, 0) == 0) {
    len = synth_sysfs_file(path.c_str(), buf, size);
  } else {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    len = static_cast<int>(read(fd, buf, size));
    int saved = errno;
    close(fd);
    errno = saved;
  }
  if (len <= 0) return len;
  if (buf[len - 1] == '\n') {
    buf[--len] = '\0';
  } else if (static_cast<size_t>(len) < size) {
    buf[len] = '\0';
  } else {
    errno = EOVERFLOW;
    return -1;
  }
  return len;
}

// ---- kernel-ABI conversions (used by librdmacm) ---------------------------------------------------
// The uverbs structures carry the same values as the verbs ones, packed differently (Linux
// include/uapi/rdma/ib_user_verbs.h and ib_user_sa.h).

namespace {

struct KernGlobalRoute {
  uint8_t dgid[16];
  uint32_t flow_label;
  uint8_t sgid_index;
  uint8_t hop_limit;
  uint8_t traffic_class;
  uint8_t reserved;
};

struct KernAhAttr {
  KernGlobalRoute grh;
  uint16_t dlid;
  uint8_t sl;
  uint8_t src_path_bits;
  uint8_t static_rate;
  uint8_t is_global;
  uint8_t port_num;
  uint8_t reserved;
};
static_assert(sizeof(KernAhAttr) == 32);

struct KernQpAttr {
  uint32_t qp_attr_mask;
  uint32_t qp_state;
  uint32_t cur_qp_state;
  uint32_t path_mtu;
  uint32_t path_mig_state;
  uint32_t qkey;
  uint32_t rq_psn;
  uint32_t sq_psn;
  uint32_t dest_qp_num;
  uint32_t qp_access_flags;
  KernAhAttr ah_attr;
  KernAhAttr alt_ah_attr;
  uint32_t max_send_wr;
  uint32_t max_recv_wr;
  uint32_t max_send_sge;
  uint32_t max_recv_sge;
  uint32_t max_inline_data;
  uint16_t pkey_index;
  uint16_t alt_pkey_index;
  uint8_t en_sqd_async_notify;
  uint8_t sq_draining;
  uint8_t max_rd_atomic;
  uint8_t max_dest_rd_atomic;
  uint8_t min_rnr_timer;
  uint8_t port_num;
  uint8_t timeout;
  uint8_t retry_cnt;
  uint8_t rnr_retry;
  uint8_t alt_port_num;
  uint8_t alt_timeout;
  uint8_t reserved[5];
};
static_assert(sizeof(KernQpAttr) == 144);

struct KernPathRec {
  uint8_t dgid[16];
  uint8_t sgid[16];
  __be16 dlid;
  __be16 slid;
  uint32_t raw_traffic;
  __be32 flow_label;
  uint32_t reversible;
  uint32_t mtu;
  __be16 pkey;
  uint8_t hop_limit;
  uint8_t traffic_class;
  uint8_t numb_path;
  uint8_t sl;
  uint8_t mtu_selector;
  uint8_t rate_selector;
  uint8_t rate;
  uint8_t packet_life_time_selector;
  uint8_t packet_life_time;
  uint8_t preference;
};
static_assert(sizeof(KernPathRec) == 64);

void ah_from_kern(ibv_ah_attr* dst, const KernAhAttr* src) {
  std::memcpy(dst->grh.dgid.raw, src->grh.dgid, 16);
  dst->grh.flow_label = src->grh.flow_label;
  dst->grh.sgid_index = src->grh.sgid_index;
  dst->grh.hop_limit = src->grh.hop_limit;
  dst->grh.traffic_class = src->grh.traffic_class;
  dst->dlid = src->dlid;
  dst->sl = src->sl;
  dst->src_path_bits = src->src_path_bits;
  dst->static_rate = src->static_rate;
  dst->is_global = src->is_global;
  dst->port_num = src->port_num;
}

}  // namespace

// The kernel structures (rdma/ib_user_verbs.h, rdma/ib_user_sa.h) are opaque in the prototypes;
// their layouts are the Kern* mirrors above.
// A NULL side copies nothing (rdma-core would fault): these have no way to report an error.
MELON_EXPORT void ibv_copy_ah_attr_from_kern(ibv_ah_attr* dst, ib_uverbs_ah_attr* src) {
  if (!dst || !src) return;
  ah_from_kern(dst, reinterpret_cast<const KernAhAttr*>(src));
}

MELON_EXPORT void ibv_copy_qp_attr_from_kern(ibv_qp_attr* dst, ib_uverbs_qp_attr* src_) {
  if (!dst || !src_) return;
  const auto* src = reinterpret_cast<const KernQpAttr*>(src_);
  dst->cur_qp_state = static_cast<ibv_qp_state>(src->cur_qp_state);
  dst->path_mtu = static_cast<ibv_mtu>(src->path_mtu);
  dst->path_mig_state = static_cast<ibv_mig_state>(src->path_mig_state);
  dst->qkey = src->qkey;
  dst->rq_psn = src->rq_psn;
  dst->sq_psn = src->sq_psn;
  dst->dest_qp_num = src->dest_qp_num;
  dst->qp_access_flags = src->qp_access_flags;
  dst->cap.max_send_wr = src->max_send_wr;
  dst->cap.max_recv_wr = src->max_recv_wr;
  dst->cap.max_send_sge = src->max_send_sge;
  dst->cap.max_recv_sge = src->max_recv_sge;
  dst->cap.max_inline_data = src->max_inline_data;
  ah_from_kern(&dst->ah_attr, &src->ah_attr);
  ah_from_kern(&dst->alt_ah_attr, &src->alt_ah_attr);
  dst->pkey_index = src->pkey_index;
  dst->alt_pkey_index = src->alt_pkey_index;
  dst->en_sqd_async_notify = src->en_sqd_async_notify;
  dst->sq_draining = src->sq_draining;
  dst->max_rd_atomic = src->max_rd_atomic;
  dst->max_dest_rd_atomic = src->max_dest_rd_atomic;
  dst->min_rnr_timer = src->min_rnr_timer;
  dst->port_num = src->port_num;
  dst->timeout = src->timeout;
  dst->retry_cnt = src->retry_cnt;
  dst->rnr_retry = src->rnr_retry;
  dst->alt_port_num = src->alt_port_num;
  dst->alt_timeout = src->alt_timeout;
}

MELON_EXPORT void ibv_copy_path_rec_from_kern(ibv_sa_path_rec* dst, ib_user_path_rec* src_) {
  if (!dst || !src_) return;
  const auto* src = reinterpret_cast<const KernPathRec*>(src_);
  std::memcpy(dst->dgid.raw, src->dgid, 16);
  std::memcpy(dst->sgid.raw, src->sgid, 16);
  dst->dlid = src->dlid;
  dst->slid = src->slid;
  dst->raw_traffic = static_cast<int>(src->raw_traffic);
  dst->flow_label = src->flow_label;
  dst->reversible = static_cast<int>(src->reversible);
  dst->mtu = static_cast<uint8_t>(src->mtu);
  dst->pkey = src->pkey;
  dst->hop_limit = src->hop_limit;
  dst->traffic_class = src->traffic_class;
  dst->numb_path = src->numb_path;
  dst->sl = src->sl;
  dst->mtu_selector = src->mtu_selector;
  dst->rate_selector = src->rate_selector;
  dst->rate = src->rate;
  dst->packet_life_time_selector = src->packet_life_time_selector;
  dst->packet_life_time = src->packet_life_time;
  dst->preference = src->preference;
}

MELON_EXPORT void ibv_copy_path_rec_to_kern(ib_user_path_rec* dst_, ibv_sa_path_rec* src) {
  if (!dst_ || !src) return;
  auto* dst = reinterpret_cast<KernPathRec*>(dst_);
  std::memset(dst, 0, sizeof(*dst));
  std::memcpy(dst->dgid, src->dgid.raw, 16);
  std::memcpy(dst->sgid, src->sgid.raw, 16);
  dst->dlid = src->dlid;
  dst->slid = src->slid;
  dst->raw_traffic = static_cast<uint32_t>(src->raw_traffic);
  dst->flow_label = src->flow_label;
  dst->reversible = static_cast<uint32_t>(src->reversible);
  dst->mtu = src->mtu;
  dst->pkey = src->pkey;
  dst->hop_limit = src->hop_limit;
  dst->traffic_class = src->traffic_class;
  dst->numb_path = src->numb_path;
  dst->sl = src->sl;
  dst->mtu_selector = src->mtu_selector;
  dst->rate_selector = src->rate_selector;
  dst->rate = src->rate;
  dst->packet_life_time_selector = src->packet_life_time_selector;
  dst->packet_life_time = src->packet_life_time;
  dst->preference = src->preference;
}
