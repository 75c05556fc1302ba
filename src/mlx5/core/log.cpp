#include "mlx5/core/log.h"

namespace melon::mlx5::core {

const char* component_name(Component c) {
#define MELON_MLX_COMP_NAME(n, s) \
  case Component::n: return s;
  switch (c) { MELON_MLX_COMPONENTS(MELON_MLX_COMP_NAME) }
#undef MELON_MLX_COMP_NAME
  return "Mlx";
}

namespace {

struct Out {
  char* buf;
  size_t n;
  size_t len = 0;
  void put(char c) {
    if (len + 1 < n) buf[len] = c;
    ++len;
  }
};

void put_uint(Out& o, unsigned long long v, unsigned base, bool upper, int width, bool zero) {
  char tmp[24];
  int i = 0;
  const char* digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
  do {
    tmp[i++] = digits[v % base];
    v /= base;
  } while (v);
  for (int pad = width - i; pad > 0; --pad) o.put(zero ? '0' : ' ');
  while (i) o.put(tmp[--i]);
}

}  // namespace

size_t vformat(char* buf, size_t n, const char* f, va_list ap) {
  Out o{buf, n};
  for (; *f; ++f) {
    if (*f != '%') {
      o.put(*f);
      continue;
    }
    ++f;
    bool zero = false;
    int width = 0, longs = 0;
    if (*f == '0') zero = true, ++f;
    while (*f >= '0' && *f <= '9') width = width * 10 + (*f++ - '0');
    while (*f == 'l') ++longs, ++f;
    if (*f == 'z') longs = 2, ++f;
    switch (*f) {
      case 'd': {
        long long v = longs >= 2 ? va_arg(ap, long long) : longs == 1 ? va_arg(ap, long) : va_arg(ap, int);
        if (v < 0) {
          o.put('-');
          put_uint(o, 0ull - (unsigned long long)v, 10, false, width ? width - 1 : 0, zero);
        } else {
          put_uint(o, (unsigned long long)v, 10, false, width, zero);
        }
        break;
      }
      case 'u':
      case 'x':
      case 'X': {
        unsigned long long v = longs >= 2   ? va_arg(ap, unsigned long long)
                               : longs == 1 ? va_arg(ap, unsigned long)
                                            : va_arg(ap, unsigned);
        put_uint(o, v, *f == 'u' ? 10 : 16, *f == 'X', width, zero);
        break;
      }
      case 'p':
        o.put('0'), o.put('x');
        put_uint(o, (unsigned long long)(uintptr_t)va_arg(ap, void*), 16, false, 0, false);
        break;
      case 's': {
        const char* s = va_arg(ap, const char*);
        if (!s) s = "(null)";
        int len = 0;
        while (s[len]) ++len;
        for (int pad = width - len; pad > 0; --pad) o.put(' ');
        while (*s) o.put(*s++);
        break;
      }
      case 'c': o.put(char(va_arg(ap, int))); break;
      case '%': o.put('%'); break;
      default:
        if (!*f) --f;
        break;
    }
  }
  if (n) buf[o.len < n ? o.len : n - 1] = 0;
  return o.len < n ? o.len : (n ? n - 1 : 0);
}

size_t format(char* buf, size_t n, const char* f, ...) {
  va_list ap;
  va_start(ap, f);
  size_t r = vformat(buf, n, f, ap);
  va_end(ap);
  return r;
}

void log_line(Hal& hal, LogLevel level, Component c, const char* f, ...) {
  char line[256];
  size_t p = format(line, sizeof line, "%s: ", component_name(c));
  va_list ap;
  va_start(ap, f);
  vformat(line + p, sizeof line - p, f, ap);
  va_end(ap);
  hal.log(level, line);
}

}  // namespace melon::mlx5::core
