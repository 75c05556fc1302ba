/* The C library's <string.h> as a freestanding target has it: the declarations the compiler
 * expands inline or calls. check_barriers.py cross-compiles for aarch64 without a sysroot; this is
 * the only libc header the freestanding core and the provider's doorbell paths include. */
#pragma once
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
void* memcpy(void*, const void*, size_t);
void* memmove(void*, const void*, size_t);
void* memset(void*, int, size_t);
int memcmp(const void*, const void*, size_t);
size_t strlen(const char*);
#ifdef __cplusplus
}
#endif
