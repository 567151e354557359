// What the process-group tests share: ranks as threads of the test.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "tandem/dist/collectives.h"
#include "tandem/dist/process_group.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::dist {
namespace {  // each test file its own copy

using namespace std::chrono_literals;

// fn(group) on `world` ranks (threads): testing::run_ranks with a reference.
inline std::vector<std::string> run_ranks(int world, const std::function<void(ProcessGroup&)>& fn,
                                          GroupOptions options = {}, int port = 0) {
  return testing::run_ranks(world, [&](std::shared_ptr<ProcessGroup> g) { fn(*g); }, options, port);
}

using testing::expect_no_errors;

}  // namespace
}  // namespace tandem::dist
