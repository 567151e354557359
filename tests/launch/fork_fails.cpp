// A preload library for LaunchTest.AForkFailureEndsTheStartedWorkers: the
// process's Nth call of fork() (N from TANDEM_TEST_FAIL_FORK) fails with
// EAGAIN, as it does when the system is out of processes; every other call
// is the C library's own. Each process counts its own calls.
#include <dlfcn.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

extern "C" pid_t fork() {
  static int calls = 0;
  using Fork = pid_t (*)();
  static Fork real_fork = reinterpret_cast<Fork>(dlsym(RTLD_NEXT, "fork"));
  const char* fail_at = std::getenv("TANDEM_TEST_FAIL_FORK");
  if (fail_at != nullptr && ++calls == std::atoi(fail_at)) {
    errno = EAGAIN;
    return -1;
  }
  return real_fork();
}
