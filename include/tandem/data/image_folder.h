// tandem/data/image_folder.h: a folder of class folders of images.
//
// DIR/<class>/**/<image>, indexed exactly as torchvision.datasets.ImageFolder
// indexes it, so that sample i and its label are the same in both: classes are
// the sub-folders of DIR (symbolic links followed) sorted by name, numbered
// from 0; each class's files are found recursively and ordered by (folder
// path, file name); a file counts when its lower-cased name ends in one of
// torchvision's image extensions. tandem decodes JPEG and PNG (by content);
// other formats with those extensions are unreadable images. A class folder
// with no image file, or a DIR with no class folder, is an error.
#pragma once

#include <string>
#include <vector>

#include "tandem/data/image_dataset.h"

namespace tandem::data {

class ImageFolderSource : public ImageSource {
 public:
  // Scans `dir`; throws tandem::Error naming the folder at fault.
  explicit ImageFolderSource(const std::string& dir);

  int64_t size() const override { return static_cast<int64_t>(paths_.size()); }
  int64_t num_classes() const override { return static_cast<int64_t>(classes_.size()); }
  torch::Tensor image(int64_t index) const override;
  torch::Tensor image_box(int64_t index, const BoxChooser& choose) const override;
  int64_t label(int64_t index) const override { return labels_[index]; }
  std::string name(int64_t index) const override { return paths_[index]; }
  std::string describe() const override;

  const std::vector<std::string>& classes() const { return classes_; }
  std::vector<std::string> class_names() const override { return classes_; }
  const std::vector<std::string>& paths() const { return paths_; }

 private:
  std::string dir_;
  std::vector<std::string> classes_;
  std::vector<std::string> paths_;
  std::vector<int32_t> labels_;
};

// The extensions torchvision's ImageFolder accepts, lower case with the dot.
const std::vector<std::string>& image_extensions();

}  // namespace tandem::data
