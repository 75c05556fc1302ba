// Steps that talk to the driver through the user-client ABI itself (src/uapi, the socket client on
// Linux; the same selectors reach the DEXT through IOConnect on macOS): the stable-driver cycles,
// leak accounting, the live quota and refusal checks.
#pragma once

#include <string>

#include "gates.h"
#include "uapi/abi.h"

namespace melon::gate {

// What the device holds now (query_usage through a fresh connection).
bool query_usage(const std::string& sock, uapi::UsageResp* u, std::string* why);
// "" when `now` holds nothing beyond `base` (objects, queue and pinned bytes, DMA buffers, pages).
std::string leaks(const uapi::UsageResp& base, const uapi::UsageResp& now);

std::vector<Step> plan_stable_driver(Ctx& c, const GateSpec& g);
Step step_live_quota();
Step step_live_refusals();
// A step that checks the device holds what it held at `base` (after traffic, a killed client, ...).
Step step_no_leak(const std::string& name, std::shared_ptr<uapi::UsageResp> base);
Step step_take_baseline(std::shared_ptr<uapi::UsageResp> base);

}  // namespace melon::gate
