// The communication manager's messages (IBA 12.6) in their MAD (IBA 13.4.3), as plain structs.
// Each message's wire layout is a table (messages.cpp): one row per field, its byte, bit and
// width as the IBA tables give them, so encoding, decoding and the tests share one description.
// Freestanding: no allocation, no C++ library.
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace melon::cm {

constexpr size_t kMadSize = 256;  // a GSI MAD is always 256 bytes (IBA 13.4.2)
constexpr size_t kMadHeaderSize = 24;
constexpr uint8_t kMgmtClassCm = 0x07;  // IBA 13.4.4: communication management
constexpr uint8_t kCmClassVersion = 2;
constexpr uint8_t kMethodSend = 0x03;  // every CM message is a Send (IBA 12.6.1)
constexpr uint32_t kGsiQkey = 0x80010000;  // QP1's Q_Key (IBA 13.4.6.1)

// Attribute IDs of the CM class (IBA 16.7.2, Table 259).
enum class Attr : uint16_t {
  class_port_info = 0x0001,
  req = 0x0010,
  mra = 0x0011,
  rej = 0x0012,
  rep = 0x0013,
  rtu = 0x0014,
  dreq = 0x0015,
  drep = 0x0016,
  sidr_req = 0x0017,
  sidr_rep = 0x0018,
  lap = 0x0019,
  apr = 0x001a,
};

struct MadHeader {
  uint8_t base_version = 1;
  uint8_t mgmt_class = kMgmtClassCm;
  uint8_t class_version = kCmClassVersion;
  uint8_t method = kMethodSend;
  uint16_t status = 0;
  uint16_t class_specific = 0;
  uint64_t tid = 0;
  uint16_t attr_id = 0;
  uint16_t reserved = 0;
  uint32_t attr_mod = 0;
};

// One path of a REQ (primary or alternate; Table 106 bytes 52..95 / 96..139).
struct ReqPath {
  uint16_t local_lid = 0, remote_lid = 0;
  uint8_t local_gid[16] = {}, remote_gid[16] = {};
  uint32_t flow_label = 0;
  uint8_t reserved_rate = 0;
  uint8_t packet_rate = 0;
  uint8_t traffic_class = 0, hop_limit = 0;
  uint8_t sl = 0, subnet_local = 0, reserved_sl = 0;
  uint8_t local_ack_timeout = 0, reserved_ack = 0;
};

struct Req {  // Table 106
  uint32_t local_comm_id = 0;
  uint32_t reserved4 = 0;
  uint64_t service_id = 0;
  uint64_t local_ca_guid = 0;
  uint32_t reserved24 = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;
  uint8_t responder_resources = 0;
  uint32_t local_eecn = 0;
  uint8_t initiator_depth = 0;
  uint32_t remote_eecn = 0;
  uint8_t remote_cm_response_timeout = 0, transport_service_type = 0, end_to_end_flow_control = 0;
  uint32_t starting_psn = 0;
  uint8_t local_cm_response_timeout = 0, retry_count = 0;
  uint16_t pkey = 0;
  uint8_t path_mtu = 0, rdc_exists = 0, rnr_retry_count = 0;
  uint8_t max_cm_retries = 0, srq = 0, extended_transport = 0;
  ReqPath primary, alternate;
  uint8_t private_data[92] = {};
};

struct Mra {  // Table 107
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint8_t message_mraed = 0, reserved8 = 0;
  uint8_t service_timeout = 0, reserved9 = 0;
  uint8_t private_data[222] = {};
};

struct Rej {  // Table 108
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint8_t message_rejected = 0, reserved8 = 0;
  uint8_t ari_length = 0, reserved9 = 0;
  uint16_t reason = 0;
  uint8_t ari[72] = {};
  uint8_t private_data[148] = {};
};

struct Rep {  // Table 110
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;
  uint8_t vendor_id_h = 0;
  uint32_t local_eecn = 0;
  uint8_t vendor_id_m = 0;
  uint32_t starting_psn = 0;
  uint8_t vendor_id_l = 0;
  uint8_t responder_resources = 0, initiator_depth = 0;
  uint8_t target_ack_delay = 0, failover_accepted = 0, end_to_end_flow_control = 0;
  uint8_t rnr_retry_count = 0, srq = 0, reserved27 = 0;
  uint64_t local_ca_guid = 0;
  uint8_t private_data[196] = {};
};

struct Rtu {  // Table 111
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint8_t private_data[224] = {};
};

struct Dreq {  // Table 112
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint32_t remote_qpn = 0;
  uint8_t reserved11 = 0;
  uint8_t private_data[220] = {};
};

struct Drep {  // Table 113
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint8_t private_data[224] = {};
};

struct SidrReq {  // Table 119
  uint32_t request_id = 0;
  uint16_t pkey = 0, reserved6 = 0;
  uint64_t service_id = 0;
  uint8_t private_data[216] = {};
};

struct SidrRep {  // Table 120
  uint32_t request_id = 0;
  uint8_t status = 0, add_info_length = 0;
  uint16_t vendor_id_h = 0;
  uint32_t qpn = 0;
  uint8_t vendor_id_l = 0;
  uint64_t service_id = 0;
  uint32_t qkey = 0;
  uint8_t add_info[72] = {};
  uint8_t private_data[136] = {};
};

// A CM MAD: the header and the message its attribute ID names.
struct Message {
  MadHeader hdr;
  union {
    Req req;
    Mra mra;
    Rej rej;
    Rep rep;
    Rtu rtu;
    Dreq dreq;
    Drep drep;
    SidrReq sidr_req;
    SidrRep sidr_rep;
  };
  Message() : req() {}
  Attr attr() const { return Attr(hdr.attr_id); }
};

// Why a datagram is not a CM message we take.
enum class DecodeStatus {
  ok,
  too_short,  // fewer than kMadSize bytes
  bad_base_version,  // not 1
  not_cm_class,  // management class not 0x07, or class version not 2
  unknown_attribute,  // LAP, APR, ClassPortInfo and anything unassigned
};
const char* decode_status_name(DecodeStatus s);

// Parses a 256-byte MAD. On anything but ok, *out is unspecified.
DecodeStatus decode(const uint8_t* mad, size_t len, Message* out);
// Writes the full 256-byte MAD for m (its attribute from m.hdr.attr_id); false for an attribute
// without a table.
bool encode(const Message& m, uint8_t out[kMadSize]);

// One row of a message table, for tests and tools that name fields (tests/cm).
struct FieldInfo {
  const char* name;
  uint16_t byte;  // from the start of the MAD
  uint8_t bit;  // from that byte's most significant bit
  uint16_t bits;
};
// The rows of `attr`'s table (the MAD header's first), or 0 rows for an unknown attribute.
size_t message_fields(Attr attr, const FieldInfo** header, size_t* header_rows, const FieldInfo** rows);
const char* attr_name(Attr attr);

// REJ reasons the CM and rdma_cm use (IBA Table 109).
enum RejReason : uint16_t {
  kRejNoQp = 1,
  kRejNoEec = 2,
  kRejNoResources = 3,
  kRejTimeout = 4,
  kRejUnsupported = 5,
  kRejInvalidCommId = 6,
  kRejInvalidCommInstance = 7,
  kRejInvalidServiceId = 8,
  kRejInvalidTransportType = 9,
  kRejStaleConn = 10,
  kRejConsumer = 28,
  kRejInvalidClassVersion = 31,
};
// Which message a REJ or an MRA answers (IBA Tables 107, 108).
enum MessageRef : uint8_t { kRefReq = 0, kRefRep = 1, kRefOther = 2 };
// SIDR_REP status (IBA Table 121).
enum SidrStatus : uint8_t {
  kSidrOk = 0,
  kSidrUnsupportedService = 1,
  kSidrReject = 2,
  kSidrNoQp = 3,
  kSidrRedirect = 4,
  kSidrClassVersion = 5
};

}  // namespace melon::cm
