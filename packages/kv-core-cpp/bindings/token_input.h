// Token ingestion (docs/key-format.md): buffers are viewed in place, lists and tuples of
// exact ints take a fast path, anything else is iterated. Errors mirror kv_api.keys (their
// texts are in arguments.h).
#pragma once

#include <nanobind/nanobind.h>

#include "kvcore/tokens.h"

namespace kvcore::py {

namespace nb = nanobind;

// A buffer export, released on every path (a member, so a throwing constructor releases it too).
class BufferExport {
 public:
  BufferExport() = default;
  ~BufferExport() {
    if (held) PyBuffer_Release(&view);
  }
  BufferExport(const BufferExport&) = delete;
  BufferExport& operator=(const BufferExport&) = delete;

  Py_buffer view{};
  bool held = false;
};

// Owns the buffer export behind a view; destroy it with the GIL held.
class TokenInput {
 public:
  TokenInput(nb::handle tokens, KeyFormat format);
  TokenInput(const TokenInput&) = delete;
  TokenInput& operator=(const TokenInput&) = delete;

  const Tokens& tokens() const noexcept { return tokens_; }
  // An exact list or tuple of plain ints, read without running Python code: its items, as they
  // are until Python code next runs, are the ids.
  bool plain_sequence() const noexcept { return plain_sequence_; }

 private:
  void view_buffer(nb::handle obj, KeyFormat format);
  void pack_sequence(nb::handle seq, KeyFormat format);
  void pack_iterable(nb::handle obj, KeyFormat format);
  void push(std::size_t position, nb::handle item, KeyFormat format);
  void store_id(std::size_t position, std::uint64_t id, KeyFormat format);

  BufferExport export_;  // declared first: released after tokens_, which may point into it
  Tokens tokens_;
  bool plain_sequence_ = false;
};

}  // namespace kvcore::py
