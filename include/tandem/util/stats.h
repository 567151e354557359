// tandem/util/stats.h: summary statistics for timings (medians: the machines
// are shared and noisy).
#pragma once

#include <utility>
#include <vector>

namespace tandem {

// The median (the mean of the middle two for an even count); 0 when empty.
double median(std::vector<double> values);

// Least squares of y = slope x + intercept over (x, y) points: {slope,
// intercept}; {0, the mean} where the x do not vary.
std::pair<double, double> fit_line(const std::vector<std::pair<double, double>>& points);

}  // namespace tandem
