// The CM message tables (IBA 12.6, Tables 106-120) and the one codec that walks them. Byte
// offsets in the tables below are the IBA's, counted from the start of the CM data (after the
// 24-byte MAD header); every bit of each message's 232 bytes belongs to one row, reserved bits
// included, so decoding and re-encoding a MAD reproduces it exactly.
#include "cm/messages.h"

#include <string.h>

#include "cm/bits.h"

namespace melon::cm {
namespace {

struct Row {
  FieldInfo info;
  uint16_t off;  // of the struct member, from the start of the message (the union)
  uint8_t size;  // of the member: 1/2/4/8 for a number, else a byte array
  bool bytes;
};

constexpr uint16_t H = uint16_t(kMadHeaderSize);
#define MELON_CM_UINT(S, m, byte, bit, bits) \
  Row { {#m, uint16_t(H + (byte)), bit, bits}, uint16_t(offsetof(S, m)), uint8_t(sizeof(S::m)), false }
#define MELON_CM_PATH(S, p, m, byte, bit, bits)                                                    \
  Row {                                                                                            \
    {#p "." #m, uint16_t(H + (byte)), bit, bits}, uint16_t(offsetof(S, p) + offsetof(ReqPath, m)), \
        uint8_t(sizeof(ReqPath::m)), false                                                         \
  }
#define MELON_CM_BYTES(S, m, byte) \
  Row { {#m, uint16_t(H + (byte)), 0, uint16_t(8 * sizeof(S::m))}, uint16_t(offsetof(S, m)), 0, true }
#define MELON_CM_PATH_BYTES(S, p, m, byte)                                  \
  Row {                                                                     \
    {#p "." #m, uint16_t(H + (byte)), 0, uint16_t(8 * sizeof(ReqPath::m))}, \
        uint16_t(offsetof(S, p) + offsetof(ReqPath, m)), 0, true            \
  }

// The MAD header's rows are relative to the MAD (no +24) and to MadHeader.
#define MELON_MAD(m, byte, bits) \
  Row { {#m, byte, 0, bits}, uint16_t(offsetof(MadHeader, m)), uint8_t(sizeof(MadHeader::m)), false }
constexpr Row kHeader[] = {
    MELON_MAD(base_version, 0, 8), MELON_MAD(mgmt_class, 1, 8), MELON_MAD(class_version, 2, 8),
    MELON_MAD(method, 3, 8),       MELON_MAD(status, 4, 16),    MELON_MAD(class_specific, 6, 16),
    MELON_MAD(tid, 8, 64),         MELON_MAD(attr_id, 16, 16),  MELON_MAD(reserved, 18, 16),
    MELON_MAD(attr_mod, 20, 32),
};

#define MELON_REQ_PATH(p, at)                                                                                 \
  MELON_CM_PATH(Req, p, local_lid, at + 0, 0, 16), MELON_CM_PATH(Req, p, remote_lid, at + 2, 0, 16),          \
      MELON_CM_PATH_BYTES(Req, p, local_gid, at + 4), MELON_CM_PATH_BYTES(Req, p, remote_gid, at + 20),       \
      MELON_CM_PATH(Req, p, flow_label, at + 36, 0, 20), MELON_CM_PATH(Req, p, reserved_rate, at + 38, 4, 6), \
      MELON_CM_PATH(Req, p, packet_rate, at + 39, 2, 6), MELON_CM_PATH(Req, p, traffic_class, at + 40, 0, 8), \
      MELON_CM_PATH(Req, p, hop_limit, at + 41, 0, 8), MELON_CM_PATH(Req, p, sl, at + 42, 0, 4),              \
      MELON_CM_PATH(Req, p, subnet_local, at + 42, 4, 1), MELON_CM_PATH(Req, p, reserved_sl, at + 42, 5, 3),  \
      MELON_CM_PATH(Req, p, local_ack_timeout, at + 43, 0, 5), MELON_CM_PATH(Req, p, reserved_ack, at + 43, 5, 3)

constexpr Row kReq[] = {
    MELON_CM_UINT(Req, local_comm_id, 0, 0, 32),
    MELON_CM_UINT(Req, reserved4, 4, 0, 32),
    MELON_CM_UINT(Req, service_id, 8, 0, 64),
    MELON_CM_UINT(Req, local_ca_guid, 16, 0, 64),
    MELON_CM_UINT(Req, reserved24, 24, 0, 32),
    MELON_CM_UINT(Req, local_qkey, 28, 0, 32),
    MELON_CM_UINT(Req, local_qpn, 32, 0, 24),
    MELON_CM_UINT(Req, responder_resources, 35, 0, 8),
    MELON_CM_UINT(Req, local_eecn, 36, 0, 24),
    MELON_CM_UINT(Req, initiator_depth, 39, 0, 8),
    MELON_CM_UINT(Req, remote_eecn, 40, 0, 24),
    MELON_CM_UINT(Req, remote_cm_response_timeout, 43, 0, 5),
    MELON_CM_UINT(Req, transport_service_type, 43, 5, 2),
    MELON_CM_UINT(Req, end_to_end_flow_control, 43, 7, 1),
    MELON_CM_UINT(Req, starting_psn, 44, 0, 24),
    MELON_CM_UINT(Req, local_cm_response_timeout, 47, 0, 5),
    MELON_CM_UINT(Req, retry_count, 47, 5, 3),
    MELON_CM_UINT(Req, pkey, 48, 0, 16),
    MELON_CM_UINT(Req, path_mtu, 50, 0, 4),
    MELON_CM_UINT(Req, rdc_exists, 50, 4, 1),
    MELON_CM_UINT(Req, rnr_retry_count, 50, 5, 3),
    MELON_CM_UINT(Req, max_cm_retries, 51, 0, 4),
    MELON_CM_UINT(Req, srq, 51, 4, 1),
    MELON_CM_UINT(Req, extended_transport, 51, 5, 3),
    MELON_REQ_PATH(primary, 52),
    MELON_REQ_PATH(alternate, 96),
    MELON_CM_BYTES(Req, private_data, 140),
};

constexpr Row kMra[] = {
    MELON_CM_UINT(Mra, local_comm_id, 0, 0, 32),  MELON_CM_UINT(Mra, remote_comm_id, 4, 0, 32),
    MELON_CM_UINT(Mra, message_mraed, 8, 0, 2),   MELON_CM_UINT(Mra, reserved8, 8, 2, 6),
    MELON_CM_UINT(Mra, service_timeout, 9, 0, 5), MELON_CM_UINT(Mra, reserved9, 9, 5, 3),
    MELON_CM_BYTES(Mra, private_data, 10),
};

constexpr Row kRej[] = {
    MELON_CM_UINT(Rej, local_comm_id, 0, 0, 32),   MELON_CM_UINT(Rej, remote_comm_id, 4, 0, 32),
    MELON_CM_UINT(Rej, message_rejected, 8, 0, 2), MELON_CM_UINT(Rej, reserved8, 8, 2, 6),
    MELON_CM_UINT(Rej, ari_length, 9, 0, 7),       MELON_CM_UINT(Rej, reserved9, 9, 7, 1),
    MELON_CM_UINT(Rej, reason, 10, 0, 16),         MELON_CM_BYTES(Rej, ari, 12),
    MELON_CM_BYTES(Rej, private_data, 84),
};

constexpr Row kRep[] = {
    MELON_CM_UINT(Rep, local_comm_id, 0, 0, 32),     MELON_CM_UINT(Rep, remote_comm_id, 4, 0, 32),
    MELON_CM_UINT(Rep, local_qkey, 8, 0, 32),        MELON_CM_UINT(Rep, local_qpn, 12, 0, 24),
    MELON_CM_UINT(Rep, vendor_id_h, 15, 0, 8),       MELON_CM_UINT(Rep, local_eecn, 16, 0, 24),
    MELON_CM_UINT(Rep, vendor_id_m, 19, 0, 8),       MELON_CM_UINT(Rep, starting_psn, 20, 0, 24),
    MELON_CM_UINT(Rep, vendor_id_l, 23, 0, 8),       MELON_CM_UINT(Rep, responder_resources, 24, 0, 8),
    MELON_CM_UINT(Rep, initiator_depth, 25, 0, 8),   MELON_CM_UINT(Rep, target_ack_delay, 26, 0, 5),
    MELON_CM_UINT(Rep, failover_accepted, 26, 5, 2), MELON_CM_UINT(Rep, end_to_end_flow_control, 26, 7, 1),
    MELON_CM_UINT(Rep, rnr_retry_count, 27, 0, 3),   MELON_CM_UINT(Rep, srq, 27, 3, 1),
    MELON_CM_UINT(Rep, reserved27, 27, 4, 4),        MELON_CM_UINT(Rep, local_ca_guid, 28, 0, 64),
    MELON_CM_BYTES(Rep, private_data, 36),
};

constexpr Row kRtu[] = {
    MELON_CM_UINT(Rtu, local_comm_id, 0, 0, 32),
    MELON_CM_UINT(Rtu, remote_comm_id, 4, 0, 32),
    MELON_CM_BYTES(Rtu, private_data, 8),
};

constexpr Row kDreq[] = {
    MELON_CM_UINT(Dreq, local_comm_id, 0, 0, 32), MELON_CM_UINT(Dreq, remote_comm_id, 4, 0, 32),
    MELON_CM_UINT(Dreq, remote_qpn, 8, 0, 24),    MELON_CM_UINT(Dreq, reserved11, 11, 0, 8),
    MELON_CM_BYTES(Dreq, private_data, 12),
};

constexpr Row kDrep[] = {
    MELON_CM_UINT(Drep, local_comm_id, 0, 0, 32),
    MELON_CM_UINT(Drep, remote_comm_id, 4, 0, 32),
    MELON_CM_BYTES(Drep, private_data, 8),
};

constexpr Row kSidrReq[] = {
    MELON_CM_UINT(SidrReq, request_id, 0, 0, 32), MELON_CM_UINT(SidrReq, pkey, 4, 0, 16),
    MELON_CM_UINT(SidrReq, reserved6, 6, 0, 16),  MELON_CM_UINT(SidrReq, service_id, 8, 0, 64),
    MELON_CM_BYTES(SidrReq, private_data, 16),
};

constexpr Row kSidrRep[] = {
    MELON_CM_UINT(SidrRep, request_id, 0, 0, 32),
    MELON_CM_UINT(SidrRep, status, 4, 0, 8),
    MELON_CM_UINT(SidrRep, add_info_length, 5, 0, 8),
    MELON_CM_UINT(SidrRep, vendor_id_h, 6, 0, 16),
    MELON_CM_UINT(SidrRep, qpn, 8, 0, 24),
    MELON_CM_UINT(SidrRep, vendor_id_l, 11, 0, 8),
    MELON_CM_UINT(SidrRep, service_id, 12, 0, 64),
    MELON_CM_UINT(SidrRep, qkey, 20, 0, 32),
    MELON_CM_BYTES(SidrRep, add_info, 24),
    MELON_CM_BYTES(SidrRep, private_data, 96),
};

struct Table {
  Attr attr;
  const char* name;
  const Row* rows;
  size_t n;
};
#define MELON_CM_TABLE(a, t) \
  Table { Attr::a, #a, t, sizeof(t) / sizeof(t[0]) }
constexpr Table kTables[] = {
    MELON_CM_TABLE(req, kReq),   MELON_CM_TABLE(mra, kMra),          MELON_CM_TABLE(rej, kRej),
    MELON_CM_TABLE(rep, kRep),   MELON_CM_TABLE(rtu, kRtu),          MELON_CM_TABLE(dreq, kDreq),
    MELON_CM_TABLE(drep, kDrep), MELON_CM_TABLE(sidr_req, kSidrReq), MELON_CM_TABLE(sidr_rep, kSidrRep),
};

// Every table covers exactly the 232 bytes of CM data, each bit once (checked at compile time).
constexpr bool covers_cm_data(const Row* rows, size_t n) {
  size_t bits = 0;
  for (size_t i = 0; i < n; ++i) bits += rows[i].info.bits;
  return bits == 8 * (kMadSize - kMadHeaderSize);
}
static_assert(covers_cm_data(kReq, sizeof(kReq) / sizeof(kReq[0])));
static_assert(covers_cm_data(kMra, sizeof(kMra) / sizeof(kMra[0])));
static_assert(covers_cm_data(kRej, sizeof(kRej) / sizeof(kRej[0])));
static_assert(covers_cm_data(kRep, sizeof(kRep) / sizeof(kRep[0])));
static_assert(covers_cm_data(kRtu, sizeof(kRtu) / sizeof(kRtu[0])));
static_assert(covers_cm_data(kDreq, sizeof(kDreq) / sizeof(kDreq[0])));
static_assert(covers_cm_data(kDrep, sizeof(kDrep) / sizeof(kDrep[0])));
static_assert(covers_cm_data(kSidrReq, sizeof(kSidrReq) / sizeof(kSidrReq[0])));
static_assert(covers_cm_data(kSidrRep, sizeof(kSidrRep) / sizeof(kSidrRep[0])));

const Table* table_of(Attr a) {
  for (const Table& t : kTables)
    if (t.attr == a) return &t;
  return nullptr;
}

uint64_t load(const uint8_t* p, uint8_t size) {
  switch (size) {
    case 1: return *p;
    case 2: {
      uint16_t v;
      memcpy(&v, p, 2);
      return v;
    }
    case 4: {
      uint32_t v;
      memcpy(&v, p, 4);
      return v;
    }
    default: {
      uint64_t v;
      memcpy(&v, p, 8);
      return v;
    }
  }
}

void store(uint8_t* p, uint8_t size, uint64_t v) {
  switch (size) {
    case 1: *p = uint8_t(v); break;
    case 2: {
      uint16_t x = uint16_t(v);
      memcpy(p, &x, 2);
      break;
    }
    case 4: {
      uint32_t x = uint32_t(v);
      memcpy(p, &x, 4);
      break;
    }
    default: memcpy(p, &v, 8); break;
  }
}

void read_rows(const uint8_t* mad, const Row* rows, size_t n, uint8_t* base) {
  for (size_t i = 0; i < n; ++i) {
    const Row& r = rows[i];
    if (r.bytes)
      memcpy(base + r.off, mad + r.info.byte, r.info.bits / 8);
    else
      store(base + r.off, r.size, get_bits(mad, r.info.byte, r.info.bit, r.info.bits));
  }
}

void write_rows(uint8_t* mad, const Row* rows, size_t n, const uint8_t* base) {
  for (size_t i = 0; i < n; ++i) {
    const Row& r = rows[i];
    if (r.bytes)
      memcpy(mad + r.info.byte, base + r.off, r.info.bits / 8);
    else
      put_bits(mad, r.info.byte, r.info.bit, r.info.bits, load(base + r.off, r.size));
  }
}

// FieldInfo views of the tables (message_fields), built once from the Row tables.
template <size_t N>
struct Infos {
  FieldInfo v[N];
};
template <size_t N>
constexpr Infos<N> infos_of(const Row (&rows)[N]) {
  Infos<N> out{};
  for (size_t i = 0; i < N; ++i) out.v[i] = rows[i].info;
  return out;
}
constexpr auto kHeaderInfo = infos_of(kHeader);
constexpr auto kReqInfo = infos_of(kReq);
constexpr auto kMraInfo = infos_of(kMra);
constexpr auto kRejInfo = infos_of(kRej);
constexpr auto kRepInfo = infos_of(kRep);
constexpr auto kRtuInfo = infos_of(kRtu);
constexpr auto kDreqInfo = infos_of(kDreq);
constexpr auto kDrepInfo = infos_of(kDrep);
constexpr auto kSidrReqInfo = infos_of(kSidrReq);
constexpr auto kSidrRepInfo = infos_of(kSidrRep);

}  // namespace

const char* decode_status_name(DecodeStatus s) {
  switch (s) {
    case DecodeStatus::ok: return "ok";
    case DecodeStatus::too_short: return "shorter than a MAD";
    case DecodeStatus::bad_base_version: return "MAD base version is not 1";
    case DecodeStatus::not_cm_class: return "not a CM class version 2 MAD";
    case DecodeStatus::unknown_attribute: return "CM attribute without a message table";
  }
  return "?";
}

const char* attr_name(Attr a) {
  const Table* t = table_of(a);
  return t ? t->name : "unknown";
}

DecodeStatus decode(const uint8_t* mad, size_t len, Message* out) {
  if (!mad || len < kMadSize) return DecodeStatus::too_short;
  read_rows(mad, kHeader, sizeof(kHeader) / sizeof(kHeader[0]), reinterpret_cast<uint8_t*>(&out->hdr));
  if (out->hdr.base_version != 1) return DecodeStatus::bad_base_version;
  if (out->hdr.mgmt_class != kMgmtClassCm || out->hdr.class_version != kCmClassVersion)
    return DecodeStatus::not_cm_class;
  const Table* t = table_of(out->attr());
  if (!t) return DecodeStatus::unknown_attribute;
  read_rows(mad, t->rows, t->n, reinterpret_cast<uint8_t*>(&out->req));
  return DecodeStatus::ok;
}

bool encode(const Message& m, uint8_t out[kMadSize]) {
  const Table* t = table_of(m.attr());
  if (!t) return false;
  memset(out, 0, kMadSize);
  write_rows(out, kHeader, sizeof(kHeader) / sizeof(kHeader[0]), reinterpret_cast<const uint8_t*>(&m.hdr));
  write_rows(out, t->rows, t->n, reinterpret_cast<const uint8_t*>(&m.req));
  return true;
}

size_t message_fields(Attr a, const FieldInfo** header, size_t* header_rows, const FieldInfo** rows) {
  *header = kHeaderInfo.v;
  *header_rows = sizeof(kHeader) / sizeof(kHeader[0]);
  switch (a) {
    case Attr::req: *rows = kReqInfo.v; return sizeof(kReq) / sizeof(kReq[0]);
    case Attr::mra: *rows = kMraInfo.v; return sizeof(kMra) / sizeof(kMra[0]);
    case Attr::rej: *rows = kRejInfo.v; return sizeof(kRej) / sizeof(kRej[0]);
    case Attr::rep: *rows = kRepInfo.v; return sizeof(kRep) / sizeof(kRep[0]);
    case Attr::rtu: *rows = kRtuInfo.v; return sizeof(kRtu) / sizeof(kRtu[0]);
    case Attr::dreq: *rows = kDreqInfo.v; return sizeof(kDreq) / sizeof(kDreq[0]);
    case Attr::drep: *rows = kDrepInfo.v; return sizeof(kDrep) / sizeof(kDrep[0]);
    case Attr::sidr_req: *rows = kSidrReqInfo.v; return sizeof(kSidrReq) / sizeof(kSidrReq[0]);
    case Attr::sidr_rep: *rows = kSidrRepInfo.v; return sizeof(kSidrRep) / sizeof(kSidrRep[0]);
    default: *rows = nullptr; return 0;
  }
}

}  // namespace melon::cm
