// Minimal reader for classic pcap files (the captures are Ethernet, microsecond timestamps).
// Independent of the code under test; used to feed real rxe packets to it.
#pragma once
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace melon::test {

struct PcapPacket {
  uint64_t ts_us = 0;
  std::vector<uint8_t> data;  // starting at the Ethernet header
  size_t index = 0;  // 1-based frame number, as tshark counts
};

inline std::vector<PcapPacket> read_pcap(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  std::vector<uint8_t> all(f ? size_t(f.tellg()) : 0);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(all.data()), std::streamsize(all.size()));
  std::vector<PcapPacket> out;
  if (all.size() < 24) return out;
  uint32_t magic;
  std::memcpy(&magic, all.data(), 4);
  bool swap = magic == 0xd4c3b2a1;
  auto u32 = [&](size_t off) {
    uint32_t v;
    std::memcpy(&v, all.data() + off, 4);
    return swap ? __builtin_bswap32(v) : v;
  };
  size_t off = 24;
  while (off + 16 <= all.size()) {
    uint32_t sec = u32(off), usec = u32(off + 4), incl = u32(off + 8);
    off += 16;
    if (off + incl > all.size()) break;
    PcapPacket p;
    p.ts_us = uint64_t(sec) * 1000000 + usec;
    p.data.assign(all.begin() + off, all.begin() + off + incl);
    p.index = out.size() + 1;
    out.push_back(std::move(p));
    off += incl;
  }
  return out;
}

// The IP packet inside an Ethernet frame carrying UDP port 4791, or nullptr.
inline const uint8_t* roce_ip(const PcapPacket& p, size_t* ip_len) {
  const auto& d = p.data;
  if (d.size() < 14 + 28) return nullptr;
  uint16_t et = uint16_t(d[12] << 8 | d[13]);
  size_t ip = 14;
  const uint8_t* h = d.data() + ip;
  size_t udp;
  if (et == 0x0800 && h[9] == 17)
    udp = ip + (h[0] & 0xf) * 4;
  else if (et == 0x86dd && h[6] == 17)
    udp = ip + 40;
  else
    return nullptr;
  if (udp + 8 > d.size()) return nullptr;
  if (uint16_t(d[udp + 2] << 8 | d[udp + 3]) != 4791) return nullptr;
  *ip_len = d.size() - ip;
  return h;
}

inline std::vector<std::string> capture_files() {
  return {"rxe-rc-send.pcap",          "rxe-rc-send-only.pcap",      "rxe-rc-write.pcap",    "rxe-rc-read.pcap",
          "rxe-rc-atomic.pcap",        "rxe-rc-atomic-cmpswap.pcap", "rxe-ud-send.pcap",     "rxe-rdmacm-rping.pcap",
          "rxe-rc-write-loss.pcap",    "rxe-rc-read-loss.pcap",      "rxe-rc-rnr.pcap",      "rxe-rc-send-mtu4096.pcap",
          "rxe-rc-write-mtu4096.pcap", "rxe-rc-write-imm.pcap",      "rxe-rc-send-imm.pcap", "rxe-uc-send.pcap"};
}

inline std::string capture_path(const std::string& name) { return std::string(MELON_TEST_DATA) + "/captures/" + name; }

}  // namespace melon::test
