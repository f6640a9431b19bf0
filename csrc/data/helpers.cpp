// Index builders for the GPT dataset, bound as megatron.data._helpers.
//
// These are the two sequential loops of Megatron's data pipeline: walking shuffled documents to
// find where each fixed-length sample starts, and the greedy blending of several datasets. Both
// have reference implementations in megatron/data/index_math.py that must stay bit-identical
// (tests/unit/test_data_index_math.py compares them over random configurations).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

// Row s of the result is (position in doc_idx, token offset in that document) of the first
// token of sample s; row num_samples closes the last sample. A sample takes seq_length + 1
// tokens and the next one starts on its last token (inputs and labels overlap by one).
// Row 0 is (0, 0) even when doc_idx[0] is an empty document: that is Megatron's layout.
template <typename Index>
py::array_t<Index> build_sample_idx(
    py::array_t<int32_t, py::array::c_style | py::array::forcecast> sizes,
    py::array_t<Index, py::array::c_style> doc_idx, int64_t seq_length, int64_t num_samples) {
  if (seq_length <= 0 || num_samples < 0) {
    throw std::invalid_argument("seq_length must be positive and num_samples non-negative");
  }
  const int32_t* size = sizes.data();
  const Index* docs = doc_idx.data();
  const int64_t num_sizes = sizes.size();
  const int64_t num_docs = doc_idx.size();
  py::array_t<Index> result({num_samples + 1, static_cast<int64_t>(2)});
  Index* out = result.mutable_data();
  {
    // The loop touches no Python object; other threads (a prefetching loader) may run.
    py::gil_scoped_release release;
    int64_t doc_pos = 0;
    int64_t offset = 0;
    out[0] = 0;
    out[1] = 0;
    for (int64_t s = 1; s <= num_samples; ++s) {
      int64_t remaining = seq_length + 1;
      while (remaining != 0) {
        if (doc_pos >= num_docs) {
          throw std::out_of_range("the documents hold fewer tokens than num_samples needs");
        }
        const int64_t doc = static_cast<int64_t>(docs[doc_pos]);
        if (doc < 0 || doc >= num_sizes) {
          throw std::out_of_range("doc_idx entry " + std::to_string(doc) +
                                  " is not a sequence of the dataset");
        }
        const int64_t doc_length = static_cast<int64_t>(size[doc]) - offset;
        remaining -= doc_length;
        if (remaining <= 0) {
          // The sample ends inside this document, on the token the next sample starts with.
          offset += remaining + doc_length - 1;
          remaining = 0;
        } else {
          ++doc_pos;
          offset = 0;
        }
      }
      out[2 * s] = static_cast<Index>(doc_pos);
      out[2 * s + 1] = static_cast<Index>(offset);
    }
  }
  return result;
}

// Sample s of the blend comes from the dataset that is furthest behind its share:
// argmax_d(weights[d] * max(s, 1) - taken[d]), the lowest d on ties. It returns, per sample,
// the dataset and the index of the sample within that dataset.
py::tuple build_blending_indices(py::array_t<double, py::array::c_style | py::array::forcecast> weights,
                                 int64_t size) {
  const int64_t n = weights.size();
  if (n <= 0 || n > 32767 || size < 0) {
    throw std::invalid_argument("need 1..32767 datasets and a non-negative size");
  }
  const double* w = weights.data();
  py::array_t<int16_t> dataset_index(size);
  py::array_t<int64_t> dataset_sample_index(size);
  int16_t* which = dataset_index.mutable_data();
  int64_t* within = dataset_sample_index.mutable_data();
  {
    py::gil_scoped_release release;
    std::vector<int64_t> taken(n, 0);
    for (int64_t s = 0; s < size; ++s) {
      const double scale = std::max(static_cast<double>(s), 1.0);
      int64_t best = 0;
      double best_error = 0.0;
      for (int64_t d = 0; d < n; ++d) {
        // Stored through a volatile so the compiler cannot fuse the multiply and the subtraction
        // into one FMA (it may on targets that have one): the Python reference rounds twice.
        volatile double product = w[d] * scale;
        const double error = product - static_cast<double>(taken[d]);
        if (d == 0 || error > best_error) {
          best = d;
          best_error = error;
        }
      }
      which[s] = static_cast<int16_t>(best);
      within[s] = taken[best];
      ++taken[best];
    }
  }
  return py::make_tuple(dataset_index, dataset_sample_index);
}

}  // namespace

PYBIND11_MODULE(_helpers, m) {
  m.doc() = "GPT dataset index builders (see megatron/data/index_math.py for the references)";
  m.def("build_sample_idx_int32", &build_sample_idx<int32_t>, py::arg("sizes"),
        py::arg("doc_idx"), py::arg("seq_length"), py::arg("num_samples"));
  m.def("build_sample_idx_int64", &build_sample_idx<int64_t>, py::arg("sizes"),
        py::arg("doc_idx"), py::arg("seq_length"), py::arg("num_samples"));
  m.def("build_blending_indices", &build_blending_indices, py::arg("weights"), py::arg("size"));
}
