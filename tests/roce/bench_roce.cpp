// Benchmark: the RoCEv2 wire format's per-byte cost, against memcpy measured in the same process.
//   - CRC-32 throughput: the fast CRC (ISA-L / ARMv8 / table, whichever crc32_update uses), the
//     plain table CRC, and memcpy, over packet-sized and large buffers;
//   - building a whole RC packet (IP/UDP + BTH [+ RETH] + payload copy + ICRC) at MTU 1024 and 4096;
//   - receiving one: parse IP/UDP + transport and check the ICRC.
// Prints Google Benchmark's table, then a summary of GB/s and ratios to memcpy.
//
// Rerun (release build):
//   cmake --preset release -B build/release && cmake --build build/release --target bench_roce
//   build/release/tests/roce/bench_roce --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <stdio.h>
#include <string.h>

#include <map>
#include <string>
#include <vector>

#include "roce/crc32.h"
#include "roce/icrc.h"
#include "roce/icrc_udp.h"
#include "roce/ip_udp.h"
#include "roce/packet.h"

using namespace melon::roce;

namespace {

constexpr const char* kRerun =
    "cmake --preset release -B build/release && cmake --build build/release --target bench_roce && "
    "build/release/tests/roce/bench_roce --benchmark_repetitions=5 --benchmark_report_aggregates_only=true";

std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(i * 131 + 7);
  return v;
}

void BM_memcpy(benchmark::State& st) {
  size_t n = size_t(st.range(0));
  auto src = pattern(n);
  std::vector<uint8_t> dst(n);
  for (auto _ : st) {
    memcpy(dst.data(), src.data(), n);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(n));
}

void BM_crc_fast(benchmark::State& st) {
  size_t n = size_t(st.range(0));
  auto src = pattern(n);
  uint32_t c = 0;
  for (auto _ : st) {
    c = crc32_update(c, src.data(), n);
    benchmark::DoNotOptimize(c);
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(n));
  st.SetLabel(crc32_backend());
}

void BM_crc_table(benchmark::State& st) {
  size_t n = size_t(st.range(0));
  auto src = pattern(n);
  uint32_t c = 0;
  for (auto _ : st) {
    c = crc32_table_update(c, src.data(), n);
    benchmark::DoNotOptimize(c);
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(n));
}

// One RC packet of `payload` bytes: SEND_MIDDLE (BTH only) or RDMA_WRITE_FIRST (BTH + RETH).
struct Frame {
  IpUdp ip;
  Packet pkt;
  std::vector<uint8_t> payload;
  size_t roce_len = 0;
  Frame(size_t payload_len, uint8_t opcode) : payload(pattern(payload_len)) {
    gid_from_ipv4(ip.src, 0x0a4d0003);
    gid_from_ipv4(ip.dst, 0x0a4d0002);
    pkt.bth.opcode = opcode;
    pkt.bth.dest_qp = 0x11;
    pkt.bth.psn = 0xfffff0;
    pkt.reth = {0x5643b1108000, 0x6c7, 3u << 20};
    pkt.payload = payload.data();
    pkt.payload_len = uint32_t(payload_len);
    roce_len = op_info(opcode).hdr_len + payload_len + pad_for(uint32_t(payload_len)) + kIcrcSize;
  }
  // What a send path does per packet; returns the frame length (IP header .. ICRC).
  size_t build(uint8_t* out) {
    size_t n = write_ip_udp(ip, roce_len, out);
    n += write_transport_headers(pkt, out + n);
    memcpy(out + n, pkt.payload, pkt.payload_len);
    n += pkt.payload_len;
    uint8_t pad = pad_for(pkt.payload_len);
    memset(out + n, 0, pad);
    n += pad;
    store_icrc(out + n, icrc_of_frame(out, n));
    return n + kIcrcSize;
  }
};

void BM_build(benchmark::State& st, uint8_t opcode) {
  size_t mtu = size_t(st.range(0));
  Frame f(mtu, opcode);
  std::vector<uint8_t> out(kIpv6HeaderSize + kUdpHeaderSize + f.roce_len);
  size_t len = 0;
  for (auto _ : st) {
    f.pkt.bth.psn = (f.pkt.bth.psn + 1) & 0xffffff;
    len = f.build(out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(int64_t(st.iterations()));
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(mtu));  // payload bytes
  st.counters["frame_bytes"] = double(len);
}

void BM_parse_verify(benchmark::State& st) {
  size_t mtu = size_t(st.range(0));
  Frame f(mtu, make_opcode(Transport::rc, kSendMiddle));
  std::vector<uint8_t> frame(kIpv6HeaderSize + kUdpHeaderSize + f.roce_len);
  frame.resize(f.build(frame.data()));
  for (auto _ : st) {
    IpUdp iu;
    Packet p;
    bool ok = parse_ip_udp(frame.data(), frame.size(), iu) == ParseError::ok &&
              parse_transport(frame.data() + iu.hdr_len, iu.udp_len - kUdpHeaderSize, p) == ParseError::ok &&
              icrc_frame_ok(frame.data(), frame.size());
    if (!ok) st.SkipWithError("frame does not verify");
    benchmark::DoNotOptimize(p.payload);
  }
  st.SetItemsProcessed(int64_t(st.iterations()));
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(mtu));
}

// The fixed per-packet cost of the ICRC: an ACK frame (IP/UDP + BTH + AETH, no payload), where
// the LRH stand-in is a precomputed CRC state and the CRC runs twice: masked IP/UDP + BTH in one
// call, the AETH in another (src/roce/icrc.cpp).
void BM_icrc_ack(benchmark::State& st) {
  Frame f(0, make_opcode(Transport::rc, kAcknowledge));
  std::vector<uint8_t> frame(kIpv6HeaderSize + kUdpHeaderSize + f.roce_len);
  frame.resize(f.build(frame.data()));
  uint32_t c = 0;
  for (auto _ : st) {
    c ^= icrc_of_frame(frame.data(), frame.size() - kIcrcSize);
    benchmark::DoNotOptimize(c);
  }
  st.SetItemsProcessed(int64_t(st.iterations()));
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(frame.size() - kIcrcSize));
}

// The receive side's per-packet check through a UDP socket (roce/icrc_udp.h): the ICRC with the
// IPv4 identification solved for, on the message-rate benchmark's packet (an 8-byte RDMA WRITE
// ONLY: BTH + RETH + 8 bytes + ICRC = 40 bytes).
void BM_icrc_check_udp(benchmark::State& st) {
  IpUdp h;
  gid_from_ipv4(h.src, 0x7f000003);
  gid_from_ipv4(h.dst, 0x7f000002);
  h.sport = h.dport = kRoceV2Port;
  std::vector<uint8_t> roce = pattern(40);
  h.udp_len = uint16_t(roce.size() + kUdpHeaderSize);
  h.hdr_len = uint8_t(kIpv4HeaderSize + kUdpHeaderSize);
  h.ip_id = 37;  // the 38th segment of a GSO send
  store_icrc(roce.data() + roce.size() - kIcrcSize, icrc_for_udp_payload(h, roce.data(), roce.size() - kIcrcSize));
  h.ip_id = 0;
  for (auto _ : st) {
    uint16_t id = 0;
    if (!icrc_check_udp_payload(h, roce.data(), roce.size(), &id) || id != 37) st.SkipWithError("does not verify");
    benchmark::DoNotOptimize(id);
  }
  st.SetItemsProcessed(int64_t(st.iterations()));
}

// The same packet when the receiver guesses its identification right (its index in a GRO buffer,
// for a GSO send of ours): one CRC, no solving.
void BM_icrc_check_udp_guessed(benchmark::State& st) {
  IpUdp h;
  gid_from_ipv4(h.src, 0x7f000003);
  gid_from_ipv4(h.dst, 0x7f000002);
  h.sport = h.dport = kRoceV2Port;
  std::vector<uint8_t> roce = pattern(40);
  h.udp_len = uint16_t(roce.size() + kUdpHeaderSize);
  h.hdr_len = uint8_t(kIpv4HeaderSize + kUdpHeaderSize);
  h.ip_id = 37;
  store_icrc(roce.data() + roce.size() - kIcrcSize, icrc_for_udp_payload(h, roce.data(), roce.size() - kIcrcSize));
  h.ip_id = 0;
  for (auto _ : st) {
    uint16_t id = 0;
    if (!icrc_check_udp_payload(h, roce.data(), roce.size(), &id, 37) || id != 37) st.SkipWithError("does not verify");
    benchmark::DoNotOptimize(id);
  }
  st.SetItemsProcessed(int64_t(st.iterations()));
}

// An ACK-sized buffer, the two MTUs' payloads, and a large one for the peak.
const int64_t kSizes[] = {64, 1024, 4096, 65536};

// Keeps each run's rates so main() can print ratios after the ordinary table.
class Recorder : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, std::pair<double, double>> rate;  // name -> (bytes/s, items/s)
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      // With --benchmark_repetitions the median stands for the benchmark; otherwise the one run.
      bool median = r.run_type == Run::RT_Aggregate && r.aggregate_name == "median";
      if (r.error_occurred || !(r.run_type == Run::RT_Iteration || median)) continue;
      auto get = [&](const char* k) {
        auto it = r.counters.find(k);
        return it == r.counters.end() ? 0.0 : double(it->second);
      };
      rate[r.run_name.str()] = {get("bytes_per_second"), get("items_per_second")};
    }
  }
};

double gbps(const Recorder& r, const std::string& name) {
  auto it = r.rate.find(name);
  return it == r.rate.end() ? 0 : it->second.first / 1e9;
}
double mpps(const Recorder& r, const std::string& name) {
  auto it = r.rate.find(name);
  return it == r.rate.end() ? 0 : it->second.second / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  for (int64_t n : kSizes) {
    benchmark::RegisterBenchmark("memcpy", BM_memcpy)->Arg(n);
    benchmark::RegisterBenchmark("crc_fast", BM_crc_fast)->Arg(n);
    benchmark::RegisterBenchmark("crc_table", BM_crc_table)->Arg(n);
  }
  benchmark::RegisterBenchmark("icrc_ack_frame", BM_icrc_ack);
  benchmark::RegisterBenchmark("icrc_check_udp_write8", BM_icrc_check_udp);
  benchmark::RegisterBenchmark("icrc_check_udp_write8_guessed", BM_icrc_check_udp_guessed);
  for (int64_t mtu : {1024, 4096}) {
    benchmark::RegisterBenchmark("build_send_middle", BM_build, make_opcode(Transport::rc, kSendMiddle))->Arg(mtu);
    benchmark::RegisterBenchmark("build_write_first", BM_build, make_opcode(Transport::rc, kWriteFirst))->Arg(mtu);
    benchmark::RegisterBenchmark("parse_verify", BM_parse_verify)->Arg(mtu);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  Recorder rec;
  benchmark::RunSpecifiedBenchmarks(&rec);
  benchmark::Shutdown();

  printf("\nCRC-32 backend: %s\n", crc32_backend());
  printf("\n%-8s %10s %10s %10s %12s %12s\n", "bytes", "memcpy", "crc_fast", "crc_table", "fast/memcpy",
         "table/memcpy");
  for (int64_t n : kSizes) {
    std::string s = "/" + std::to_string(n);
    double m = gbps(rec, "memcpy" + s), f = gbps(rec, "crc_fast" + s), t = gbps(rec, "crc_table" + s);
    if (m == 0) continue;
    printf("%-8lld %7.2f GB/s %7.2f GB/s %7.2f GB/s %12.3f %12.3f\n", (long long)n, m, f, t, f / m, t / m);
  }
  if (double r = mpps(rec, "icrc_ack_frame"); r > 0)
    printf("\nICRC of one ACK frame (44 bytes, 2 CRC calls): %.1f ns, %.2f GB/s\n", 1e3 / r,
           gbps(rec, "icrc_ack_frame"));
  if (double r = mpps(rec, "icrc_check_udp_write8"); r > 0)
    printf("ICRC check through a UDP socket, IPv4 identification solved (40-byte WRITE): %.1f ns\n", 1e3 / r);
  printf("\n%-22s %6s %10s %12s %16s %12s\n", "packet (payload = MTU)", "MTU", "Mpkt/s", "payload GB/s",
         "memcpy payload", "ratio");
  for (int64_t mtu : {1024, 4096}) {
    std::string s = "/" + std::to_string(mtu);
    double m = gbps(rec, "memcpy" + s);  // copying the payload alone
    for (const char* b : {"build_send_middle", "build_write_first", "parse_verify"}) {
      double g = gbps(rec, b + s);
      if (g == 0 || m == 0) continue;
      printf("%-22s %6lld %10.3f %12.2f %11.2f GB/s %12.3f\n", b, (long long)mtu, mpps(rec, b + s), g, m, g / m);
    }
  }
  printf("\nrerun: %s\n", kRerun);
  return 0;
}
