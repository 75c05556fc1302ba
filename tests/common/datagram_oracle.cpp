// The datagram oracle (datagram_oracle.h): IBA 9.2-9.4, 9.7.7, Annex A17; Linux's UDP_SEGMENT rule.
#include "common/datagram_oracle.h"

#include <netinet/in.h>
#include <netinet/udp.h>
#include <errno.h>
#include <string.h>
#include <zlib.h>

#include <algorithm>
#include <fstream>

namespace melon::test {
namespace {

bool sock_addr(const sockaddr* sa, bool* v6, uint8_t out[16], uint16_t* port) {
  if (sa->sa_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(sa);
    memset(out, 0, 16);
    memcpy(out + 12, &a->sin_addr, 4);
    *port = ntohs(a->sin_port);
    *v6 = false;
    return true;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(sa);
    memcpy(out, &a->sin6_addr, 16);
    *port = ntohs(a->sin6_port);
    *v6 = true;
    return true;
  }
  return false;
}

}  // namespace

std::vector<Datagram> kernel_datagrams(int fd, const msghdr& h) {
  std::vector<Datagram> out;
  Datagram d;
  sockaddr_storage self{};
  socklen_t self_len = sizeof self;
  bool v6_self = false;
  if (!h.msg_name || getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len) != 0 ||
      !sock_addr(reinterpret_cast<sockaddr*>(&self), &v6_self, d.src, &d.sport) ||
      !sock_addr(static_cast<const sockaddr*>(h.msg_name), &d.v6, d.dst, &d.dport))
    return out;
  if (v6_self != d.v6) return out;  // a dual-stack socket: not how a RoCE sender sends
#if defined(UDP_SEGMENT)
  for (cmsghdr* c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(const_cast<msghdr*>(&h), c))
    if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_SEGMENT) {
      uint16_t s;
      memcpy(&s, CMSG_DATA(c), sizeof s);
      d.seg = s;
    }
#endif
  std::vector<uint8_t> all;
  for (size_t j = 0; j < h.msg_iovlen; ++j) {
    const auto* p = static_cast<const uint8_t*>(h.msg_iov[j].iov_base);
    all.insert(all.end(), p, p + h.msg_iov[j].iov_len);
  }
  const size_t seg = d.seg && all.size() > d.seg ? d.seg : std::max<size_t>(all.size(), 1);
  uint16_t id = 0;
  for (size_t off = 0; off < all.size(); off += seg, ++id) {
    d.id = id;
    d.bytes.assign(all.begin() + off, all.begin() + off + std::min(seg, all.size() - off));
    out.push_back(d);
  }
  return out;
}

namespace {

// IBA 9.2 opcodes: the extended headers each carries and where in a message it stands.
enum Pos : uint8_t { kFirst, kMiddle, kLast, kOnly, kNoData };
struct Op {
  uint8_t code;
  uint8_t ext;  // bytes of extended headers after the BTH
  Pos pos;
};
constexpr Op kOps[] = {
    // RC (IBA 9.2, table 38); RETH 16, AETH 4, AtomicETH 28, AtomicAckETH 8, ImmDt 4, IETH 4
    {0x00, 0, kFirst},  // SEND_FIRST
    {0x01, 0, kMiddle},  // SEND_MIDDLE
    {0x02, 0, kLast},  // SEND_LAST
    {0x03, 4, kLast},  // SEND_LAST_WITH_IMMEDIATE
    {0x04, 0, kOnly},  // SEND_ONLY
    {0x05, 4, kOnly},  // SEND_ONLY_WITH_IMMEDIATE
    {0x06, 16, kFirst},  // RDMA_WRITE_FIRST
    {0x07, 0, kMiddle},  // RDMA_WRITE_MIDDLE
    {0x08, 0, kLast},  // RDMA_WRITE_LAST
    {0x09, 4, kLast},  // RDMA_WRITE_LAST_WITH_IMMEDIATE
    {0x0a, 16, kOnly},  // RDMA_WRITE_ONLY
    {0x0b, 20, kOnly},  // RDMA_WRITE_ONLY_WITH_IMMEDIATE
    {0x0c, 16, kNoData},  // RDMA_READ_REQUEST
    {0x0d, 4, kFirst},  // RDMA_READ_RESPONSE_FIRST
    {0x0e, 0, kMiddle},  // RDMA_READ_RESPONSE_MIDDLE
    {0x0f, 4, kLast},  // RDMA_READ_RESPONSE_LAST
    {0x10, 4, kOnly},  // RDMA_READ_RESPONSE_ONLY
    {0x11, 4, kNoData},  // ACKNOWLEDGE
    {0x12, 12, kNoData},  // ATOMIC_ACKNOWLEDGE
    {0x13, 28, kNoData},  // CMP_SWAP
    {0x14, 28, kNoData},  // FETCH_ADD
    {0x16, 4, kLast},  // SEND_LAST_WITH_INVALIDATE
    {0x17, 4, kOnly},  // SEND_ONLY_WITH_INVALIDATE
    // UC: the SEND and WRITE opcodes of RC, transport 001
    {0x20, 0, kFirst},  // SEND_FIRST
    {0x21, 0, kMiddle},  // SEND_MIDDLE
    {0x22, 0, kLast},  // SEND_LAST
    {0x23, 4, kLast},  // SEND_LAST_WITH_IMMEDIATE
    {0x24, 0, kOnly},  // SEND_ONLY
    {0x25, 4, kOnly},  // SEND_ONLY_WITH_IMMEDIATE
    {0x26, 16, kFirst},  // RDMA_WRITE_FIRST
    {0x27, 0, kMiddle},  // RDMA_WRITE_MIDDLE
    {0x28, 0, kLast},  // RDMA_WRITE_LAST
    {0x29, 4, kLast},  // RDMA_WRITE_LAST_WITH_IMMEDIATE
    {0x2a, 16, kOnly},  // RDMA_WRITE_ONLY
    {0x2b, 20, kOnly},  // RDMA_WRITE_ONLY_WITH_IMMEDIATE
    // UD: DETH 8
    {0x64, 8, kOnly},  // SEND_ONLY
    {0x65, 12, kOnly},  // SEND_ONLY_WITH_IMMEDIATE
};

void put16(std::vector<uint8_t>& v, uint16_t x) {
  v.push_back(uint8_t(x >> 8));
  v.push_back(uint8_t(x));
}

// The IP and UDP headers the kernel writes for `d` (checksums 0: the pcap reader does not check them).
std::vector<uint8_t> ip_udp_header(const Datagram& d) {
  std::vector<uint8_t> h;
  const uint16_t udp_len = uint16_t(d.bytes.size() + 8);
  if (d.v6) {
    h = {0x60, 0, 0, 0};
    put16(h, udp_len);
    h.push_back(17);
    h.push_back(64);
    h.insert(h.end(), d.src, d.src + 16);
    h.insert(h.end(), d.dst, d.dst + 16);
  } else {
    h = {0x45, 0};
    put16(h, uint16_t(udp_len + 20));
    put16(h, d.id);
    put16(h, 0x4000);  // DF (udp_socket.cpp sets IP_PMTUDISC_DO)
    h.push_back(64);
    h.push_back(17);
    put16(h, 0);
    h.insert(h.end(), d.src + 12, d.src + 16);
    h.insert(h.end(), d.dst + 12, d.dst + 16);
  }
  put16(h, d.sport);
  put16(h, d.dport);
  put16(h, udp_len);
  put16(h, 0);
  return h;
}

}  // namespace

uint32_t datagram_icrc(const Datagram& d) {
  const auto& b = d.bytes;
  if (b.size() < 16) return 0;
  // IBA Annex A17.3.3: masked LRH, IP and UDP headers, BTH with resv8a masked, the rest.
  std::vector<uint8_t> ip = ip_udp_header(d);
  if (d.v6) {
    ip[0] |= 0x0f;
    ip[1] = ip[2] = ip[3] = 0xff;  // traffic class, flow label
    ip[7] = 0xff;  // hop limit
    ip[40 + 6] = ip[40 + 7] = 0xff;  // UDP checksum
  } else {
    ip[1] = 0xff;  // TOS
    ip[8] = 0xff;  // TTL
    ip[10] = ip[11] = 0xff;  // header checksum
    ip[20 + 6] = ip[20 + 7] = 0xff;
  }
  static const uint8_t ones[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  uLong crc = crc32(0, ones, 8);  // zlib's standard CRC-32
  crc = crc32(crc, ip.data(), uInt(ip.size()));
  crc = crc32(crc, b.data(), 4);
  crc = crc32(crc, ones, 1);  // BTH resv8a
  crc = crc32(crc, b.data() + 5, uInt(b.size() - 9));
  return uint32_t(crc);
}

std::string check_datagram(const Datagram& d, uint32_t mtu) {
  const auto& b = d.bytes;
  if (d.dport != 4791) return "destination port " + std::to_string(d.dport);
  if (b.size() < 16) return "shorter than a BTH and an ICRC: " + std::to_string(b.size());
  const Op* op = nullptr;
  for (const Op& o : kOps)
    if (o.code == b[0]) op = &o;
  if (!op) return "opcode " + std::to_string(b[0]) + " none of ours sends";
  const size_t pad = (b[1] >> 4) & 3, hdr = 12 + op->ext;
  if (b.size() < hdr + pad + 4) return "shorter than its headers";
  const size_t payload = b.size() - hdr - pad - 4;
  if ((payload + pad) % 4) return "payload and pad not a multiple of 4";
  const std::string where = " (opcode " + std::to_string(b[0]) + ", " + std::to_string(b.size()) + " bytes)";
  if (op->pos == kNoData && (payload || pad)) return "data where its opcode carries none" + where;
  const bool full = op->pos == kFirst || op->pos == kMiddle;
  if (mtu && full && payload != mtu) return "FIRST/MIDDLE not one MTU" + where;
  if (!mtu && full && (payload < 256 || payload > 4096 || (payload & (payload - 1))))
    return "FIRST/MIDDLE not one of the path MTUs" + where;
  if (payload > (mtu ? mtu : 4096)) return "more than one MTU" + where;
  const uint32_t want = datagram_icrc(d);
  const uint32_t got = uint32_t(b[b.size() - 4]) | uint32_t(b[b.size() - 3]) << 8 | uint32_t(b[b.size() - 2]) << 16 |
                       uint32_t(b[b.size() - 1]) << 24;
  if (want != got) return "ICRC wrong for this datagram (IPv4 id " + std::to_string(d.id) + ")" + where;
  return "";
}

int send_snapshot(SendmmsgFn real, int fd, struct mmsghdr* v, unsigned n, int flags,
                  void (*judge)(int fd, const msghdr& h)) {
  std::vector<std::vector<uint8_t>> bytes(n);
  std::vector<iovec> iov(n);
  std::vector<mmsghdr> copy(v, v + n);
  for (unsigned i = 0; i < n; ++i) {
    const msghdr& h = v[i].msg_hdr;
    for (size_t j = 0; j < h.msg_iovlen; ++j) {
      const auto* p = static_cast<const uint8_t*>(h.msg_iov[j].iov_base);
      bytes[i].insert(bytes[i].end(), p, p + h.msg_iov[j].iov_len);
    }
    iov[i] = {bytes[i].data(), bytes[i].size()};
    copy[i].msg_hdr.msg_iov = &iov[i];
    copy[i].msg_hdr.msg_iovlen = 1;
  }
  const int r = real(fd, copy.data(), n, flags);
  const int e = errno;
  for (int i = 0; i < r; ++i) {
    v[i].msg_len = copy[i].msg_len;
    judge(fd, copy[i].msg_hdr);
  }
  errno = e;
  return r;
}

void write_pcap(const std::string& path, const std::vector<Datagram>& ds) {
  std::ofstream f(path, std::ios::binary);
  const uint32_t gh[6] = {0xa1b2c3d4, 0x00040002, 0, 0, 65535, 1};
  f.write(reinterpret_cast<const char*>(gh), sizeof gh);
  for (const Datagram& d : ds) {
    std::vector<uint8_t> fr = {2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1};
    put16(fr, d.v6 ? 0x86dd : 0x0800);
    std::vector<uint8_t> ip = ip_udp_header(d);
    fr.insert(fr.end(), ip.begin(), ip.end());
    fr.insert(fr.end(), d.bytes.begin(), d.bytes.end());
    const uint32_t rh[4] = {0, 0, uint32_t(fr.size()), uint32_t(fr.size())};
    f.write(reinterpret_cast<const char*>(rh), sizeof rh);
    f.write(reinterpret_cast<const char*>(fr.data()), std::streamsize(fr.size()));
  }
}

}  // namespace melon::test
