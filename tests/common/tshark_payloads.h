// Wireshark's payload heuristics (RPC-over-RDMA, iSER, SMB Direct, ...) claim some made-up or
// random payloads and then call them malformed; tests that want RoCE checked, not the data, switch
// these protocols off (tshark --disable-protocol).
#pragma once
#include <iterator>
#include <string>

namespace melon::test {

inline const char* const kTsharkPayloadProtocols[] = {"smc",  "smb_direct",      "rpcordma",       "nvme-rdma", "lnet",
                                                      "iser", "infiniband.eoib", "infiniband_sdp", "fcoib",     "drbd"};

// " --disable-protocol P" for each of them.
inline std::string tshark_plain_payloads() {
  std::string s;
  for (const char* p : kTsharkPayloadProtocols) s += std::string(" --disable-protocol ") + p;
  return s;
}

}  // namespace melon::test
