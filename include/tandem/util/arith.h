// tandem/util/arith.h: integer arithmetic that does not overflow where the
// textbook form does.
#pragma once

#include <cstdint>

namespace tandem {

// ceil(a / b) for a >= 0, b > 0. Unlike (a + b - 1) / b it holds for any b,
// up to INT64_MAX (a --batch-size of 9e18 used to wrap round to 0 batches).
constexpr int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

}  // namespace tandem
