// tandem/version.h: the library's version, the one place it is written.
// CMakeLists.txt reads it for project(VERSION) and hence for the installed
// package's version file (find_package(tandem 0.1)); `tandem version`
// prints it.
#pragma once

#define TANDEM_VERSION_MAJOR 0
#define TANDEM_VERSION_MINOR 1
#define TANDEM_VERSION_PATCH 0
#define TANDEM_VERSION "0.1.0"
