#pragma once
#include <cstdint>

namespace thrust {
template <typename Iterator, typename Function>
struct transform_iterator {
  Iterator base;
  Function function;
  auto operator[](int64_t i) const { return function(base[i]); }
};
template <typename Iterator, typename Function>
transform_iterator<Iterator, Function> make_transform_iterator(Iterator base, Function function) {
  return {base, function};
}
}  // namespace thrust
