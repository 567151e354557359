// JPEG and PNG decoding: against PIL's pixels, and the error for every kind
// of bad file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include <ATen/CPUGeneratorImpl.h>

#include "tandem/data/image_io.h"
#include "tandem/data/transform.h"
#include "testing.h"

namespace tandem::data {
namespace {

using testing::TempDir;

// PIL's RGB pixels from image_reference.py: "H W\n" then H*W*3 bytes.
torch::Tensor read_reference(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  int64_t h = 0, w = 0;
  in >> h >> w;
  in.get();
  auto hwc = torch::empty({h, w, 3}, torch::kUInt8);
  in.read(reinterpret_cast<char*>(hwc.data_ptr<uint8_t>()), h * w * 3);
  EXPECT_TRUE(in) << path;
  return hwc.permute({2, 0, 1});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string expect_image_error(const std::string& path) {
  try {
    read_image(path);
  } catch (const ImageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ImageError for " << path;
  return "";
}

TEST(ImageIoTest, DecodesLikePil) {
  TempDir dir;
  auto result = testing::run(std::string(TANDEM_PYTHON) + " " TANDEM_SOURCE_DIR
                             "/tests/data/image_reference.py " + dir.path());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    auto path = entry.path().string();
    if (entry.path().extension() == ".rgb") continue;
    SCOPED_TRACE(path);
    auto ours = read_image(path);
    auto pil = read_reference(path + ".rgb");
    ASSERT_EQ(ours.sizes(), pil.sizes());
    if (path.find("cmyk") != std::string::npos) {
      // PIL rounds its CMYK conversion in its own way; within 1.
      EXPECT_LE((ours.to(torch::kInt32) - pil.to(torch::kInt32)).abs().max().item<int>(), 1);
    } else {
      EXPECT_TRUE(torch::equal(ours, pil))
          << "max difference "
          << (ours.to(torch::kInt32) - pil.to(torch::kInt32)).abs().max().item<int>();
    }
    ++checked;
  }
  EXPECT_EQ(checked, 19);
}

// Note [decoding only the crop]: a box decoded alone equals the same box of
// the whole image, for every chroma layout, progressive and grey JPEGs, at
// the edges and in the middle.
TEST(ImageIoTest, DecodedBoxEqualsBoxOfWholeImage) {
  TempDir dir;
  auto result = testing::run(std::string(TANDEM_PYTHON) + " " TANDEM_SOURCE_DIR
                             "/tests/data/image_reference.py " + dir.path());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(11);
  auto draw = [&](int64_t n) { return torch::randint(0, n, {1}, generator).item<int64_t>(); };
  int checked = 0;
  for (const char* name : {"big_420.jpg", "big_422.jpg", "big_444.jpg", "big_progressive.jpg",
                           "big_gray.jpg", "pil_rgb.jpg", "pil_rgba.png"}) {
    SCOPED_TRACE(name);
    auto bytes = read_file_bytes(dir.file(name));
    auto whole = decode_image(bytes.data(), bytes.size(), name);
    int64_t h = whole.size(1), w = whole.size(2);
    for (int trial = 0; trial < 150; ++trial) {
      CropBox box;
      box.top = trial == 0 ? 0 : draw(h);
      box.left = trial == 0 ? 0 : draw(w);
      box.height = trial == 0 ? h : 1 + draw(h - box.top);
      box.width = trial == 0 ? w : 1 + draw(w - box.left);
      auto part = decode_image_box(bytes.data(), bytes.size(), name, [&](int64_t hh, int64_t ww) {
        EXPECT_EQ(hh, h);
        EXPECT_EQ(ww, w);
        return box;
      });
      auto expected = whole.slice(1, box.top, box.top + box.height)
                          .slice(2, box.left, box.left + box.width);
      ASSERT_TRUE(torch::equal(part, expected))
          << "box top " << box.top << " left " << box.left << " " << box.height << " x "
          << box.width;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 7 * 150);
}

TEST(ImageIoTest, DecodedBoxStillFindsTruncation) {
  TempDir dir;
  auto image = torch::randint(0, 256, {3, 96, 96}, torch::kInt64).to(torch::kUInt8);
  write_jpeg(dir.file("full.jpg"), image);
  auto bytes = testing::read_text(dir.file("full.jpg"));
  std::string cut = bytes.substr(0, bytes.size() * 3 / 4);
  auto first_rows = [](int64_t, int64_t w) { return CropBox{0, 0, 8, w}; };
  try {
    decode_image_box(reinterpret_cast<const uint8_t*>(cut.data()), cut.size(), "cut.jpg",
                     first_rows);
    ADD_FAILURE() << "a truncated JPEG decoded";
  } catch (const ImageError& e) {
    EXPECT_NE(std::string(e.what()).find("cut.jpg: not a readable JPEG"), std::string::npos)
        << e.what();
  }
  auto outside = [](int64_t h, int64_t w) { return CropBox{h - 4, 0, 8, w}; };
  EXPECT_THROW(decode_image_box(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                "full.jpg", outside),
               Error);
}

// Note [truncation without the tail]: the box decoder stops after the box
// and finds truncation from the end-of-image marker instead, for every
// JPEG layout (baseline 4:2:0, 4:2:2, 4:4:4, grey, and progressive, whose
// scans libjpeg reads whole at the start).
TEST(ImageIoTest, BoxDecodeFindsTruncationWithoutDecodingTheTail) {
  TempDir dir;
  auto result = testing::run(std::string(TANDEM_PYTHON) + " " TANDEM_SOURCE_DIR
                             "/tests/data/image_reference.py " + dir.path());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  auto first_rows = [](int64_t, int64_t w) { return CropBox{0, 0, 8, w}; };
  auto decode_box = [&](const std::string& bytes, const std::string& name) {
    return decode_image_box(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), name,
                            first_rows);
  };
  for (const char* name : {"big_420.jpg", "big_422.jpg", "big_444.jpg", "big_progressive.jpg",
                           "big_gray.jpg"}) {
    SCOPED_TRACE(name);
    auto whole = testing::read_text(dir.file(name));
    ASSERT_EQ(whole.substr(whole.size() - 2), "\xFF\xD9");
    auto reference = decode_box(whole, name);
    // Bytes after the end marker (camera trailers, appended images) are fine.
    EXPECT_TRUE(torch::equal(decode_box(whole + "trailing bytes", name), reference));
    EXPECT_TRUE(torch::equal(decode_box(whole + "\xFF\xD8\xFF\xD9", name), reference));
    // Cut anywhere after the first rows' data, down to the marker itself.
    for (size_t keep : {whole.size() - 1, whole.size() - 2, whole.size() * 9 / 10, whole.size() / 2}) {
      SCOPED_TRACE(keep);
      try {
        decode_box(whole.substr(0, keep), "cut.jpg");
        ADD_FAILURE() << "a JPEG cut to " << keep << " of " << whole.size() << " bytes decoded";
      } catch (const ImageError& e) {
        EXPECT_NE(std::string(e.what()).find("cut.jpg: not a readable JPEG"), std::string::npos)
            << e.what();
        EXPECT_NE(std::string(e.what()).find("Premature end of JPEG file"), std::string::npos)
            << e.what();
      }
    }
  }
}

TEST(ImageIoTest, PngRoundTripIsExact) {
  TempDir dir;
  auto rgb = torch::randint(0, 256, {3, 19, 23}, torch::kInt64).to(torch::kUInt8);
  write_png(dir.file("rgb.png"), rgb);
  EXPECT_TRUE(torch::equal(read_image(dir.file("rgb.png")), rgb));
  auto gray = torch::randint(0, 256, {1, 7, 5}, torch::kInt64).to(torch::kUInt8);
  write_png(dir.file("gray.png"), gray);
  EXPECT_TRUE(torch::equal(read_image(dir.file("gray.png")), gray.expand({3, 7, 5})));
}

TEST(ImageIoTest, JpegRoundTripIsClose) {
  TempDir dir;
  auto yy = torch::arange(40).view({1, 40, 1}).expand({3, 40, 48});
  auto xx = torch::arange(48).view({1, 1, 48}).expand({3, 40, 48});
  auto image = (yy * 3 + xx * 2).to(torch::kUInt8);
  write_jpeg(dir.file("smooth.jpg"), image, 100);
  auto back = read_image(dir.file("smooth.jpg"));
  ASSERT_EQ(back.sizes(), image.sizes());
  EXPECT_LE((back.to(torch::kInt32) - image.to(torch::kInt32)).abs().max().item<int>(), 3);
}

TEST(ImageIoTest, FormatComesFromContentNotName) {
  TempDir dir;
  auto rgb = torch::full({3, 4, 4}, 77, torch::kUInt8);
  write_png(dir.file("really_png.jpg"), rgb);
  EXPECT_TRUE(torch::equal(read_image(dir.file("really_png.jpg")), rgb));
}

TEST(ImageIoTest, TruncatedJpegIsAnError) {
  TempDir dir;
  auto image = torch::randint(0, 256, {3, 64, 64}, torch::kInt64).to(torch::kUInt8);
  write_jpeg(dir.file("full.jpg"), image);
  auto bytes = testing::read_text(dir.file("full.jpg"));
  write_bytes(dir.file("cut.jpg"), bytes.substr(0, bytes.size() / 2));
  auto message = expect_image_error(dir.file("cut.jpg"));
  EXPECT_NE(message.find(dir.file("cut.jpg")), std::string::npos) << message;
  EXPECT_NE(message.find("not a readable JPEG"), std::string::npos) << message;
  EXPECT_NE(message.find("Premature end"), std::string::npos) << message;
  // Cut inside the header.
  write_bytes(dir.file("header.jpg"), bytes.substr(0, 40));
  EXPECT_NE(expect_image_error(dir.file("header.jpg")).find("not a readable JPEG"),
            std::string::npos);
}

TEST(ImageIoTest, TruncatedPngIsAnError) {
  TempDir dir;
  auto image = torch::randint(0, 256, {3, 64, 64}, torch::kInt64).to(torch::kUInt8);
  write_png(dir.file("full.png"), image);
  auto bytes = testing::read_text(dir.file("full.png"));
  write_bytes(dir.file("cut.png"), bytes.substr(0, bytes.size() / 2));
  auto message = expect_image_error(dir.file("cut.png"));
  EXPECT_NE(message.find(dir.file("cut.png")), std::string::npos) << message;
  EXPECT_NE(message.find("not a readable PNG"), std::string::npos) << message;
}

TEST(ImageIoTest, CorruptPngIsAnError) {
  TempDir dir;
  auto image = torch::randint(0, 256, {3, 16, 16}, torch::kInt64).to(torch::kUInt8);
  write_png(dir.file("ok.png"), image);
  auto bytes = testing::read_text(dir.file("ok.png"));
  for (size_t i = 60; i < bytes.size() - 20; ++i) bytes[i] = static_cast<char>(bytes[i] ^ 0x5a);
  write_bytes(dir.file("bad.png"), bytes);
  EXPECT_NE(expect_image_error(dir.file("bad.png")).find("not a readable PNG"), std::string::npos);
}

// Note [decompression bombs], found by fuzz/fuzz_image: a small file that
// declares 60000 x 60000 pixels is refused before anything is allocated,
// whole or cropped, JPEG or PNG.
TEST(ImageIoTest, DecompressionBombsAreRefused) {
  TempDir dir;
  auto image = torch::full({3, 16, 16}, 100, torch::kUInt8);
  write_jpeg(dir.file("a.jpg"), image);
  write_png(dir.file("a.png"), image);
  auto jpeg = read_file_bytes(dir.file("a.jpg"));
  auto png = read_file_bytes(dir.file("a.png"));
  auto put16 = [](std::vector<uint8_t>& b, size_t at, int v) {
    b[at] = static_cast<uint8_t>(v >> 8);
    b[at + 1] = static_cast<uint8_t>(v & 0xff);
  };
  bool patched = false;
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {  // SOF0: FF C0, length, precision, height, width
    if (jpeg[i] == 0xff && jpeg[i + 1] == 0xc0) {
      put16(jpeg, i + 5, 60000);
      put16(jpeg, i + 7, 60000);
      patched = true;
      break;
    }
  }
  ASSERT_TRUE(patched);
  put16(png, 18, 60000);  // IHDR width and height, big-endian 32-bit
  put16(png, 22, 60000);
  // A real bomb's IHDR has a valid CRC (over the chunk type and data).
  uint32_t crc = static_cast<uint32_t>(crc32(0L, png.data() + 12, 17));
  for (int i = 0; i < 4; ++i) png[29 + i] = static_cast<uint8_t>(crc >> (24 - 8 * i));
  const std::string want = "declares 60000 x 60000 pixels, over the limit of 178956970";
  auto whole = [](const std::vector<uint8_t>& b) {
    return testing::error_of([&] { decode_image(b.data(), b.size(), "bomb"); });
  };
  auto cropped = [](const std::vector<uint8_t>& b) {
    return testing::error_of([&] {
      decode_image_box(b.data(), b.size(), "bomb", [](int64_t, int64_t) { return CropBox{0, 0, 8, 8}; });
    });
  };
  EXPECT_NE(whole(jpeg).find("bomb: " + want), std::string::npos) << whole(jpeg);
  EXPECT_NE(cropped(jpeg).find("bomb: " + want), std::string::npos) << cropped(jpeg);
  EXPECT_NE(whole(png).find("bomb: " + want), std::string::npos) << whole(png);
}

TEST(ImageIoTest, NotAnImageIsAnError) {
  TempDir dir;
  write_bytes(dir.file("notes.jpg"), "these are not pixels");
  auto message = expect_image_error(dir.file("notes.jpg"));
  EXPECT_NE(message.find(dir.file("notes.jpg") + ": not a JPEG or PNG image"), std::string::npos)
      << message;
  write_bytes(dir.file("empty.png"), "");
  EXPECT_NE(expect_image_error(dir.file("empty.png")).find("empty file"), std::string::npos);
  EXPECT_NE(expect_image_error(dir.file("missing.png")).find("missing.png: no such file"), std::string::npos);
  // Not a regular file: a folder, and a FIFO, which is never opened for
  // reading (that would wait for a writer).
  std::filesystem::create_directory(dir.file("folder.png"));
  EXPECT_NE(expect_image_error(dir.file("folder.png")).find("folder.png: is a folder; expected an image file"),
            std::string::npos);
  ASSERT_EQ(::mkfifo(dir.file("fifo.jpg").c_str(), 0666), 0);
  EXPECT_NE(expect_image_error(dir.file("fifo.jpg")).find("fifo.jpg: is a FIFO; expected an image file"),
            std::string::npos);
}

TEST(ImageIoTest, EncoderRejectsBadTensors) {
  TempDir dir;
  EXPECT_THROW(write_png(dir.file("x.png"), torch::zeros({3, 4, 4})), Error);          // float
  EXPECT_THROW(write_jpeg(dir.file("x.jpg"), torch::zeros({2, 4, 4}, torch::kUInt8)), Error);
  EXPECT_THROW(write_jpeg(dir.file("x.jpg"), torch::zeros({3, 4, 4}, torch::kUInt8), 0), Error);
}

}  // namespace
}  // namespace tandem::data
