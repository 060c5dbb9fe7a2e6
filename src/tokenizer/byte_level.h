// deepinfer/tokenizer/byte_level.h — GPT-2's byte ↔ printable-character map
// (Hugging Face's ByteLevel pre-tokenizer and decoder, `bytes_to_unicode`).
// Bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF map to the code point of the same
// value; the other 68 bytes map, in increasing order, to U+0100, U+0101, ...
// U+0143. BPE vocabulary strings in tokenizer.json are written in this alphabet.
#pragma once

#include <array>
#include <cstdint>

namespace deepinfer::byte_level {

struct Tables {
  std::array<char32_t, 256> byte_to_cp{};
  std::array<int16_t, 0x144> cp_to_byte{};  // -1 where the code point is not in the alphabet
  constexpr Tables() {
    for (auto& v : cp_to_byte) v = -1;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      byte_to_cp[b] = cp;
      cp_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

inline constexpr Tables kTables{};

// The byte a code point of the alphabet stands for, or -1.
inline int CpToByte(char32_t cp) { return cp < 0x144 ? kTables.cp_to_byte[cp] : -1; }
inline char32_t ByteToCp(uint8_t b) { return kTables.byte_to_cp[b]; }

}  // namespace deepinfer::byte_level
