#include "tandem/data/image_folder.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "tandem/data/image_io.h"
#include "tandem/util/check.h"
#include "tandem/util/table.h"

namespace tandem::data {

namespace fs = std::filesystem;

namespace {

bool has_image_extension(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const auto& ext : image_extensions()) {
    if (lower.size() >= ext.size() && lower.compare(lower.size() - ext.size(), ext.size(), ext) == 0) {
      return true;
    }
  }
  return false;
}

// Entries of one folder, split into sub-folders and files (links followed).
void list(const std::string& dir, std::vector<std::string>* dirs, std::vector<std::string>* files) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  TANDEM_CHECK(!ec, dir, ": cannot list (", ec.message(), ")");
  for (; it != end; it.increment(ec)) {
    TANDEM_CHECK(!ec, dir, ": cannot list (", ec.message(), ")");
    std::error_code type_ec;
    if (it->is_directory(type_ec)) {
      dirs->push_back(it->path().filename().string());
    } else if (files != nullptr) {
      files->push_back(it->path().filename().string());
    }
  }
  TANDEM_CHECK(!ec, dir, ": cannot list (", ec.message(), ")");
}

// Python's sorted(os.walk(root, followlinks=True)), flattened: every file
// under `root` as (folder, name), ordered by folder path then name. A link
// back to a folder the walk is inside (a loop: `ln -s .. cat/up`) is an
// error naming it; os.walk would follow it round until the path grew too
// long, and two such links made the walk take forever (a sweep's find).
void walk(const std::string& root, std::vector<std::pair<std::string, std::string>>* out,
          std::vector<std::pair<dev_t, ino_t>>* inside) {
  struct stat st {};
  TANDEM_CHECK(::stat(root.c_str(), &st) == 0, root, ": cannot read (", std::strerror(errno), ")");
  const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
  TANDEM_CHECK(std::find(inside->begin(), inside->end(), id) == inside->end(), root,
               ": a link back to a folder that contains it (a loop); class folders must not loop");
  inside->push_back(id);
  std::vector<std::string> dirs, files;
  list(root, &dirs, &files);
  std::sort(dirs.begin(), dirs.end());  // the same folder named at fault whatever the listing order
  for (auto& f : files) out->emplace_back(root, std::move(f));
  for (const auto& d : dirs) walk(root + "/" + d, out, inside);
  inside->pop_back();
}

}  // namespace

const std::vector<std::string>& image_extensions() {
  static const std::vector<std::string> kExtensions = {
      ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};
  return kExtensions;
}

ImageFolderSource::ImageFolderSource(const std::string& dir) : dir_(dir) {
  check_data_folder("imagefolder", dir);
  list(dir, &classes_, nullptr);
  std::sort(classes_.begin(), classes_.end());
  TANDEM_CHECK(!classes_.empty(), "imagefolder:", dir,
               ": no class folders (expected DIR/<class>/<image>)");
  std::vector<std::string> empty;
  for (size_t c = 0; c < classes_.size(); ++c) {
    std::vector<std::pair<std::string, std::string>> files;
    std::vector<std::pair<dev_t, ino_t>> inside;
    struct stat top {};
    if (::stat(dir.c_str(), &top) == 0) inside.emplace_back(top.st_dev, top.st_ino);  // DIR itself
    walk(dir + "/" + classes_[c], &files, &inside);
    std::sort(files.begin(), files.end());
    size_t before = paths_.size();
    for (const auto& [folder, name] : files) {
      if (!has_image_extension(name)) continue;
      paths_.push_back(folder + "/" + name);
      labels_.push_back(static_cast<int32_t>(c));
    }
    if (paths_.size() == before) empty.push_back(dir + "/" + classes_[c]);
  }
  if (!empty.empty()) {
    std::string list_text;
    for (size_t i = 0; i < empty.size() && i < 5; ++i) list_text += (i ? ", " : "") + empty[i];
    if (empty.size() > 5) list_text += format(" and %zu more", empty.size() - 5);
    std::string exts;
    for (const auto& e : image_extensions()) exts += (exts.empty() ? "" : " ") + e;
    TANDEM_FAIL("imagefolder:", dir, ": no image files in class folder ", list_text,
                " (expected files ending in ", exts, ")");
  }
}

torch::Tensor ImageFolderSource::image(int64_t index) const { return read_image(paths_[index]); }

torch::Tensor ImageFolderSource::image_box(int64_t index, const BoxChooser& choose) const {
  auto bytes = read_file_bytes(paths_[index]);
  return decode_image_box(bytes.data(), bytes.size(), paths_[index], choose);
}

std::string ImageFolderSource::describe() const {
  return format("imagefolder:%s (%zu images, %zu classes)", dir_.c_str(), paths_.size(),
                classes_.size());
}

}  // namespace tandem::data
