// Stand-in: the receive side of Apple's <mach/message.h> the IOKit transport uses to take
// notification messages off its port, with Apple's values. Only the stand-in build sees this file
// (see sys/event.h here). The fake's ports hold the messages AsyncCompletion sends.
#pragma once

#include <stdint.h>

typedef uint32_t mach_port_t;
typedef uint32_t mach_port_name_t;
typedef int mach_msg_return_t;
typedef unsigned int mach_msg_bits_t;
typedef unsigned int mach_msg_size_t;
typedef int mach_msg_option_t;
typedef unsigned int mach_msg_timeout_t;
typedef int mach_msg_id_t;

typedef struct {
  mach_msg_bits_t msgh_bits;
  mach_msg_size_t msgh_size;
  mach_port_t msgh_remote_port;
  mach_port_t msgh_local_port;
  mach_port_name_t msgh_voucher_port;
  mach_msg_id_t msgh_id;
} mach_msg_header_t;

#define MACH_MSG_SUCCESS 0x00000000
#define MACH_RCV_MSG 0x00000002
#define MACH_RCV_TIMEOUT 0x00000100
#define MACH_RCV_TIMED_OUT 0x10004003
#define MACH_RCV_TOO_LARGE 0x10004004
#define MACH_RCV_INVALID_NAME 0x10004002
#define MACH_MSG_TIMEOUT_NONE ((mach_msg_timeout_t)0)

#ifdef __cplusplus
extern "C" {
#endif
mach_msg_return_t mach_msg(mach_msg_header_t* msg, mach_msg_option_t option, mach_msg_size_t send_size,
                           mach_msg_size_t rcv_size, mach_port_name_t rcv_name, mach_msg_timeout_t timeout,
                           mach_port_name_t notify);
#ifdef __cplusplus
}
#endif
