// Stand-in: os_log, as the DEXT uses it. Lines go to the fake's log buffer (tests read them) and,
// with MELON_DK_LOG set, to stderr. Privacy qualifiers ("%{public}s") are accepted and dropped.
#pragma once

#include <stdint.h>

typedef struct os_log_s* os_log_t;
typedef uint8_t os_log_type_t;
#define OS_LOG_TYPE_DEFAULT ((os_log_type_t)0x00)
#define OS_LOG_TYPE_INFO ((os_log_type_t)0x01)
#define OS_LOG_TYPE_DEBUG ((os_log_type_t)0x02)
#define OS_LOG_TYPE_ERROR ((os_log_type_t)0x10)
#define OS_LOG_TYPE_FAULT ((os_log_type_t)0x11)
#define OS_LOG_DEFAULT ((os_log_t)0)

extern "C" void melon_standin_os_log(os_log_t log, os_log_type_t type, const char* fmt, ...);
#define os_log_with_type(log, type, ...) melon_standin_os_log((log), (type), __VA_ARGS__)
#define os_log(log, ...) os_log_with_type((log), OS_LOG_TYPE_DEFAULT, __VA_ARGS__)
#define os_log_info(log, ...) os_log_with_type((log), OS_LOG_TYPE_INFO, __VA_ARGS__)
#define os_log_debug(log, ...) os_log_with_type((log), OS_LOG_TYPE_DEBUG, __VA_ARGS__)
#define os_log_error(log, ...) os_log_with_type((log), OS_LOG_TYPE_ERROR, __VA_ARGS__)
