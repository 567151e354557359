// tandem/util/stats.h: summary statistics for timings (medians: the machines
// are shared and noisy).
#pragma once

#include <vector>

namespace tandem {

// The median (the mean of the middle two for an even count); 0 when empty.
double median(std::vector<double> values);

}  // namespace tandem
